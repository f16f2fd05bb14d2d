"""Baselines: cuBLAS FP32 and TF32 at a job's shape, measured once per process with the job's own
protocol and kept for the next job of that shape. An object the caller owns (the worker keeps one
per process), passed to measure(), so two callers never share figures by accident."""

from __future__ import annotations

import logging

from src.errors import LabError
from src.job.config import kernel_config
from src.job.measure import verify_and_time
from src.job.prepare import Target, prepare_kernel
from src.job.problem import Problem
from src.records.record import new_record

log = logging.getLogger(__name__)

NAMES = ("cublas_fp32", "cublas_tf32")


def _bench_key(bench: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in bench.items()))


class Baselines:
    def __init__(self) -> None:
        self._gflops: dict[tuple, float] = {}

    def remember(self, name: str, problem: Problem, bench: dict, gflops: float) -> None:
        """A baseline measured as a job of its own stands for this shape from now on."""
        self._gflops[(name, problem, _bench_key(bench))] = gflops

    def gflops(self, name: str, problem: Problem, bench: dict, where: Target) -> float | None:
        """`name`'s GFLOP/s at this shape (measured now if not yet); None if it failed."""
        key = (name, problem, _bench_key(bench))
        if key not in self._gflops:
            prepared = prepare_kernel(kernel_config(name), problem, where, bench)
            scratch = new_record(name, prepared.spec.precision, "cublas", vars(problem))
            try:
                self._gflops[key] = verify_and_time(prepared, scratch)
            except LabError as exc:
                log.warning("baseline %s at %s failed: %s", name, problem.label, exc)
                return None
        return self._gflops[key]
