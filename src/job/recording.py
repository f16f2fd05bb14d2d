"""Record step of a timed job: the interleaved timing's figures into the job's record (its own
timing, the card's conditions, the ratio to the paired cuBLAS, to the stronger cuBLAS and to the
strongest peer, each with its interval widened by the timer's resolution). measure.py times;
this module only writes what the timing says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from src.job import kernel_clock
from src.job.paired import paired_ratio, widen
from src.job.protocol import reason_names
from src.job.timing import Interleaved, Timing
from src.records.record import Record


@dataclass(frozen=True)
class Tuning:
    """A peer's setup at one shape, as its record keeps it (peer_compile_s, peer_config,
    peer_setup_reused): the wall seconds of its build or compile + autotune (all before timing),
    the config it chose, and whether that setup was read from the cache_dir, done by another
    process (another GPU's slot, an earlier sweep) whose seconds these are. Triton's and
    CUTLASS's launchers set it as their `tuning`."""

    seconds: float
    config: str | None
    reused: bool = False


def keep_timing(record: Record, timing: Timing, flops: int) -> None:
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


def keep_conditions(record: Record, result: Interleaved) -> None:
    """The card's state while timing (timing.select_rounds): conditions, not failures."""
    rounds = result.rounds
    record.throttle_reasons = None if result.reasons_seen is None else reason_names(result.reasons_seen)
    if rounds is not None:
        record.samples_slowdown = rounds.slowdown
        record.sustained_clock_mhz = list(rounds.sustained_mhz)
        record.clock_range_mhz = None if rounds.clock_range_mhz is None else list(rounds.clock_range_mhz)
        record.power_capped_share = rounds.power_capped_share


def _widened(result: Interleaved, arm: int):
    """The kernel's ratio to arm `arm`, its interval widened by the timer's resolution."""
    resolution_ms = kernel_clock.RESOLUTION_NS.get(result.timer, 0.0) * 1e-6
    return widen(paired_ratio(result.kept_ms[0], result.kept_ms[arm]), resolution_ms,
                 result.timings[0].median_ms, result.timings[arm].median_ms)


def keep_pairing(record: Record, precision: str, baseline: str, result: Interleaved,
                  flops: int) -> None:
    """The paired comparison: the baseline's GFLOP/s from the same rounds, the ratio of the
    medians (so % == gflops / baseline_gflops exactly) and its bootstrap 95% interval."""
    ratio = _widened(result, 1)
    base_gflops = flops / (result.timings[1].median_ms * 1e-3) / 1e9
    keep_ratio(record, precision, baseline, base_gflops, 100 * ratio.ratio,
                100 * ratio.ci_low, 100 * ratio.ci_high, ratio.verdict)
    record.baseline_time_ms = list(result.kept_ms[1])
    record.kernel_time_ms = list(result.kept_ms[0])


def _strongest(arms: list[tuple[int, str]], result: Interleaved) -> tuple[int, str]:
    """(arm, name) of the arm with the shortest median in these rounds."""
    return min(arms, key=lambda arm: result.timings[arm[0]].median_ms)


def keep_best(record: Record, arms: list[tuple[int, str]], result: Interleaved,
               flops: int) -> None:
    """Against the stronger of the paired cuBLAS arms ((arm index, name): cuBLAS's default
    heuristic and the autotuned cuBLASLt): the one with the shorter median in these rounds."""
    if not arms:
        return
    for arm, name in arms:
        if "cublaslt" in name:
            record.cublaslt_gflops = flops / (result.timings[arm].median_ms * 1e-3) / 1e9
    best, name = _strongest(arms, result)
    ratio = _widened(result, best)
    record.best_cublas = name
    record.pct_of_best_cublas = 100 * ratio.ratio
    record.pct_best_ci_low, record.pct_best_ci_high = 100 * ratio.ci_low, 100 * ratio.ci_high
    record.verdict_best = ratio.verdict


def keep_peer(record: Record, arms: list[tuple[int, Any]], result: Interleaved,
              flops: int) -> None:
    """Against the strongest peer ((arm index, measure.Baseline)) timed in the same rounds, with its
    paired interval, and that peer's compile + autotune (a Triton peer's `tuning`)."""
    if not arms:
        return
    best, name = _strongest([(arm, peer.name) for arm, peer in arms], result)
    ratio = _widened(result, best)
    record.peer_name = name
    record.peer_gflops = flops / (result.timings[best].median_ms * 1e-3) / 1e9
    record.pct_of_peer = 100 * ratio.ratio
    record.pct_peer_ci_low, record.pct_peer_ci_high = 100 * ratio.ci_low, 100 * ratio.ci_high
    record.verdict_peer = ratio.verdict
    keep_tuning(record, dict(arms)[best].kernel)


def keep_tuning(record: Record, kernel) -> None:
    """A peer's build or compile + autotune at this shape (src/job/triton_gemm.py,
    cutlass_gemm.py), if any."""
    tuning = getattr(kernel, "tuning", None)  # only the peers set up at their first launch
    if tuning is not None:
        record.peer_compile_s, record.peer_config = tuning.seconds, tuning.config
        record.peer_setup_reused = tuning.reused


def keep_ratio(record, precision, baseline, base_gflops, pct, low, high, verdict) -> None:
    record.baseline, record.baseline_gflops = baseline, base_gflops
    record.pct_of_cublas, record.pct_ci_low, record.pct_ci_high = pct, low, high
    record.verdict = verdict
    setattr(record, f"cublas_{precision}_gflops", base_gflops)
    setattr(record, f"pct_of_cublas_{precision}", pct)
