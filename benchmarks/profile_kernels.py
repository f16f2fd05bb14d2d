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

from src.job.compile import compile_kernel  # noqa: E402
from src.job.config import kernel_config  # noqa: E402
from src.job.gpu import known_specs  # noqa: E402
from src.job.prepare import prepare_kernel, target  # noqa: E402
from src.job.problem import Problem, make_inputs  # noqa: E402


def overrides_of(text: str) -> dict:
    """`bk=16,stages=4` as parameters."""
    pairs = (pair.split("=", 1) for pair in filter(None, text.split(",")))
    return {key: int(value) for key, value in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="+", help="NAME or NAME:param=value,...")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--tuned-for", default="auto", help="GPU spec whose tuned values apply")
    args = parser.parse_args()
    # a named spec is taken as given on this device: its tuned values, this device's limits
    where = target(known_specs()[args.tuned_for] if args.tuned_for != "auto" else {"name": "auto"})
    problem = Problem(args.size, args.size, args.size, 1.0, 0.0)
    inputs = make_inputs(problem)
    import cupy as cp

    for item in args.kernels:
        name, _, overrides = item.partition(":")
        prepared = prepare_kernel(kernel_config(name), problem, where,
                                  overrides=overrides_of(overrides) or None)
        prepared.require_device()
        kernel = compile_kernel(prepared.spec)
        for _ in range(args.launches):
            kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
        cp.cuda.runtime.deviceSynchronize()
        print(f"{item}: {prepared.spec.entry or name} launched {args.launches}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
