"""Chapter 23's error next to cuBLAS FP32's (and TF32's) on the SAME inputs, against the runner's
FP64 reference (src.job.verify.reference): the K sweep of its error analysis, and inputs of a chosen
distribution (uniform, a wide dynamic range, tiny A). Compiled and launched through the runner's
own steps (prepare_kernel -> compile_kernel -> launch, pre-pass included). Needs a GPU.

  python benchmarks/accuracy_3xtf32.py --mn 2048 --ks 1024,2048,4096,8192,16384 \\
      --variant configured --variant accumulation=1 --variant order=2 --inputs uniform,tiny_a
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from src.job.compile import compile_kernel  # noqa: E402
from src.job.config import kernel_config  # noqa: E402
from src.job.prepare import Target, prepare_kernel, target  # noqa: E402
from src.job.problem import Inputs, Problem  # noqa: E402
from src.job.verify import reference  # noqa: E402

CHAPTER = "23_wgmma_3xtf32"
BASELINES = ("cublas_fp32", "cublas_tf32")


def make_operands(problem: Problem, kind: str, seed: int) -> Inputs:
    """A and B of one distribution (C0 uniform, as the runner makes it when beta != 0).
    uniform: U(-1, 1), the runner's own inputs. wide: sign * 2^U(-20, 20), values over 12 decades.
    tiny_a: A = U(-1, 1) * 2^-120 and B = U(-1, 1) * 2^100: A is normal FP32 but its TF32 small
    part (2^-11 .. 2^-22 of it) is below FP32's normal range and flushed, so 3xTF32 keeps only
    TF32's precision of A, while the product (about 2^-20) is an ordinary FP32 number."""
    import cupy as cp

    rng = cp.random.default_rng(seed)

    def uniform(shape):
        return rng.uniform(-1.0, 1.0, shape, dtype=cp.float32)

    a, b = uniform((problem.m, problem.k)), uniform((problem.k, problem.n))
    if kind == "wide":
        a = (cp.sign(a) * cp.exp2(rng.uniform(-20, 20, a.shape))).astype(cp.float32)
        b = (cp.sign(b) * cp.exp2(rng.uniform(-20, 20, b.shape))).astype(cp.float32)
    elif kind == "tiny_a":
        a = (a.astype(cp.float64) * 2.0 ** -120).astype(cp.float32)
        b = (b.astype(cp.float64) * 2.0 ** 100).astype(cp.float32)
    elif kind != "uniform":
        raise ValueError(f"unknown input kind {kind!r}: uniform, wide or tiny_a")
    if problem.beta == 0.0:
        c0 = cp.full((problem.m, problem.n), cp.nan, dtype=cp.float32)
    else:
        c0 = uniform((problem.m, problem.n))
    return Inputs(a=a, b=b, c=c0.copy(), c0=c0, seed=seed)


def _kernel(name: str, params: dict, problem: Problem, where: Target):
    prepared = prepare_kernel(kernel_config(name), problem, where, overrides=params or None)
    prepared.require_device()
    return compile_kernel(prepared.spec)


def rel_errors(problem: Problem, kind: str = "uniform", seed: int = 0,
               variants: dict[str, dict] | None = None) -> dict[str, float]:
    """Normwise relative error against the FP64 reference of chapter 23 (each variant: label ->
    parameters) and of cuBLAS FP32 and TF32, all on one set of inputs."""
    import cupy as cp

    where = target({"name": "auto"})
    inputs = make_operands(problem, kind, seed)
    ref = reference(problem, inputs)
    ref_norm = cp.linalg.norm(ref)
    kernels = {label: _kernel(CHAPTER, params, problem, where)
               for label, params in (variants or {"configured": {}}).items()}
    kernels.update({name: _kernel(name, {}, problem, where) for name in BASELINES})
    errors = {}
    for label, kernel in kernels.items():
        inputs.c[...] = inputs.c0
        kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
        cp.cuda.runtime.deviceSynchronize()
        errors[label] = float(cp.linalg.norm(inputs.c.astype(cp.float64) - ref) / ref_norm)
    return errors


def _variant(text: str) -> tuple[str, dict]:
    if text == "configured":
        return text, {}
    params = dict(item.split("=", 1) for item in text.split(","))
    return text, {key: int(value) for key, value in params.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mn", type=int, default=2048, help="M = N of every problem")
    parser.add_argument("--ks", default="1024,2048,4096,8192,16384")
    parser.add_argument("--inputs", default="uniform", help="comma-separated: uniform, wide, tiny_a")
    parser.add_argument("--variant", action="append", default=[],
                        help="chapter 23 parameters, e.g. accumulation=1 or order=2,promote=1")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    variants = dict(_variant(v) for v in (args.variant or ["configured"]))
    labels = [*variants, *BASELINES]
    rows = []
    for kind in args.inputs.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            problem = Problem(args.mn, args.mn, k, 1.0, 0.0)
            errors = rel_errors(problem, kind, args.seed, variants)
            rows.append((kind, k, errors))
            print(kind, k, {key: f"{value:.2e}" for key, value in errors.items()}, flush=True)
    print(f"\nrel_err vs FP64, M = N = {args.mn}, same inputs per row; ratio = 23 ({labels[0]}) / "
          f"cuBLAS FP32")
    print(f"{'inputs':<8} {'K':>6} " + " ".join(f"{label[:22]:>22}" for label in labels)
          + f" {'ratio':>6}")
    for kind, k, errors in rows:
        ratio = errors[labels[0]] / errors["cublas_fp32"] if errors["cublas_fp32"] else float("inf")
        print(f"{kind:<8} {k:>6} " + " ".join(f"{errors[label]:>22.2e}" for label in labels)
              + f" {ratio:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
