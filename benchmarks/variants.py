"""Time variants of one chapter against cuBLAS in one process, with the runner's own steps
(spec -> compile -> verify -> time, src/job/pipeline.py) and protocol (bench/default.yaml): a quick way to
compare tile shapes or tensor-map settings on the GPU box before writing the winner into a
config. Every variant is verified first; one that fails prints its error and is not timed.

  python benchmarks/variants.py 20_wgmma_tf32 --sizes 4096,8192 \\
      --vary bm=128,256 --vary stages=3,4 --vary map.a.element=f32,tf32

`--vary key=v1,v2` crosses values: `key` is a parameter (kernel.params.<key>) or
`map.<matrix>.<field>` for a launch.tensor_maps entry. A tuned chapter starts from the detected
GPU's tuned values for each size (conf/tuned/), as in a run. `--shape m,n,k[,alpha,beta]` adds a
verified-only problem (repeatable). Prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from src.job import gpu as gpu_mod  # noqa: E402
from src.errors import LabError  # noqa: E402
from src.job.pipeline import _verify_and_time, baseline_gflops, new_record  # noqa: E402
from src.job.problem import Problem  # noqa: E402
from src.job.spec import build_spec  # noqa: E402
from src.tune.tuned import apply as apply_tuned  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf"


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def variant_cfg(base: dict, choice: dict) -> dict:
    cfg = copy.deepcopy(base)
    for key, value in choice.items():
        if key.startswith("map."):
            _, matrix, field = key.split(".")
            entry = next(tm for tm in cfg["launch"]["tensor_maps"] if tm["matrix"] == matrix)
            entry[field] = value
        else:
            cfg["params"][key] = value
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel")
    parser.add_argument("--sizes", default="4096", help="timed sizes: 4096 or MxNxK, comma-separated")
    parser.add_argument("--vary", action="append", default=[])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--bench", default="default")
    parser.add_argument("--tuned-for", default="auto",
                        help="GPU spec whose tuned values apply (default: the detected GPU's)")
    args = parser.parse_args()

    # The kernel and protocol as the runner composes them (bench files may extend `default`).
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", [f"kernel={args.kernel}", f"bench={args.bench}"])
    base = OmegaConf.to_container(cfg.kernel, resolve=True)
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    device = gpu_mod.detect()
    limits = gpu_mod.device_limits(device)
    gpu_spec = (args.tuned_for if args.tuned_for != "auto"
                else gpu_mod.resolve_spec({"name": "auto"}, device).name)
    print(f"device: {device.name} (cc {device.compute_capability}, driver {device.driver})")

    axes = [(k, [_value(v) for v in vs.split(",")])
            for k, vs in (item.split("=", 1) for item in args.vary)]
    choices = [dict(zip([k for k, _ in axes], combo))
               for combo in itertools.product(*[vs for _, vs in axes])] or [{}]
    problems = [Problem(*(3 * [int(s)] if "x" not in s else map(int, s.split("x"))), 1.0, 0.0)
                for s in args.sizes.split(",")]
    checks = []
    for shape in args.shape:
        v = [float(x) for x in shape.split(",")]
        checks.append(Problem(int(v[0]), int(v[1]), int(v[2]), v[3] if len(v) > 3 else 1.0,
                              v[4] if len(v) > 4 else 0.0))

    rows = []
    for choice in choices:
        label = " ".join(f"{k}={v}" for k, v in choice.items()) or "configured"
        for problem, timed in [(p, False) for p in checks] + [(p, True) for p in problems]:
            # as in a run: the GPU's tuned values for this size first, the varied keys over them
            cfg = copy.deepcopy(base)
            apply_tuned(cfg, gpu_spec, problem, {k for k in choice if not k.startswith("map.")})
            cfg = variant_cfg(cfg, choice)
            record = new_record(cfg["name"], cfg["precision"], cfg["backend"], vars(problem))
            try:
                spec = build_spec(cfg, problem, limits)
                if timed:
                    gflops = _verify_and_time(spec, problem, bench, device, record)
                else:
                    from src.job.compile import compile_kernel
                    from src.job.problem import make_inputs
                    from src.job.verify import verify

                    kernel = compile_kernel(spec)
                    record.registers = kernel.report.registers
                    record.local_bytes = kernel.report.local_bytes
                    inputs = make_inputs(problem, None)
                    record.rel_err = verify(kernel, problem, inputs,
                                            float(bench["tolerance"][spec.precision]), spec.name).rel_err
                    gflops = None
            except LabError as exc:
                rows.append((label, problem.label, "FAILED", str(exc).splitlines()[0][:160]))
                print(rows[-1], flush=True)
                continue
            ref = None
            if timed:
                ref = baseline_gflops("cublas_tf32" if cfg["precision"] == "tf32" else "cublas_fp32",
                                      problem, bench, device)
            pct = f"{100 * gflops / ref:.1f}%" if (gflops and ref) else ""
            rows.append((label, problem.label, "ok",
                         (f"{gflops:,.0f} GFLOP/s {pct} of cuBLAS ({ref:,.0f})  " if gflops else "verified  ")
                         + f"rel_err {record.rel_err:.2e}  regs {record.registers}  local {record.local_bytes} B"))
            print(rows[-1], flush=True)

    print(f"\n{args.kernel} on {device.name}")
    for label, shape, status, text in rows:
        print(f"{label:<40} {shape:<18} {status:<7} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
