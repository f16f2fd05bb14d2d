"""The stronger cuBLAS baseline: cuBLASLt with its algorithms autotuned for the shape, through
nvmath-python (`nvmath.linalg.advanced.Matmul`: plan(), then execute(algorithm=...)), behind the
chapters' launch(a, b, c, alpha, beta) interface.

cuBLAS's default heuristic (src/job/cublas.py) picks one algorithm without timing; here the
heuristic's candidates (plan(), up to 8) are timed on this GPU by `rank` (Baselines passes
measure.time_each: the lab's timing step, the kernels' GPU timestamps with the L2 flushed, the
clock that then judges the baseline) and execute() runs the fastest. Not nvmath's autotune():
its CUDA events around each execute() include the host's launch path, so at small shapes its
order is mostly that noise (on an H200, 18 of 64 held-out shapes' autotuned figure moved more
than 10% between two runs, up to 1.6x, while the lab's kernels and cuBLAS's default moved under
4%: docs/measurement.md, "Who ranks the algorithms"). Neither the default nor the autotuned one
is always faster (on an H100 the autotuned choice lost to the default at most shapes), so a
kernel is compared with the stronger of the two per shape (measure.py). The product runs in
place (options inplace=True: C is overwritten, as by the chapters), FP32 compute for fp32 and
FP32 with TF32 tensor-core math for tf32. A Matmul is planned and ranked once per shape, alpha
and beta, and re-pointed at new arrays with reset_operands.
"""

from __future__ import annotations

import functools
import logging

from src.errors import LaunchFailed

# nvmath logs four INFO lines on every execute() through the root logger unless given one, and
# Hydra's job logging sets the root to INFO: 100,000 lines in a suite's log, formatted inside the
# baseline's timed launches. Its warnings and errors still reach the job's log.
NVMATH_LOGGER = logging.getLogger(__name__ + ".nvmath")
NVMATH_LOGGER.setLevel(logging.WARNING)


class AutotunedGemm:
    def __init__(self, precision: str, rank):
        import nvmath  # noqa: F401  (ImportError: the caller records the baseline as missing)
        from nvmath.linalg import ComputeType

        self.precision = precision
        self.rank = rank  # rank(launches, restore) -> each launch's time in ms (measure.time_each)
        self.algorithm_ms: list[float] | None = None  # each planned algorithm's time, by `rank`
        self._algorithm = None  # the one execute() runs (None: the only one planned)
        self.compute_type = (ComputeType.COMPUTE_32F_FAST_TF32 if precision == "tf32"
                             else ComputeType.COMPUTE_32F)
        self.report = None  # nothing is compiled
        self._mm = None
        self._problem = None   # (shapes, alpha, beta) the current Matmul was planned for
        self._arrays = None    # the data pointers it is bound to

    def _plan(self, a, b, c, alpha: float, beta: float) -> None:
        from nvmath.linalg.advanced import Matmul

        if self._mm is not None:
            self._mm.free()
        self._mm = Matmul(a, b, c=c, alpha=alpha, beta=beta,
                          options={"compute_type": self.compute_type, "inplace": True,
                                   "logger": NVMATH_LOGGER})
        self._mm.plan()
        self._algorithm, self.algorithm_ms = None, None
        algorithms = list(self._mm.algorithms)
        if len(algorithms) < 2:
            return
        saved = c.copy()  # the ranking's launches overwrite C: launch() still makes one product

        def restore():
            c[...] = saved
        self.algorithm_ms = list(self.rank(
            [functools.partial(self._mm.execute, algorithm=alg) for alg in algorithms], restore))
        fastest = min(range(len(algorithms)), key=lambda i: (self.algorithm_ms[i], i))
        self._algorithm = algorithms[fastest]
        restore()

    def launch(self, a, b, c, alpha: float, beta: float) -> None:
        problem = (a.shape, b.shape, float(alpha), float(beta))
        arrays = (a.data.ptr, b.data.ptr, c.data.ptr)
        try:
            if problem != self._problem:
                self._plan(a, b, c, alpha, beta)
                self._problem, self._arrays = problem, arrays
            elif arrays != self._arrays:
                self._mm.reset_operands(a=a, b=b, c=c)
                self._arrays = arrays
            self._mm.execute(algorithm=self._algorithm)
        except Exception as exc:
            raise LaunchFailed(f"cuBLASLt (nvmath-python Matmul, {self.precision}) failed: "
                               f"{type(exc).__name__}: {exc}") from exc
