"""The problem: C = alpha * A @ B + beta * C on row-major FP32 matrices, and its inputs."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from src.errors import InvalidProblem, OutOfMemory
from src.job.shapes import digits


INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    alpha: float
    beta: float

    @property
    def flops(self) -> int:
        # 2 per multiply-add; the alpha/beta epilogue (O(MN)) is not counted, as in the seeds.
        return 2 * self.m * self.n * self.k

    @property
    def label(self) -> str:
        return str(self.m) if self.m == self.n == self.k else f"{self.m}x{self.n}x{self.k}"

    @classmethod
    def from_cfg(cls, cfg) -> "Problem":
        shape = cfg.get("shape")
        given = None if shape in (None, "") else digits(shape)
        if shape not in (None, "") and given is None:
            raise InvalidProblem(
                f"invalid problem shape: shape={shape!r} is not MxNxK (rule: shape=MxNxK, three "
                f"positive integers joined by x, e.g. shape=4096x2048x1024; or set m=, n=, k=).")
        dims = {}
        for name in ("m", "n", "k"):
            value = cfg[name]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidProblem(
                    f"invalid problem size: {name}={value!r}. M, N and K must be positive "
                    f"integers (rule: {name} > 0 and integer); set them with size=N for a square "
                    f"problem, m=, n=, k= or shape=MxNxK (e.g. shape=4096x2048x1024) for a "
                    f"rectangular one."
                )
            if value > INT32_MAX:
                raise InvalidProblem(
                    f"invalid problem size: {name}={value}. The kernels and cuBLAS take M, N and K "
                    f"as 32-bit ints (rule: {name} <= {INT32_MAX}, 2**31 - 1).")
            dims[name] = value
        scalars = {}
        for name in ("alpha", "beta"):
            value = cfg[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise InvalidProblem(
                    f"invalid problem scalar: {name}={value!r}. alpha and beta must be finite "
                    f"numbers (rule: {name} finite; C = alpha * A @ B + beta * C)."
                )
            scalars[name] = float(value)
        if given is not None and given != (dims["m"], dims["n"], dims["k"]):
            raise InvalidProblem(
                f"conflicting problem size: shape={shape} says {'x'.join(map(str, given))} but "
                f"m={dims['m']}, n={dims['n']}, k={dims['k']} are set too (rule: the shape is set "
                f"once, by shape=MxNxK or by m=, n=, k=, not both); drop one of them.")
        return cls(**dims, **scalars)


@dataclass
class Inputs:
    """Device arrays for one job. `c0` is C before the launch (NaN-poisoned when beta == 0,
    so an element the kernel never writes cannot pass verification)."""

    a: object
    b: object
    c: object
    c0: object
    seed: int


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def make_inputs(problem: Problem, seed: int | None = None) -> Inputs:
    """Fresh U(-1, 1) inputs (never zeros or ones), generated on the GPU."""
    import cupy as cp

    seed = fresh_seed() if seed is None else int(seed)
    mk, kn, mn = problem.m * problem.k, problem.k * problem.n, problem.m * problem.n
    # FP32 A, B, C, C0, plus the FP64 copies and product the reference check makes (verify.py).
    need = 4 * (mk + kn + 2 * mn) + 8 * (mk + kn + 2 * mn)
    free, _total = cp.cuda.runtime.memGetInfo()
    if need > free:
        raise OutOfMemory(
            f"problem {problem.m}x{problem.n}x{problem.k} does not fit in GPU memory: its FP32 "
            f"inputs, output and the FP64 reference made for verification need {need / 2**30:.2f} GiB "
            f"and {free / 2**30:.2f} GiB are free (rule: working set <= free device memory)."
        )
    rng = cp.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, (problem.m, problem.k), dtype=cp.float32)
    b = rng.uniform(-1.0, 1.0, (problem.k, problem.n), dtype=cp.float32)
    if problem.beta == 0.0:
        c0 = cp.full((problem.m, problem.n), cp.nan, dtype=cp.float32)
    else:
        c0 = rng.uniform(-1.0, 1.0, (problem.m, problem.n), dtype=cp.float32)
    return Inputs(a=a, b=b, c=c0.copy(), c0=c0, seed=seed)


def shape_label(shape) -> str:
    """'MxNxK' of a (m, n, k) shape, cubes too, as the tuner's evidence writes its `shape` column
    (Problem.label shortens a cube to one number)."""
    return "x".join(str(d) for d in shape)
