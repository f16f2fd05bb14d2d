"""Timing step: each launch timed after warm-up, with the L2 flushed in between, by the kernels'
own GPU timestamps (CUPTI, kernel_clock.py) or, as the fallback, CUDA events around the launch.

cupyx.profiler.benchmark times with CUDA events too, but it cannot run untimed work between
samples (the L2 flush, restoring C when beta != 0) or stop adaptively, so this loop adds just
that: at least `min_samples` samples, more until IQR / median < `target_rel_iqr`, or until
`max_seconds` or `max_samples` is reached. Samples are taken in batches between
synchronisations so the host never stalls the GPU on every launch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from src.errors import LabError


class Throttled(LabError):
    status = "failed_throttled"


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    samples: int
    sm_clock_mhz_before: int | None
    sm_clock_mhz_after: int | None
    samples_throttled: int = 0
    sample_clock_mhz: tuple[float, ...] = ()   # the SM clock during each kept sample

    @property
    def rel_iqr(self) -> float:
        return self.iqr_ms / self.median_ms


def summarize(times_ms, clock_before=None, clock_after=None, clocks_mhz=None,
              throttled: int = 0) -> Timing:
    t = np.asarray(times_ms, dtype=np.float64)
    q1, q3 = np.percentile(t, [25, 75])
    return Timing(
        median_ms=float(np.median(t)), min_ms=float(t.min()), max_ms=float(t.max()),
        iqr_ms=float(q3 - q1), samples=int(t.size),
        sm_clock_mhz_before=clock_before, sm_clock_mhz_after=clock_after,
        samples_throttled=throttled,
        sample_clock_mhz=tuple(round(float(c), 1) for c in clocks_mhz) if clocks_mhz is not None else (),
    )


@dataclass(frozen=True)
class Rounds:
    """Which timed rounds count, and the card's state in them (select_rounds)."""

    kept: tuple[int, ...]                # round indices every statistic uses
    slowdown: int                        # rounds left out: NVML reported a thermal/hardware slowdown
    slow_clock: int                      # rounds left out: an arm's SM clock below its floor
    sustained_mhz: tuple[float | None, ...]  # per arm, the clock the card held under its load
    floor_mhz: tuple[float | None, ...]  # per arm, throttle_threshold x its sustained clock
    power_capped_share: float | None     # share of kept rounds with sw_power_cap (None: unknown)
    clock_range_mhz: tuple[float, float] | None  # min and max SM clock over the kept samples


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and np.isfinite(v)]


def select_rounds(clocks: list[list[float]], reasons: list[int | None],
                  threshold: float | None) -> Rounds:
    """The rounds that count. `clocks[a][i]`: arm a's SM clock in round i (ClockProbe);
    `reasons[i]`: the NVML clock-event reasons seen around round i (None: unknown).

    A round is left out when NVML reports a thermal or hardware slowdown in it
    (protocol.SLOWDOWN), or when an arm's clock is below `threshold` x the clock the card
    sustained under that arm's load in this run: the median of the arm's clocks over the rounds
    without a slowdown (per arm: a light kernel runs at a higher clock than the heavy cuBLAS it
    is paired with). Why that reference and not the maximum clock: a heavy tensor-core job on
    an H100 holds its power limit at 1,260-1,500 MHz of 1,980 by design (sw_power_cap), so a
    rule against the maximum failed whole jobs at random; the kernel and its baseline share
    each round's conditions, so their ratio is meaningful at that clock. The power cap is
    recorded (`power_capped_share`), never a reason to leave a round out. A missing clock
    (no probe: inf or None) sets no floor; a probe that read nothing (NaN) leaves its round out."""
    from src.job.protocol import POWER_CAP, SLOWDOWN

    count = len(clocks[0]) if clocks else 0
    calm = [i for i in range(count) if not (reasons[i] or 0) & SLOWDOWN]
    sustained = tuple(float(np.median(seen)) if (seen := _finite(c[i] for i in calm)) else None
                      for c in clocks)
    floors = tuple(None if threshold is None or s is None else threshold * s for s in sustained)
    kept = [i for i in calm
            if all(floor is None or c[i] >= floor for c, floor in zip(clocks, floors))]
    known = [reasons[i] for i in kept if reasons[i] is not None]
    in_kept = _finite(c[i] for c in clocks for i in kept)
    return Rounds(
        kept=tuple(kept), slowdown=count - len(calm), slow_clock=len(calm) - len(kept),
        sustained_mhz=sustained, floor_mhz=floors,
        power_capped_share=(sum(bool(r & POWER_CAP) for r in known) / len(known)
                            if known and len(known) == len(kept) else None),
        clock_range_mhz=(min(in_kept), max(in_kept)) if in_kept else None)


