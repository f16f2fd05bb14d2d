"""Launch kernels a few times each on random inputs, for a profiler to attach to (ncu / nsys).

    ncu --section SpeedOfLight ... python benchmarks/profile_kernels.py 17_flagship cublas_fp32 [--size 4096] [name:param=value,...]

Each argument is a kernel config name, optionally with parameter overrides after a colon
(`17_flagship:bk=16,stages=4`); tuned values for the detected GPU apply first, as in a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omegaconf import OmegaConf  # noqa: E402

from src.job import gpu  # noqa: E402
from src.job.compile import compile_kernel  # noqa: E402
from src.job.problem import Problem, make_inputs  # noqa: E402
from src.job.spec import build_spec  # noqa: E402
from src.tune.tuned import apply as apply_tuned  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"

ap = argparse.ArgumentParser()
ap.add_argument("kernels", nargs="+")
ap.add_argument("--size", type=int, default=4096)
ap.add_argument("--launches", type=int, default=3)
ap.add_argument("--tuned-for", default="auto", help="GPU spec whose tuned values apply")
args = ap.parse_args()
device = gpu.detect()
spec_name = (args.tuned_for if args.tuned_for != "auto"
             else gpu.resolve_spec({"name": "auto"}, device).name)
problem = Problem(args.size, args.size, args.size, 1.0, 0.0)
inputs = make_inputs(problem)
for item in args.kernels:
    name, _, overrides = item.partition(":")
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    apply_tuned(cfg, spec_name, problem)
    for pair in filter(None, overrides.split(",")):
        key, value = pair.split("=")
        cfg["params"][key] = int(value)
    kernel = compile_kernel(build_spec(cfg, problem, gpu.device_limits(device)))
    for _ in range(args.launches):
        kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
    import cupy as cp

    cp.cuda.runtime.deviceSynchronize()
    print(f"{item}: {getattr(kernel.spec, 'entry', None) or name} launched {args.launches}x", flush=True)
