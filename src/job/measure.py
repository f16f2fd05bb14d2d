"""Measure step: a prepared job is compiled, verified on fresh inputs, then timed interleaved with
its baseline (cuBLAS in the kernel's precision, A B A B ..., same flush protocol), and the output
of the timed launches is checked too.

    PreparedJob -> compiled -> verified (first launch) -> timed with the baseline, paired
                -> timed output checked (a random timed sample, poisoned first; the last one)
                -> verified again on fresh inputs -> plausible? -> figures in the record

A kernel whose timed launches or later launches disagree with its first fails as
failed_timed_verification; a figure beyond the GPU's ceiling fails as failed_implausible
(plausibility.py); neither gets a figure anywhere.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from src.errors import LabError, LaunchFailed, TimedVerificationFailed
from src.job import gpu as gpu_mod
from src.job import kernel_clock, plausibility
from src.job.compile import DEFAULT_CACHE_DIR, ResourceReport, compile_kernel
from src.job.prepare import PreparedJob
from src.job.problem import Inputs, make_inputs
from src.job.recording import (keep_best, keep_conditions, keep_pairing, keep_peer, keep_ratio,
                               keep_timing, keep_tuning)
from src.job.protocol import throttle_mask
from src.job.timing import Arm, Interleaved, L2Flush, measure_interleaved
from src.job.verify import check, reference, verify
from src.records.record import Record

log = logging.getLogger(__name__)

_flush: dict[int, L2Flush] = {}  # one flush buffer per L2 size, reused by every job

# The baseline each precision is paired with (3xTF32 kernels are FP32-accurate: cuBLAS FP32).
PAIRED_BASELINE = {"fp32": "cublas_fp32", "tf32": "cublas_tf32"}
# Ranking the autotuned cuBLASLt's algorithms (time_each), once per shape: 12 launches of each of
# its (up to 8) algorithms, the medians of the last 10, at most 5 s for the slowest shapes.
RANK_WARMUP, RANK_SAMPLES, RANK_SECONDS = 2, 10, 5.0


@dataclass
class JobOutputs:
    """What a job made besides its record, for the tracking step to keep as files: the kernel
    source exactly as handed to NVRTC (set once prepared, so a job that fails to compile still has
    it) and the compiler's resource report (set once compiled). Both stay None for a cuBLAS
    baseline, which compiles nothing."""

    source: str | None = None
    resources: ResourceReport | None = None


@dataclass
class Baseline:
    """A compiled baseline to pair the kernel with (baselines.Baselines.paired makes one)."""

    name: str
    kernel: object
    tolerance: float


def _no_progress(step: str, record: Record) -> None:
    pass


class SpotCheck:
    """The output of one timed sample, chosen at random: C is NaN-poisoned before it (when
    beta != 0 the restore of C0 does that job) and copied aside after it, for `check`."""

    def __init__(self, inputs: Inputs, beta: float, samples: int):
        self.inputs, self.beta = inputs, beta
        self.index = int(np.random.default_rng().integers(0, max(samples, 1)))
        self.snapshot = None

    def before(self, i: int) -> None:
        if i == self.index and self.beta == 0.0:
            self.inputs.c.fill(np.nan)

    def after(self, i: int) -> None:
        if i == self.index:
            self.snapshot = self.inputs.c.copy()


def _between(problem, inputs: Inputs, flush):
    if flush is None and problem.beta == 0.0:
        return None

    def between():
        if problem.beta != 0.0:
            inputs.c[...] = inputs.c0  # time on the same realistic C every sample
        if flush is not None:
            flush()
    return between


def _launcher(kernel, problem, inputs: Inputs):
    return lambda: kernel.launch(inputs.a, inputs.b, inputs.c, problem.alpha, problem.beta)


def _flush_for(bench, device) -> L2Flush | None:
    if not bench.flush_l2:
        return None
    if device.l2_bytes not in _flush:  # made once: setdefault would allocate one every job
        _flush[device.l2_bytes] = L2Flush(device.l2_bytes)
    return _flush[device.l2_bytes]


def time_each(launches: list, restore, bench, device) -> list[float]:
    """Each launch's median time in ms, the launches timed interleaved as a job's arms are (the
    protocol's clock: the kernels' own GPU timestamps where CUPTI works; the L2 flushed and
    `restore` run untimed before every sample), RANK_SAMPLES rounds after RANK_WARMUP. How the
    autotuned cuBLASLt baseline orders its algorithms (cublaslt.py): by the clock that then
    judges it, not by event pairs around nvmath's Python launch path."""
    flush = _flush_for(bench, device)

    def between():
        restore()
        if flush is not None:
            flush()
    result = measure_interleaved([Arm(launch, between) for launch in launches], warmup=RANK_WARMUP,
                                 min_samples=RANK_SAMPLES, max_samples=RANK_SAMPLES,
                                 target_rel_iqr=1.0, max_seconds=RANK_SECONDS,
                                 kernel_clock=kernel_clock.shared(bench.timer))
    return [t.median_ms for t in result.timings]


