"""Timing step: CUDA events around each launch, after warm-up, with the L2 flushed in between.

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


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    samples: int
    sm_clock_mhz_before: int | None
    sm_clock_mhz_after: int | None

    @property
    def rel_iqr(self) -> float:
        return self.iqr_ms / self.median_ms


def summarize(times_ms, clock_before=None, clock_after=None) -> Timing:
    t = np.asarray(times_ms, dtype=np.float64)
    q1, q3 = np.percentile(t, [25, 75])
    return Timing(
        median_ms=float(np.median(t)), min_ms=float(t.min()), max_ms=float(t.max()),
        iqr_ms=float(q3 - q1), samples=int(t.size),
        sm_clock_mhz_before=clock_before, sm_clock_mhz_after=clock_after,
    )


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


def measure(launch: Callable[[], None], *, warmup: int, min_samples: int, max_samples: int,
            target_rel_iqr: float, max_seconds: float,
            between: Callable[[], None] | None = None,
            read_clock: Callable[[], int | None] = lambda: None) -> Timing:
    """Time `launch` (one kernel launch on the current stream). `between` runs untimed before
    every sample (L2 flush, input restore)."""
    import cupy as cp

    for _ in range(max(warmup, 0)):
        if between:
            between()
        launch()
    cp.cuda.get_current_stream().synchronize()

    batch = max(1, min(min_samples, max_samples))
    pool = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(batch)]
    times: list[float] = []
    clock_before = read_clock()
    started = time.perf_counter()
    while len(times) < max_samples:
        todo = min(batch, max_samples - len(times))
        for start, stop in pool[:todo]:
            if between:
                between()
            start.record()
            launch()
            stop.record()
        pool[todo - 1][1].synchronize()
        times.extend(cp.cuda.get_elapsed_time(s, e) for s, e in pool[:todo])
        if len(times) >= min_samples:
            t = summarize(times)
            if t.rel_iqr <= target_rel_iqr or time.perf_counter() - started >= max_seconds:
                break
    return summarize(times, clock_before, read_clock())
