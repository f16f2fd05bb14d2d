"""Paired comparison: a kernel and its baseline timed interleaved (A B A B ..., the L2 flushed
before each launch), so drift in clocks, temperature or neighbours hits both alike.

The published ratio is the ratio of the two medians, median(baseline ms) / median(kernel ms), so
that the % column is exactly the kernel's GFLOP/s over the paired baseline GFLOP/s shown beside
it. Its 95% confidence interval comes from a bootstrap over the pairs (one resampled index picks
both samples of a pair, keeping the pairing), with a fixed RNG seed so the same samples always
give the same interval. A kernel is called faster or slower only when the interval excludes 1.0;
otherwise the two are a tie (src/records/verdicts.py, which also combines several runs' verdicts).
The interval is widened by the timer's resolution (widen).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from src.records.verdicts import verdict

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240518  # fixed: the interval is a function of the samples alone
CONFIDENCE = 0.95



@dataclass(frozen=True)
class PairedRatio:
    ratio: float      # kernel speed / baseline speed = median(baseline ms) / median(kernel ms)
    ci_low: float
    ci_high: float
    pairs: int

    @property
    def verdict(self) -> str:
        return verdict(self.ci_low, self.ci_high)


def paired_ratio(kernel_ms, baseline_ms, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> PairedRatio:
    """The speed ratio of a kernel to its baseline from paired samples (same length, sample i
    of each taken back to back), with a bootstrap 95% interval over the pairs."""
    k = np.asarray(kernel_ms, dtype=np.float64)
    b = np.asarray(baseline_ms, dtype=np.float64)
    if k.shape != b.shape or k.ndim != 1 or k.size == 0:
        raise ValueError(f"paired samples must be two non-empty lists of one length "
                         f"(got {k.shape} and {b.shape})")
    ratio = float(np.median(b) / np.median(k))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k.size, size=(resamples, k.size))
    boot = np.median(b[idx], axis=1) / np.median(k[idx], axis=1)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return PairedRatio(ratio=ratio, ci_low=float(min(low, ratio)), ci_high=float(max(high, ratio)),
                       pairs=int(k.size))


def widen(ratio: PairedRatio, resolution_ms: float, kernel_median_ms: float,
          baseline_median_ms: float) -> PairedRatio:
    """The interval widened for the timer's ticks: a median read on a clock of resolution r is
    off by up to r, so the ratio of two medians by up to r/kernel + r/baseline, relatively; the
    interval grows by that on each side. It matters only for short kernels: 32 ns (CUPTI) on a
    17 us kernel and its baseline is 0.4%, CUDA events' 0.5 us is 6%; on a 1 ms kernel 0.01%."""
    if not resolution_ms or kernel_median_ms <= 0 or baseline_median_ms <= 0:
        return ratio
    q = resolution_ms / kernel_median_ms + resolution_ms / baseline_median_ms
    return replace(ratio, ci_low=ratio.ci_low * (1 - q), ci_high=ratio.ci_high * (1 + q))