def _time(kernel, prepared: PreparedJob, inputs, spot: SpotCheck, device,
          paired: list[tuple[Baseline, Inputs]]) -> Interleaved:
    bench, problem = prepared.bench, prepared.problem
    flush = _flush_for(bench, device)
    arms = [Arm(_launcher(kernel, problem, inputs), _between(problem, inputs, flush),
                spot.before, spot.after)]
    for baseline, base_inputs in paired:
        arms.append(Arm(_launcher(baseline.kernel, problem, base_inputs),
                        _between(problem, base_inputs, flush)))
    return measure_interleaved(
        arms, warmup=bench.warmup, warmup_ms=bench.warmup_ms, min_samples=bench.min_samples,
        max_samples=bench.max_samples, target_rel_iqr=bench.target_rel_iqr,
        max_seconds=bench.max_seconds,
        read_clock=lambda: gpu_mod.sm_clock_mhz(device), read_reasons=lambda: throttle_mask(device),
        throttle_threshold=bench.throttle_threshold,
        short_ms=bench.short_kernel_ms, short_min_samples=bench.short_min_samples,
        kernel_clock=kernel_clock.shared(bench.timer))


def _compiled(prepared: PreparedJob, record: Record, outputs: JobOutputs | None, cache_dir: str):
    kernel = compile_kernel(prepared.spec, cache_dir)
    if kernel.report is not None:
        if outputs is not None:
            outputs.resources = kernel.report
        for key, value in vars(kernel.report).items():
            if hasattr(record, key):
                setattr(record, key, value)
    return kernel


def _free() -> None:
    import cupy as cp

    cp.get_default_memory_pool().free_all_blocks()


def verify_only(prepared: PreparedJob, record: Record, cache_dir: str = DEFAULT_CACHE_DIR) -> float:
    """Compile and verify on fresh inputs, without timing (fills `record`; returns rel_err)."""
    prepared.require_device()
    kernel = _compiled(prepared, record, None, cache_dir)
    inputs = make_inputs(prepared.problem, prepared.bench.seed)
    record.seed = inputs.seed
    record.tolerance = float(prepared.bench.tolerance[prepared.spec.precision])
    try:
        record.rel_err = verify(kernel, prepared.problem, inputs, record.tolerance,
                                prepared.spec.name).rel_err
    finally:
        inputs = None
        _free()
    return record.rel_err


def time_candidate(prepared: PreparedJob, inputs: Inputs, ref, cache_dir: str = DEFAULT_CACHE_DIR
                   ) -> tuple[float, float]:
    """One candidate of a run-time autotune (src/job/autotune.py): compiled, verified on
    `inputs` against `ref`, timed alone with `prepared.bench` (no baseline), and its last timed
    launch checked: (rel_err, median ms). Raises the LabError of the first step it fails."""
    import cupy as cp

    spec, problem = prepared.spec, prepared.problem
    tolerance = float(prepared.bench.tolerance[spec.precision])
    kernel = compile_kernel(spec, cache_dir)
    rel_err = verify(kernel, problem, inputs, tolerance, spec.name, ref=ref).rel_err
    spot = SpotCheck(inputs, problem.beta, prepared.bench.min_samples)
    try:
        result = _time(kernel, prepared, inputs, spot, prepared.require_device(), [])
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise LaunchFailed(f"kernel {spec.name} faulted while being timed: {exc}") from exc
    check(inputs.c, ref, tolerance, spec.name, "verification of the last timed launch",
          TimedVerificationFailed)
    return rel_err, result.timings[0].median_ms


