"""One Hydra job, step by step: config -> spec -> compile -> verify -> time -> record.

Every expected failure (errors.LabError) ends the job with its status and message in the
record; the caller decides what that means for the process (run.py). A job normally runs in a
worker process (src/sweep/worker.py), which relays `progress` after each step to its launcher.
With `resume=true`, a job whose exact measurement is in the cache (src/job/cache.py) is
not run again: its record is the cached one, marked `from_cache`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from src.paths import CONF_DIR
from src.job import gpu as gpu_mod
from src.tune import tuned
from src.job.compile import DEFAULT_CACHE_DIR, ResourceReport, compile_kernel, expand_source
from src.errors import InternalError, LabError, LaunchFailed, NoGPU, VerificationFailed
from src.job.cache import Cache
from src.job.cache import key as measurement_key
from src.job.problem import Problem, make_inputs
from src.records.record import Record
from src.job.spec import KernelSpec, build_spec
from src.job.timing import L2Flush, measure
from src.job.verify import verify

log = logging.getLogger(__name__)
KERNEL_CONF_DIR = CONF_DIR / "kernel"

# Baseline GFLOP/s measured in this process, keyed by shape, scalars and protocol.
_baseline_gflops: dict[tuple, float] = {}
_flush: dict[int, L2Flush] = {}


@dataclass
class JobOutputs:
    """What a job made besides its record, for the tracking step to keep as files: the kernel
    source exactly as handed to NVRTC (kernels/common.cuh pasted in; set once the spec is built,
    so a job that fails to compile still has it) and the compiler's resource report (set once
    compiled). Both stay None for a cuBLAS baseline, which compiles nothing."""

    source: str | None = None
    resources: ResourceReport | None = None


def _bench_key(bench: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in bench.items()))


def _no_progress(step: str, record: Record) -> None:
    pass


def _verify_and_time(spec: KernelSpec, problem: Problem, bench: dict, device, record: Record,
                     outputs: JobOutputs | None = None, progress=_no_progress,
                     cache_dir: str = DEFAULT_CACHE_DIR):
    """Compile, verify on fresh inputs, then time: fills `record`, returns GFLOP/s."""
    import cupy as cp

    kernel = compile_kernel(spec, cache_dir)
    if kernel.report is not None:
        if outputs is not None:
            outputs.resources = kernel.report
        for key, value in vars(kernel.report).items():
            if hasattr(record, key):
                setattr(record, key, value)

    inputs = make_inputs(problem, bench.get("seed"))
    faulted: list = []
    record.seed = inputs.seed
    tolerance = float(bench["tolerance"][spec.precision])
    record.tolerance = tolerance
    try:
        progress("compiled", record)
        checked = verify(kernel, problem, inputs, tolerance, spec.name)
        record.rel_err = checked.rel_err
        progress("verified", record)

        flush = None
        if bench["flush_l2"]:
            flush = _flush.setdefault(device.l2_bytes, L2Flush(device.l2_bytes))

        def between():
            if problem.beta != 0.0:
                inputs.c[...] = inputs.c0  # time on the same realistic C every sample
            if flush is not None:
                flush()

        timing = measure(
            lambda: kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta),
            warmup=int(bench["warmup"]), min_samples=int(bench["min_samples"]),
            max_samples=int(bench["max_samples"]), target_rel_iqr=float(bench["target_rel_iqr"]),
            max_seconds=float(bench["max_seconds"]),
            between=between if (flush is not None or problem.beta != 0.0) else None,
            read_clock=lambda: gpu_mod.sm_clock_mhz(device),
            max_clock_mhz=device.max_sm_clock_mhz,
            throttle_threshold=bench.get("throttle_threshold"),
        )
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
    record.time_ms_median = timing.median_ms
    record.time_ms_min = timing.min_ms
    record.time_ms_max = timing.max_ms
    record.time_ms_iqr = timing.iqr_ms
    record.samples = timing.samples
    record.sm_clock_mhz_before = timing.sm_clock_mhz_before
    record.sm_clock_mhz_after = timing.sm_clock_mhz_after
    record.samples_throttled = timing.samples_throttled
    record.sample_clock_mhz = list(timing.sample_clock_mhz)
    record.gflops = problem.flops / (timing.median_ms * 1e-3) / 1e9
    return record.gflops


def baseline_gflops(which: str, problem: Problem, bench: dict, device) -> float | None:
    """cuBLAS FP32/TF32 GFLOP/s at this shape, measured once per process with the same protocol."""
    key = (which, problem, _bench_key(bench))
    if key not in _baseline_gflops:
        spec = build_spec(OmegaConf.load(KERNEL_CONF_DIR / f"{which}.yaml"), problem, {})
        scratch = new_record(spec.name, spec.precision, spec.backend, vars(problem))
        try:
            _baseline_gflops[key] = _verify_and_time(spec, problem, bench, device, scratch)
        except LabError as exc:
            log.warning("baseline %s at %s failed: %s", which, problem.label, exc)
            return None
    return _baseline_gflops[key]


def new_record(kernel: str, precision: str, backend: str, problem: dict, **extra) -> Record:
    """`problem` holds m, n, k, alpha, beta as given (possibly invalid: they are recorded as is)."""
    return Record(kernel=kernel, precision=precision, backend=backend,
                  **{key: problem[key] for key in ("m", "n", "k", "alpha", "beta")},
                  timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra)


def run_job(cfg: DictConfig, outputs: JobOutputs | None = None,
            explicit_params: set[str] = frozenset(), progress=_no_progress,
            run_id: str | None = None) -> Record:
    """Run one job; `outputs`, if given, receives what the tracking step logs besides the record;
    `explicit_params`: kernel.params.* names set on the command line (they beat tuned values);
    `progress(step, record)` is called after each step (the worker relays it to its launcher);
    `run_id`: the job's MLflow run, kept in the record (and so in the measurement cache)."""
    kcfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    record = new_record(
        str(kcfg.get("name")), str(kcfg.get("precision")), str(kcfg.get("backend")), cfg,
        params=dict(kcfg.get("params") or {}), bench=bench, mlflow_run_id=run_id)
    try:
        problem = Problem.from_cfg(cfg)
        try:
            device = gpu_mod.detect()
            limits = gpu_mod.device_limits(device)
            gpu_spec = gpu_mod.resolve_spec(cfg.gpu, device)
            gpu_spec_name = gpu_spec.name
        except NoGPU:
            # Still check the parameters (against the named GPU's limits, or an H100's), so a
            # configuration can be validated on a machine without a GPU; then report NoGPU.
            device = None
            gpu_spec_name = cfg.gpu.name if cfg.gpu.name != "auto" else "h100_sxm"
            limits = gpu_mod.limits_from_spec(gpu_spec_name)
        if tuned.applies(cfg):
            choice = tuned.apply(kcfg, gpu_spec_name, problem, set(explicit_params))
            record.params, record.tuned_from = dict(kcfg["params"]), choice.source
        spec = build_spec(kcfg, problem, limits)
        record.entry, record.grid, record.block = spec.entry, list(spec.grid), list(spec.block)
        if outputs is not None and spec.source is not None:
            outputs.source = expand_source(spec.source)
        if device is None:
            gpu_mod.detect()  # raises NoGPU with its message
        _warn_if_spec_mismatch(gpu_spec, device)
        record.gpu, record.gpu_spec, record.device = device.name, gpu_spec.name, asdict(device)
        progress("spec", record)

        cache_dir = str(cfg.get("cache_dir") or DEFAULT_CACHE_DIR)
        cache = Cache(cache_dir)
        digest = measurement_key(spec, problem, bench, device,
                                 source_sha256(outputs.source if outputs else None, spec), gpu_spec)
        if cfg.get("resume"):
            cached = cache.get(digest)
            if cached is not None:
                cached.from_cache = True
                return cached

        gflops = _verify_and_time(spec, problem, bench, device, record, outputs, progress,
                                  cache_dir)
        progress("timed", record)
        if spec.backend == "cublas":
            _baseline_gflops[(spec.name, problem, _bench_key(bench))] = gflops
        fp32 = baseline_gflops("cublas_fp32", problem, bench, device)
        tf32 = baseline_gflops("cublas_tf32", problem, bench, device)
        record.cublas_fp32_gflops, record.cublas_tf32_gflops = fp32, tf32
        record.pct_of_cublas_fp32 = 100.0 * gflops / fp32 if fp32 else None
        record.pct_of_cublas_tf32 = 100.0 * gflops / tf32 if tf32 else None
        peak = gpu_spec.peak_tflops(spec.precision)
        record.pct_of_peak = 100.0 * gflops / (peak * 1e3) if peak else None
        cache.put(digest, record)
    except LabError as exc:
        mark_failed(record, exc)
    except Exception as exc:  # a bug, not bad input: record it so a sweep goes on
        if cfg.get("debug"):
            raise
        mark_failed(record, InternalError(
            f"internal error while running {record.kernel} (a bug in sgemm-lab; rerun with "
            f"debug=true for the traceback): {type(exc).__name__}: {exc}"))
    return record


def source_sha256(source_text: str | None, spec: KernelSpec) -> str | None:
    """SHA-256 of the exact text handed to NVRTC (None for a cuBLAS baseline)."""
    import hashlib

    if spec.source is None:
        return None
    text = source_text if source_text is not None else expand_source(spec.source)
    return hashlib.sha256(text.encode()).hexdigest()


def mark_failed(record: Record, exc: LabError) -> None:
    record.status = exc.status
    record.error = str(exc)
    if isinstance(exc, VerificationFailed):
        record.rel_err = exc.rel_err
    for name in ("gflops", "time_ms_median", "time_ms_min", "time_ms_max", "time_ms_iqr",
                 "samples", "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_peak"):
        setattr(record, name, None)


def _warn_if_spec_mismatch(gpu_spec, device) -> None:
    if gpu_spec.match and not any(re.search(p, device.name, re.IGNORECASE) for p in gpu_spec.match):
        log.warning("gpu=%s was requested but the device is %r: pct_of_peak uses %s's datasheet.",
                    gpu_spec.name, device.name, gpu_spec.name)
