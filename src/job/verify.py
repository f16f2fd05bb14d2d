"""Verify step: run the kernel once on fresh inputs and compare every element with an FP64 reference.

The reference is computed on the GPU: A and B are widened to float64 and multiplied by cuBLAS
DGEMM (cupy.matmul), then alpha * AB + beta * C0 is formed in float64. The error is normwise,
||C - C_ref||_F / ||C_ref||_F, accumulated in float64. NaN (the poison left in an element the
kernel never wrote) or Inf anywhere fails the check whatever the norm says.
"""

from __future__ import annotations

from dataclasses import dataclass

from src.errors import LaunchFailed, VerificationFailed
from src.job.problem import Inputs, Problem


@dataclass(frozen=True)
class Verification:
    rel_err: float
    tolerance: float


def reference(problem: Problem, inputs: Inputs):
    import cupy as cp

    ref = cp.matmul(inputs.a.astype(cp.float64), inputs.b.astype(cp.float64))
    ref *= problem.alpha
    if problem.beta != 0.0:
        ref += problem.beta * inputs.c0.astype(cp.float64)
    return ref


def verify(kernel, problem: Problem, inputs: Inputs, tolerance: float, name: str) -> Verification:
    import cupy as cp

    inputs.c[...] = inputs.c0
    try:
        kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
        cp.cuda.runtime.deviceSynchronize()
    except cp.cuda.runtime.CUDARuntimeError as exc:  # a fault in the kernel, seen at the sync
        raise LaunchFailed(f"kernel {name} faulted while running: {exc}") from exc
    c = inputs.c
    not_finite = int(c.size - cp.count_nonzero(cp.isfinite(c)))
    if not_finite:
        raise VerificationFailed(
            f"kernel {name} failed verification: {not_finite} of {c.size} elements of C are NaN or "
            f"Inf (unwritten elements keep their NaN poison) (rule: every element finite).",
            rel_err=None,
        )
    ref = reference(problem, inputs)
    rel_err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    del ref
    if not rel_err <= tolerance:
        raise VerificationFailed(
            f"kernel {name} failed verification: normwise relative error {rel_err:.3e} against the "
            f"FP64 reference exceeds the tolerance {tolerance:.1e} (rule: rel_err <= bench.tolerance).",
            rel_err=rel_err,
        )
    return Verification(rel_err=rel_err, tolerance=tolerance)