def _paired_inputs(baseline: Baseline | None, problem, inputs: Inputs, ref,
                   refused: list[str] | None = None) -> Inputs | None:
    """The baseline's own C (same A, B, C0), after checking the baseline on them; None (and no
    pairing) when there is no baseline or it fails its own check (why: added to `refused`)."""
    if baseline is None:
        return None
    base_inputs = Inputs(inputs.a, inputs.b, inputs.c0.copy(), inputs.c0, inputs.seed)
    try:
        verify(baseline.kernel, problem, base_inputs, baseline.tolerance, baseline.name, ref=ref)
    except LabError as exc:
        log.warning("baseline %s failed its check, so %s is not paired with it: %s",
                    baseline.name, problem.label, exc)
        if refused is not None:
            refused.append(f"{baseline.name}: {exc.status}: {exc}")
        return None
    return base_inputs


def _checked_peers(paired: list[tuple[Baseline, Inputs]], peers, ref,
                   refused: list[str]) -> list[tuple[int, Baseline]]:
    """(arm index, peer) of the peers whose last timed launch is right: a peer is held to the
    check a kernel is, or left out of the comparison (why: added to `refused`)."""
    kept = []
    for arm, (baseline, base_inputs) in enumerate(paired, start=1):
        if baseline not in peers:
            continue
        try:
            check(base_inputs.c, ref, baseline.tolerance, baseline.name,
                  "verification of the peer's last timed launch", TimedVerificationFailed)
        except TimedVerificationFailed as exc:
            log.warning("peer %s is not compared: %s", baseline.name, exc)
            refused.append(f"{baseline.name}: {exc.status}: {exc}")
            continue
        kept.append((arm, baseline))
    return kept


def _check_timed(name: str, spot: SpotCheck, inputs: Inputs, ref, tolerance: float) -> float:
    """The timed launches' output: the spot-checked sample and the last one (C as it is now)."""
    err = check(spot.snapshot, ref, tolerance, name,
                f"verification of timed sample {spot.index} (C poisoned before it)",
                TimedVerificationFailed).rel_err
    last = check(inputs.c, ref, tolerance, name, "verification of the last timed launch",
                 TimedVerificationFailed).rel_err
    return max(err, last)


def _check_fresh(kernel, prepared: PreparedJob, tolerance: float) -> float:
    """After the timing, one more launch on fresh inputs (a new seed), checked."""
    seed = prepared.bench.seed
    inputs = make_inputs(prepared.problem, None if seed is None else int(seed) + 1)
    try:
        return verify(kernel, prepared.problem, inputs, tolerance, prepared.spec.name,
                      what="verification on fresh inputs after the timed launches",
                      error=TimedVerificationFailed).rel_err
    except TimedVerificationFailed as exc:
        exc.rel_err_field = "rel_err_fresh"
        raise
    finally:
        inputs = None
        _free()


