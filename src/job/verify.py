"""Verify step: run the kernel on fresh inputs and compare every element with an FP64 reference.

The reference is computed on the GPU: A and B are widened to float64 and multiplied by cuBLAS
DGEMM (cupy.matmul), then alpha * AB + beta * C0 is formed in float64. The error is normwise,
||C - C_ref||_F / ||C_ref||_F, accumulated in float64. NaN (the poison left in an element the
kernel never wrote) or Inf anywhere fails the check whatever the norm says.

`check` compares any output with a reference already made, so the timing step can check the
output of timed launches too (measure.py), raising the error class it is given.
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


def check(c, ref, tolerance: float, name: str, what: str = "verification",
          error=VerificationFailed) -> Verification:
    """`c` against `ref`: every element finite and normwise rel_err <= tolerance, else `error`
    (a VerificationFailed class) with `what` naming the check in its message."""
    import cupy as cp

    not_finite = int(c.size - cp.count_nonzero(cp.isfinite(c)))
    if not_finite:
        raise error(
            f"kernel {name} failed {what}: {not_finite} of {c.size} elements of C are NaN or "
            f"Inf (unwritten elements keep their NaN poison) (rule: every element finite).",
            rel_err=None,
        )
    rel_err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    if not rel_err <= tolerance:
        raise error(
            f"kernel {name} failed {what}: normwise relative error {rel_err:.3e} against the "
            f"FP64 reference exceeds the tolerance {tolerance:.1e} (rule: rel_err <= bench.tolerance).",
            rel_err=rel_err,
        )
    return Verification(rel_err=rel_err, tolerance=tolerance)


def run_once(kernel, problem: Problem, inputs: Inputs, name: str) -> None:
    """One launch on C = C0 (NaN-poisoned when beta == 0), synchronised."""
    import cupy as cp

    inputs.c[...] = inputs.c0
    try:
        kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)
        cp.cuda.runtime.deviceSynchronize()
    except cp.cuda.runtime.CUDARuntimeError as exc:  # a fault in the kernel, seen at the sync
        raise LaunchFailed(f"kernel {name} faulted while running: {exc}") from exc


def verify(kernel, problem: Problem, inputs: Inputs, tolerance: float, name: str, ref=None,
           what: str = "verification", error=VerificationFailed) -> Verification:
    """One launch on `inputs`, checked against `ref` (made here when not given)."""
    run_once(kernel, problem, inputs, name)
    if ref is None:
        ref = reference(problem, inputs)
    return check(inputs.c, ref, tolerance, name, what, error)
