"""Measure step: a prepared job is compiled, verified on fresh inputs, then timed; its figure is
compared with the cuBLAS baselines of the same shape and protocol, measured in the same process.

    PreparedJob -> compiled module -> verified result -> timed result (filled into the record)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from src.errors import LaunchFailed
from src.job import gpu as gpu_mod
from src.job.compile import DEFAULT_CACHE_DIR, ResourceReport, compile_kernel
from src.job.prepare import PreparedJob
from src.job.problem import make_inputs
from src.job.timing import L2Flush, Timing
from src.job.timing import measure as time_launches
from src.job.verify import verify
from src.records.record import Record

log = logging.getLogger(__name__)

_flush: dict[int, L2Flush] = {}  # one flush buffer per L2 size, reused by every job


@dataclass
class JobOutputs:
    """What a job made besides its record, for the tracking step to keep as files: the kernel
    source exactly as handed to NVRTC (set once prepared, so a job that fails to compile still has
    it) and the compiler's resource report (set once compiled). Both stay None for a cuBLAS
    baseline, which compiles nothing."""

    source: str | None = None
    resources: ResourceReport | None = None


def _no_progress(step: str, record: Record) -> None:
    pass


def _time(kernel, prepared: PreparedJob, inputs, device) -> Timing:
    bench, problem = prepared.bench, prepared.problem
    flush = None
    if bench["flush_l2"]:
        flush = _flush.setdefault(device.l2_bytes, L2Flush(device.l2_bytes))

    def between():
        if problem.beta != 0.0:
            inputs.c[...] = inputs.c0  # time on the same realistic C every sample
        if flush is not None:
            flush()

    return time_launches(
        lambda: kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta),
        warmup=int(bench["warmup"]), min_samples=int(bench["min_samples"]),
        max_samples=int(bench["max_samples"]), target_rel_iqr=float(bench["target_rel_iqr"]),
        max_seconds=float(bench["max_seconds"]),
        between=between if (flush is not None or problem.beta != 0.0) else None,
        read_clock=lambda: gpu_mod.sm_clock_mhz(device),
        max_clock_mhz=device.max_sm_clock_mhz,
        throttle_threshold=bench.get("throttle_threshold"),
    )


def _keep_timing(record: Record, timing: Timing, flops: int) -> None:
    record.time_ms_median = timing.median_ms
    record.time_ms_min = timing.min_ms
    record.time_ms_max = timing.max_ms
    record.time_ms_iqr = timing.iqr_ms
    record.samples = timing.samples
    record.sm_clock_mhz_before = timing.sm_clock_mhz_before
    record.sm_clock_mhz_after = timing.sm_clock_mhz_after
    record.samples_throttled = timing.samples_throttled
    record.sample_clock_mhz = list(timing.sample_clock_mhz)
    record.gflops = flops / (timing.median_ms * 1e-3) / 1e9


def _compiled(prepared: PreparedJob, record: Record, outputs: JobOutputs | None, cache_dir: str):
    kernel = compile_kernel(prepared.spec, cache_dir)
    if kernel.report is not None:
        if outputs is not None:
            outputs.resources = kernel.report
        for key, value in vars(kernel.report).items():
            if hasattr(record, key):
                setattr(record, key, value)
    return kernel


def verify_only(prepared: PreparedJob, record: Record, cache_dir: str = DEFAULT_CACHE_DIR) -> float:
    """Compile and verify on fresh inputs, without timing (fills `record`; returns rel_err)."""
    import cupy as cp

    prepared.require_device()
    kernel = _compiled(prepared, record, None, cache_dir)
    inputs = make_inputs(prepared.problem, prepared.bench.get("seed"))
    record.seed = inputs.seed
    record.tolerance = float(prepared.bench["tolerance"][prepared.spec.precision])
    try:
        record.rel_err = verify(kernel, prepared.problem, inputs, record.tolerance,
                                prepared.spec.name).rel_err
    finally:
        inputs = None
        cp.get_default_memory_pool().free_all_blocks()
    return record.rel_err


def verify_and_time(prepared: PreparedJob, record: Record, outputs: JobOutputs | None = None,
                    progress=_no_progress, cache_dir: str = DEFAULT_CACHE_DIR) -> float:
    """Compile, verify on fresh inputs, then time: fills `record`, returns GFLOP/s."""
    import cupy as cp

    spec, problem, bench = prepared.spec, prepared.problem, prepared.bench
    device = prepared.require_device()
    kernel = _compiled(prepared, record, outputs, cache_dir)
    inputs = make_inputs(problem, bench.get("seed"))
    faulted: list = []
    record.seed = inputs.seed
    record.tolerance = float(bench["tolerance"][spec.precision])
    try:
        progress("compiled", record)
        record.rel_err = verify(kernel, problem, inputs, record.tolerance, spec.name).rel_err
        progress("verified", record)
        timing = _time(kernel, prepared, inputs, device)
    except cp.cuda.runtime.CUDARuntimeError as exc:
        faulted.append(inputs)
        raise LaunchFailed(f"kernel {spec.name} faulted while being timed: {exc}") from exc
    except LaunchFailed:
        faulted.append(inputs)
        raise
    finally:
        if not faulted:  # a faulted context cannot free memory: its worker exits instead
            inputs = None  # drop the device arrays (the closures above are done with them)
            cp.get_default_memory_pool().free_all_blocks()
    _keep_timing(record, timing, problem.flops)
    return record.gflops


def measure(prepared: PreparedJob, baselines, record: Record, outputs: JobOutputs | None = None,
            progress=_no_progress, cache_dir: str = DEFAULT_CACHE_DIR) -> Record:
    """Verify and time a prepared job, then compare it with `baselines` (a baselines.Baselines:
    cuBLAS FP32 and TF32 at the same shape and protocol, measured in this process)."""
    gflops = verify_and_time(prepared, record, outputs, progress, cache_dir)
    progress("timed", record)
    spec, problem, bench = prepared.spec, prepared.problem, prepared.bench
    if spec.backend == "cublas":
        baselines.remember(spec.name, problem, bench, gflops)
    fp32 = baselines.gflops("cublas_fp32", problem, bench, prepared.target)
    tf32 = baselines.gflops("cublas_tf32", problem, bench, prepared.target)
    record.cublas_fp32_gflops, record.cublas_tf32_gflops = fp32, tf32
    record.pct_of_cublas_fp32 = 100.0 * gflops / fp32 if fp32 else None
    record.pct_of_cublas_tf32 = 100.0 * gflops / tf32 if tf32 else None
    peak = prepared.target.gpu_spec.peak_tflops(spec.precision)
    record.pct_of_peak = 100.0 * gflops / (peak * 1e3) if peak else None
    return record
