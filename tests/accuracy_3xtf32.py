"""Chapter 23's normwise error next to cuBLAS FP32's and TF32's on the same inputs, for the GPU
tests (tests/test_gpu.py). It was benchmarks/accuracy_3xtf32.py, whose K = 1024 ... 16384 tables
kernels/README.md quotes; that command line is retired (`git log --diff-filter=D -- benchmarks/`)."""

from __future__ import annotations

from src.job.compile import compile_kernel
from src.job.config import kernel_config
from src.job.prepare import Target, prepare_kernel, target
from src.job.problem import Inputs, Problem
from src.job.verify import reference

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

