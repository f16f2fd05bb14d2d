"""Verdicts on a ratio to a baseline: faster or slower only when the 95% interval excludes 1.0,
else a tie; a row measured in several independent runs is faster or slower only when every
run's interval says so. Below both the timing (src/job/paired.py, which computes the intervals)
and the published rows (src/records/replicates.py, which combines runs)."""

from __future__ import annotations

FASTER, SLOWER, TIE = "faster", "slower", "tie"


def verdict(ci_low: float, ci_high: float) -> str:
    """faster / slower only when the interval excludes 1.0 (the tie rule)."""
    if ci_low > 1.0:
        return FASTER
    if ci_high < 1.0:
        return SLOWER
    return TIE


def replicated_verdict(intervals) -> str:
    """A row measured in several independent runs: faster / slower only when every run's
    interval (low, high) is on that side of 1.0; otherwise a tie (the runs disagree, or one of
    them could not tell)."""
    verdicts = {verdict(low, high) for low, high in intervals}
    return verdicts.pop() if len(verdicts) == 1 else TIE