_PROBE_SOURCE = r"""
extern "C" __global__ void sgemm_lab_clock_probe(unsigned long long* out, int slot) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    out[2 * slot] = ns;
    out[2 * slot + 1] = (unsigned long long)clock64();
}
"""


class ClockProbe:
    """The SM clock during each sample: (cycles after - before) / (ns after - before)."""

    def __init__(self, batch: int):
        import cupy as cp

        self._kernel = cp.RawKernel(_PROBE_SOURCE, "sgemm_lab_clock_probe")
        self._stamps = cp.zeros(4 * batch, dtype=cp.uint64)

    def before(self, i: int) -> None:
        import numpy as np

        self._kernel((1,), (1,), (self._stamps, np.int32(2 * i)))

    def after(self, i: int) -> None:
        import numpy as np

        self._kernel((1,), (1,), (self._stamps, np.int32(2 * i + 1)))

    def read(self, count: int) -> list[float]:
        s = self._stamps[: 4 * count].get().astype(np.int64).reshape(count, 2, 2)
        ns = s[:, 1, 0] - s[:, 0, 0]
        cycles = s[:, 1, 1] - s[:, 0, 1]
        return [float(c) / float(n) * 1e3 if n > 0 else float("nan") for n, c in zip(ns, cycles)]


class L2Flush:
    """Overwrites a buffer twice the L2 size, so each timed launch starts with a cold L2."""

    def __init__(self, l2_bytes: int):
        import cupy as cp

        self.nbytes = max(2 * l2_bytes, 8 << 20)
        self.buffer = cp.empty(self.nbytes, dtype=cp.uint8)
        self._value = 0

    def __call__(self) -> None:
        import cupy as cp

        self._value ^= 0x5A  # alternate the pattern so no write can be elided
        cp.cuda.runtime.memsetAsync(self.buffer.data.ptr, self._value, self.nbytes,
                                    cp.cuda.get_current_stream().ptr)


@dataclass
class Arm:
    """One side of an interleaved measurement: its launch and the untimed work before each
    sample. `before(i)` / `after(i)` get the sample's index (the spot check of the timed output
    uses them); `before` runs ahead of the L2 flush, so what it touches is evicted again."""

    launch: Callable[[], None]
    between: Callable[[], None] | None = None
    before: Callable[[int], None] | None = None
    after: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Interleaved:
    timings: tuple[Timing, ...]        # one per arm, over the kept rounds
    kept_ms: tuple[tuple[float, ...], ...]  # per arm, the kept samples; index i is one round
    timer: str = "events"              # the clock of the samples: "cupti" (kernel_clock.py) or
                                       # "events" (CUDA events; also for a batch CUPTI missed)
    rounds: Rounds | None = None       # which rounds were kept, and the card's state in them
    reasons_seen: int | None = None    # every NVML clock-event reason bit seen while timing


def _sample_round(arms, pools, probes, i: int, index: int) -> None:
    for arm, pool, probe in zip(arms, pools, probes):
        if arm.before:
            arm.before(index)
        if arm.between:
            arm.between()
        start, stop = pool[i]
        probe.before(i)
        start.record()
        arm.launch()
        stop.record()
        probe.after(i)
        if arm.after:
            arm.after(index)


