"""Baselines: cuBLAS FP32 and TF32, compiled once per process and handed to measure() to be timed
interleaved with each kernel of their precision (measure.py). An object the caller owns (the
worker keeps one per process), so two callers never share state by accident."""

from __future__ import annotations

import functools
import logging

from src.errors import LabError
from src.job.compile import DEFAULT_CACHE_DIR, compile_kernel
from src.job.config import kernel_config
from src.job.measure import Baseline, time_each, verify_and_time
from src.job.prepare import PreparedJob, Target, prepare_kernel
from src.job.problem import Problem
from src.job.protocol import BenchProtocol
from src.records.record import new_record

log = logging.getLogger(__name__)

NAMES = ("cublas_fp32", "cublas_tf32")


class Baselines:
    def __init__(self) -> None:
        self._kernels: dict[str, Baseline | None] = {}

    def paired(self, name: str, job: PreparedJob) -> Baseline | None:
        """Baseline `name`, ready to time beside `job` (None, with a warning, if it cannot be
        built: the job is then measured alone and has no % of cuBLAS)."""
        if name not in self._kernels:
            try:
                prepared = prepare_kernel(kernel_config(name), job.problem, job.target, job.bench)
                tolerance = float(job.bench.tolerance[prepared.spec.precision])
                self._kernels[name] = Baseline(name, compile_kernel(prepared.spec), tolerance)
            except LabError as exc:
                log.warning("baseline %s is not available: %s", name, exc)
                self._kernels[name] = None
        return self._kernels[name]

    def autotuned(self, precision: str, job: PreparedJob) -> Baseline | None:
        """cuBLASLt autotuned for each shape (src/job/cublaslt.py; its algorithms ranked by
        measure.time_each with `job`'s protocol), or None with a warning when
        nvmath-python is missing or refuses (the record's cublaslt fields then stay empty)."""
        name = f"cublaslt_{precision}_autotuned"
        rank = functools.partial(time_each, bench=job.bench, device=job.require_device())
        if name not in self._kernels:
            try:
                from src.job.cublaslt import AutotunedGemm

                tolerance = float(job.bench.tolerance[precision])
                self._kernels[name] = Baseline(name, AutotunedGemm(precision, rank), tolerance)
            except Exception as exc:  # ImportError, or nvmath refusing this device
                log.warning("baseline %s is not available: %s: %s", name, type(exc).__name__, exc)
                self._kernels[name] = None
        baseline = self._kernels[name]
        if baseline is not None:  # ranked by this job's protocol and clock, as it is timed
            baseline.kernel.rank = rank
        return baseline

    def peers(self, names, job: PreparedJob, cache_dir: str = DEFAULT_CACHE_DIR
              ) -> tuple[list[Baseline], list[str]]:
        """The peers `names` (conf/kernel/<name>.yaml: the Triton ones, CUTLASS's, which builds
        into `cache_dir`), ready to time beside `job`, each built once per process; and
        "name: why" of each that cannot be (its package missing: skipped_missing_peer). A
        missing peer never fails the job."""
        built, skipped = [], []
        for name in names:
            if name not in self._kernels:
                try:
                    prepared = prepare_kernel(kernel_config(name), job.problem, job.target, job.bench)
                    tolerance = float(job.bench.tolerance[prepared.spec.precision])
                    self._kernels[name] = Baseline(name, compile_kernel(prepared.spec, cache_dir),
                                                   tolerance)
                except LabError as exc:
                    log.warning("peer %s is not available: %s", name, exc)
                    self._kernels[name] = f"{name}: {exc.status}: {exc}"
            peer = self._kernels[name]
            (built if isinstance(peer, Baseline) else skipped).append(peer)
        return built, skipped

    def gflops(self, name: str, problem: Problem, bench: BenchProtocol, where: Target) -> float | None:
        """`name` timed alone at this shape (tools that want one figure; jobs are paired)."""
        prepared = prepare_kernel(kernel_config(name), problem, where, bench)
        scratch = new_record(name, prepared.spec.precision, "cublas", vars(problem))
        try:
            return verify_and_time(prepared, scratch)
        except LabError as exc:
            log.warning("baseline %s at %s failed: %s", name, problem.label, exc)
            return None