def verify_and_time(prepared: PreparedJob, record: Record, outputs: JobOutputs | None = None,
                    progress=_no_progress, cache_dir: str = DEFAULT_CACHE_DIR,
                    baseline: Baseline | None = None, stronger: Baseline | None = None,
                    peers: tuple[Baseline, ...] = ()) -> float:
    """Compile, verify on fresh inputs, time (interleaved with `baseline`, `stronger`, the
    autotuned cuBLASLt, and `peers`, if given), check the timed output and a fresh-input launch,
    check plausibility: fills `record`, returns GFLOP/s."""
    import cupy as cp

    spec, problem, bench = prepared.spec, prepared.problem, prepared.bench
    device = prepared.require_device()
    kernel = _compiled(prepared, record, outputs, cache_dir)
    inputs = make_inputs(problem, bench.seed)
    faulted: list = []
    record.seed = inputs.seed
    record.tolerance = tolerance = float(bench.tolerance[spec.precision])
    try:
        progress("compiled", record)
        ref = reference(problem, inputs)
        record.rel_err = verify(kernel, problem, inputs, tolerance, spec.name, ref=ref).rel_err
        keep_tuning(record, kernel)  # a Triton peer compiled and autotuned in that first launch
        progress("verified", record)
        refused: list[str] = []
        paired = [(b, i) for b in (baseline, stronger, *peers)
                  if (i := _paired_inputs(b, problem, inputs, ref,
                                          refused if b in peers else None)) is not None]
        spot = SpotCheck(inputs, problem.beta, bench.min_samples)
        result = _time(kernel, prepared, inputs, spot, device, paired)
        cublas_arms = [(arm, b.name) for arm, (b, _) in enumerate(paired, start=1)
                       if b is baseline or b is stronger]
        keep_conditions(record, result)
        cp.cuda.get_current_stream().synchronize()
        record.checked_sample = spot.index
        checks_started = time.perf_counter()
        record.rel_err_timed = _check_timed(spec.name, spot, inputs, ref, tolerance)
        peer_arms = _checked_peers(paired, peers, ref, refused)
        record.check_seconds = time.perf_counter() - checks_started
        if refused:
            record.peers_skipped = (record.peers_skipped or []) + refused
    except cp.cuda.runtime.CUDARuntimeError as exc:
        faulted.append(inputs)
        raise LaunchFailed(f"kernel {spec.name} faulted while being timed: {exc}") from exc
    except LaunchFailed:
        faulted.append(inputs)
        raise
    finally:
        if not faulted:  # a faulted context cannot free memory: its worker exits instead
            inputs = paired = ref = spot = None  # drop the device arrays
            _free()
    checks_started = time.perf_counter()
    record.rel_err_fresh = _check_fresh(kernel, prepared, tolerance)
    record.check_seconds += time.perf_counter() - checks_started
    plausibility.check(spec.name, problem, result.timings[0].median_ms, plausibility_bound(prepared),
                       bench.plausibility_margin or plausibility.DEFAULT_MARGIN,
                       l2_flushed=bench.flush_l2)
    keep_timing(record, result.timings[0], problem.flops)
    record.timer = result.timer
    record.timer_resolution_ns = kernel_clock.RESOLUTION_NS.get(result.timer)
    if cublas_arms and cublas_arms[0][1] == getattr(baseline, "name", None):
        keep_pairing(record, spec.precision, baseline.name, result, problem.flops)
    keep_best(record, cublas_arms, result, problem.flops)
    keep_peer(record, peer_arms, result, problem.flops)
    return record.gflops


def plausibility_bound(prepared: PreparedJob) -> plausibility.Ceiling:
    """The ceiling the job's figure is held to: its precision and math units on its GPU."""
    device = prepared.require_device()
    name = device.get("name") if isinstance(device, dict) else device.name
    return plausibility.ceiling(prepared.spec.precision, prepared.kernel_cfg.get("math"),
                                prepared.target.gpu_spec, plausibility.load_measured(name))


def check_cached(prepared: PreparedJob, record: Record) -> None:
    """Implausible unless a cached record's figure passes what a fresh one must: a cache entry
    edited to `gflops: 999999` is not served as ok."""
    plausibility.check_recorded(
        prepared.spec.name, prepared.problem, record.gflops, record.time_ms_median,
        plausibility_bound(prepared),
        prepared.bench.plausibility_margin or plausibility.DEFAULT_MARGIN,
        l2_flushed=prepared.bench.flush_l2)


def measure(prepared: PreparedJob, baselines, record: Record, outputs: JobOutputs | None = None,
            progress=_no_progress, cache_dir: str = DEFAULT_CACHE_DIR) -> Record:
    """Verify and time a prepared job interleaved with the cuBLAS baseline of its precision (from
    `baselines`, a baselines.Baselines), the ratio and its interval in the record; a dispatching
    job (best_*) also with the peers its config lists (`peers`: the strongest is compared). A
    cuBLAS baseline job is its own baseline: 100% by construction."""
    spec = prepared.spec
    own = spec.backend == "cublas"
    name = PAIRED_BASELINE.get(spec.precision)
    baseline = None if own or name is None else baselines.paired(name, prepared)
    stronger = None
    if prepared.bench.best_cublas and not own and name is not None:
        stronger = baselines.autotuned(spec.precision, prepared)
    peers, skipped = (baselines.peers(prepared.peers, prepared, cache_dir) if prepared.peers
                      else ((), []))
    record.peers_skipped = (skipped + list(prepared.peers_not_built)) or None
    gflops = verify_and_time(prepared, record, outputs, progress, cache_dir, baseline, stronger,
                             tuple(peers))
    progress("timed", record)
    if own:
        keep_ratio(record, spec.precision, spec.name, gflops, 100.0, 100.0, 100.0, "tie")
    peak = prepared.target.gpu_spec.peak_tflops(spec.precision)
    record.pct_of_peak = 100.0 * gflops / (peak * 1e3) if peak else None
    return record