def warm_up(arms: list[Arm], warmup: int, warmup_ms: float = 0.0) -> int:
    """Untimed rounds of every arm (each after its `between`, as when timed): `warmup` rounds,
    then more until `warmup_ms` of wall time has passed since the first. Returns the rounds run.

    Why a time and not only a count: a heavy job runs its first launches at the boost clock and
    only then meets the card's power limit. On an H100 (700 W), cuBLAS TF32 at 8192 launched
    back to back from idle ran at 1,667 MHz for the first 0.2-0.3 s; from then on the power cap
    held it between 1,260 and 1,500 MHz (benchmarks/clock_settle.py). With 3 launches of
    warm-up, whether a job's samples fell in the boost phase depended on how soon its IQR
    settled: that row read 412.9 TFLOP/s in one `dvc repro -f` and 394.9 in the next (median
    SM clock 1,652 against 1,569 MHz). Timed after the boost phase (500 ms by default), it is
    timed at the clock the card holds under that load, whatever ran before (with a 1 s warm-up,
    after an idle and after a hot card: the same within 0.1%).
    Rounds are enqueued in growing batches, so the GPU never idles between them while the host
    checks the time."""
    import cupy as cp

    if warmup <= 0 and warmup_ms <= 0:
        return 0
    stream = cp.cuda.get_current_stream()
    started = time.perf_counter()
    rounds, batch = 0, max(warmup, 1)
    while True:
        for _ in range(batch):
            for arm in arms:
                if arm.between:
                    arm.between()
                arm.launch()
        rounds += batch
        stream.synchronize()
        if rounds >= warmup and (time.perf_counter() - started) * 1e3 >= warmup_ms:
            return rounds
        batch = min(2 * batch, 64)


def _union(*masks: int | None) -> int | None:
    known = [m for m in masks if m is not None]
    return None if not known else int(np.bitwise_or.reduce(known))


def throttled_error(rounds: Rounds, taken: int, min_samples: int, threshold: float | None,
                    reasons_seen: int | None) -> Throttled:
    """The one paragraph of a job whose GPU was not in a state to measure."""
    from src.job.protocol import SLOWDOWN, reason_names

    seen = reason_names((reasons_seen or 0) & SLOWDOWN)
    arms = [f"{s:.0f} MHz (floor {f:.0f})" if f is not None else f"{s:.0f} MHz"
            for s, f in zip(rounds.sustained_mhz, rounds.floor_mhz) if s is not None]
    clock = f"sustained SM clock per arm {', '.join(arms)}" if arms else "no SM clock was read"
    return Throttled(
        f"only {len(rounds.kept)} of {taken} timed rounds are usable, fewer than "
        f"bench.min_samples={min_samples} (rule: a job needs at least min_samples rounds, within "
        f"2 x min_samples taken once bench.max_seconds has passed, in which "
        f"NVML reports no thermal or hardware slowdown and every arm's SM clock is at least "
        f"bench.throttle_threshold={threshold} x the clock the card sustained under that arm's "
        f"load in this run; the power cap is the card's normal state under load and never fails a job): "
        f"{rounds.slowdown} rounds left out for a slowdown "
        f"({', '.join(seen) or 'none reported'}), {rounds.slow_clock} for a clock below the "
        f"floor ({clock}). The GPU is not in a state to measure: it is overheating, its board "
        f"is slowing it down, or another process shares it; check nvidia-smi -q -d PERFORMANCE.")


