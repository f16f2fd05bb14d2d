"""GPU-side kernel timestamps (CUPTI's activity API, through NVIDIA's `cupti-python`): the time
each timed sample's kernels ran, read from the GPU's own start and end stamps, in nanoseconds.

Why not only CUDA events: an event pair brackets the launch from the stream's point of view, so
its figure includes the gap between the previous command and the kernel's start, and it is read
at about half a microsecond's resolution. For a 17 µs kernel (cuBLAS TF32 at 1024 on an H100)
that is a few percent, the same size as the margins the lab reports. CUPTI stamps the kernel
itself on the GPU. nvbench (`cuda-bench`) also measures cold-L2 kernels, but with CUDA events
and its own launch loop, which cannot run this lab's untimed work between samples (restoring C,
poisoning one sample to check its output); CUPTI adds timestamps to the loop the lab already
has. When `cupti-python` is missing or CUPTI refuses (another profiler holds it), the timing
step falls back to events and the record says which clock it used (`timer`).

A sample is the kernels between two clock-probe kernels (timing.ClockProbe runs one just before
and one just after each timed launch): the sum of their durations, so a baseline that runs two
kernels (cuBLAS's split-K reduction) or a chapter with a pre-pass is timed whole, while a gap
between its kernels is not counted: such a gap is the host not having enqueued the next launch
yet (a slow Python launch path, e.g. nvmath's), not GPU time. (Timing first start to last end
made chapter 23 at 1024 bimodal, 47 or 32 TFLOP/s from one run to the next, whenever the
autotuned cuBLASLt arm's host overhead let the queue run dry between 23's two kernels.) Kernels
outside a probe pair (warm-up, restoring C, copies for the spot check) are not samples.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

# The timers' resolution, as each record states it (`timer_resolution_ns`; paired.widen widens
# the interval by it): CUPTI stamps kernels with the GPU's global timer, which ticks every 32 ns
# on Hopper; cudaEventElapsedTime is documented at "around 0.5 microseconds".
RESOLUTION_NS = {"cupti": 32.0, "events": 500.0, "cupti+events": 500.0}
PROBE_KERNEL = "sgemm_lab_clock_probe"  # timing.ClockProbe's kernel: the samples' brackets
BUFFER_BYTES = 8 << 20


class KernelClock:
    """Collects CONCURRENT_KERNEL activity records for this process (CUPTI allows one such
    subscriber per process, so there is one KernelClock: `shared()`)."""

    name = "cupti"

    def __init__(self) -> None:
        from cupti import cupti

        self._cupti = cupti
        self._lock = threading.Lock()
        self._records: list[tuple[int, int, bool]] = []  # (start ns, end ns, is a probe)
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)

    @staticmethod
    def _buffer_requested():
        return BUFFER_BYTES, 0  # 0: as many records as fit

    def _buffer_completed(self, activities) -> None:
        kernel = self._cupti.ActivityKind.CONCURRENT_KERNEL
        rows = [(int(a.start), int(a.end), PROBE_KERNEL in str(a.name))
                for a in activities if a.kind == kernel]
        with self._lock:
            self._records.extend(rows)

    def clear(self) -> None:
        """Forget what ran so far (call after a synchronisation, before the first sample)."""
        self._cupti.activity_flush_all(1)
        with self._lock:
            self._records.clear()

    def samples_ms(self, expected: int) -> list[float] | None:
        """The durations of the samples taken since the last call, in launch order, or None
        when CUPTI did not deliver exactly `expected` bracketed samples (the caller then keeps
        its event times for this batch). The stream must be synchronised first."""
        self._cupti.activity_flush_all(1)
        with self._lock:
            records, self._records = sorted(self._records), []
        return bracketed_spans_ms(records, expected)


def bracketed_spans_ms(records: list[tuple[int, int, bool]], expected: int) -> list[float] | None:
    """Samples between probe pairs: records are (start ns, end ns, is_probe) sorted by start;
    each sample is the summed durations of the kernels between an opening and a closing probe
    (one stream: they never overlap, so the sum is their GPU time without the gaps)."""
    spans: list[float] = []
    inside, total, kernels = False, 0, 0
    for start, end, is_probe in records:
        if is_probe:
            if inside:
                if kernels == 0:
                    return None  # a bracket with no kernel in it: records were lost
                spans.append(total / 1e6)
            inside, total, kernels = not inside, 0, 0
        elif inside:
            total += end - start
            kernels += 1
    if inside or len(spans) != expected:
        return None
    return spans


_shared: KernelClock | None = None
_unavailable: str | None = None


def shared(timer: str) -> KernelClock | None:
    """This process's CUPTI clock when `timer` is "cupti" and CUPTI works here; None (timing
    with CUDA events) otherwise, with one warning per process saying why."""
    global _shared, _unavailable
    if timer != "cupti":
        return None
    if _shared is None and _unavailable is None:
        try:
            _shared = KernelClock()
        except Exception as exc:  # ImportError, or CUPTI refusing (another subscriber)
            _unavailable = f"{type(exc).__name__}: {exc}"
            log.warning("CUPTI kernel timestamps are not available (%s): timing with CUDA "
                        "events", _unavailable)
    return _shared