def measure_interleaved(arms: list[Arm], *, warmup: int, min_samples: int, max_samples: int,
                        target_rel_iqr: float, max_seconds: float, warmup_ms: float = 0.0,
                        read_clock: Callable[[], int | None] = lambda: None,
                        read_reasons: Callable[[], int | None] = lambda: None,
                        throttle_threshold: float | None = None,
                        short_ms: float | None = None,
                        short_min_samples: int | None = None,
                        kernel_clock=None) -> Interleaved:
    """Time the arms in rounds, A B A B ...: each round takes one sample of every arm, each
    after its own `between` (the L2 flush). Which rounds count: select_rounds, with the NVML
    reasons (`read_reasons`, a bit mask) read at each batch's edges standing for every round of
    the batch. Stops once `min_samples` rounds are kept and every arm's IQR / median is at most
    `target_rel_iqr`, or at `max_seconds` / `max_samples`. Short of `min_samples` kept rounds at
    `max_seconds`, it goes on to 2 x `min_samples` rounds taken (a heavy job's 10 rounds fill
    0.6 s, and one round under the clock floor must not fail it); fewer kept then is
    failed_throttled (throttled_error): the GPU was unusable in more than half its rounds. A first arm shorter than `short_ms` takes at
    least `short_min_samples` rounds (short kernels: more samples).
    `kernel_clock` (kernel_clock.KernelClock): samples are the kernels' GPU timestamps instead of
    the event pairs around them. `warmup_ms`: see warm_up."""
    import cupy as cp

    warm_up(arms, warmup, warmup_ms)
    if kernel_clock is not None:
        kernel_clock.clear()  # the warm-up launches are not samples
    event_batches = 0

    batch = max(1, min(min_samples, max_samples))
    pools = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in range(batch)] for _ in arms]
    probes = [ClockProbe(batch) for _ in arms]
    times: list[list[float]] = [[] for _ in arms]
    clocks: list[list[float]] = [[] for _ in arms]
    reasons: list[int | None] = []
    taken, need = 0, min_samples
    clock_before = read_clock()
    edge = seen = read_reasons()
    started = time.perf_counter()
    while taken < max_samples:
        todo = min(batch, max_samples - taken)
        for i in range(todo):
            _sample_round(arms, pools, probes, i, taken + i)
        pools[-1][todo - 1][1].synchronize()
        taken += todo
        now = read_reasons()
        reasons.extend([_union(edge, now)] * todo)
        edge, seen = now, _union(seen, now)
        stamped = kernel_clock.samples_ms(todo * len(arms)) if kernel_clock is not None else None
        event_batches += stamped is None
        for a in range(len(arms)):
            if stamped is not None:  # round i, arm a is the (i * arms + a)-th bracketed sample
                times[a].extend(stamped[a::len(arms)])
            else:
                times[a].extend(cp.cuda.get_elapsed_time(s, e) for s, e in pools[a][:todo])
            clocks[a].extend(probes[a].read(todo))
        kept = select_rounds(clocks, reasons, throttle_threshold).kept
        if short_ms is not None and short_min_samples and kept \
                and float(np.median([times[0][i] for i in kept])) < short_ms:
            need = max(min_samples, min(short_min_samples, max_samples))
        out_of_time = time.perf_counter() - started >= max_seconds
        if len(kept) >= need:
            settled = all(summarize([t[i] for i in kept]).rel_iqr <= target_rel_iqr for t in times)
            if settled or out_of_time:
                break
        elif out_of_time and taken >= min(max_samples, 2 * min_samples):
            break  # too few usable rounds in twice the rounds needed: failed below
    rounds = select_rounds(clocks, reasons, throttle_threshold)
    kept = rounds.kept
    if len(kept) < min_samples:
        raise throttled_error(rounds, taken, min_samples, throttle_threshold, seen)
    clock_after = read_clock()
    timings = tuple(summarize([t[i] for i in kept], clock_before, clock_after,
                              [c[i] for i in kept], taken - len(kept))
                    for t, c in zip(times, clocks))
    batches = -(-taken // batch)
    timer = ("events" if kernel_clock is None or event_batches == batches else
             "cupti" if event_batches == 0 else "cupti+events")
    return Interleaved(timings, tuple(tuple(t[i] for i in kept) for t in times), timer,
                       rounds, seen)


def measure(launch: Callable[[], None], *, warmup: int, min_samples: int, max_samples: int,
            target_rel_iqr: float, max_seconds: float,
            between: Callable[[], None] | None = None,
            read_clock: Callable[[], int | None] = lambda: None,
            throttle_threshold: float | None = None) -> Timing:
    """Time `launch` (one kernel launch on the current stream) alone: measure_interleaved with
    one arm. `between` runs untimed before every sample (L2 flush, input restore)."""
    return measure_interleaved(
        [Arm(launch, between)], warmup=warmup, min_samples=min_samples, max_samples=max_samples,
        target_rel_iqr=target_rel_iqr, max_seconds=max_seconds, read_clock=read_clock,
        throttle_threshold=throttle_threshold).timings[0]
