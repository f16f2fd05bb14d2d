"""The paired comparison's statistics (src/job/paired.py) on CPU: the ratio, its bootstrap
interval and the tie rule, on samples shaped like real timings (a few % of noise and drift)."""

from __future__ import annotations

import numpy as np
import pytest

from src.job.paired import paired_ratio
from src.records.verdicts import FASTER, SLOWER, TIE, verdict


def _timings(n: int, median_ms: float, noise: float, seed: int, drift=None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = median_ms * (1 + noise * rng.standard_normal(n))
    return t * drift if drift is not None else t


def test_ratio_is_the_ratio_of_medians_so_pct_equals_the_published_rows():
    kernel = [1.0, 1.2, 0.9, 1.1, 1.05]
    baseline = [2.0, 2.1, 1.9, 2.4, 2.2]
    r = paired_ratio(kernel, baseline)
    # published: kernel GFLOP/s = F / median(kernel), baseline GFLOP/s = F / median(baseline)
    assert r.ratio == pytest.approx((1 / np.median(kernel)) / (1 / np.median(baseline)), rel=1e-12)
    assert r.ci_low <= r.ratio <= r.ci_high and r.pairs == 5


def test_same_kernel_against_itself_is_a_tie_with_an_interval_around_one():
    a = _timings(200, 0.017, 0.03, seed=1)
    b = _timings(200, 0.017, 0.03, seed=2)
    r = paired_ratio(a, b)
    assert r.verdict == TIE and r.ci_low < 1.0 < r.ci_high
    assert r.ci_high - r.ci_low < 0.03  # 200 pairs at 3% noise: an interval of a few per cent


def test_a_clear_difference_is_faster_or_slower():
    fast = _timings(100, 0.95, 0.01, seed=3)
    slow = _timings(100, 1.00, 0.01, seed=4)
    assert paired_ratio(fast, slow).verdict == FASTER   # 5% faster than its baseline
    assert paired_ratio(slow, fast).verdict == SLOWER


@pytest.mark.parametrize("pairs", [20, 100])
def test_equal_kernels_are_called_a_tie_about_95_percent_of_the_time(pairs):
    """The interval's coverage: two sides with the same true speed are a tie in at least 90% of
    200 independent comparisons (a 95% interval; the bootstrap of a median covers a little
    less than its nominal level on small samples), and not in all of them (not too wide)."""
    ties = sum(paired_ratio(_timings(pairs, 1.0, 0.03, seed=s),
                            _timings(pairs, 1.0, 0.03, seed=1000 + s)).verdict == TIE
               for s in range(200))
    assert 0.90 * 200 <= ties < 200


def test_the_interval_is_reproducible_and_narrows_with_more_pairs():
    a, b = _timings(300, 1.0, 0.02, seed=7), _timings(300, 1.02, 0.02, seed=8)
    assert paired_ratio(a, b) == paired_ratio(a, b)  # fixed bootstrap seed
    wide = paired_ratio(a[:20], b[:20])
    narrow = paired_ratio(a, b)
    assert narrow.ci_high - narrow.ci_low < wide.ci_high - wide.ci_low


def test_pairing_cancels_drift_that_both_sides_share():
    """A clock that drifts by 20% over the run moves both sides of each pair alike: the ratio
    stays where it is, with an interval as narrow as without drift."""
    drift = np.linspace(1.0, 1.2, 200)
    a = _timings(200, 0.90, 0.005, seed=9, drift=drift)
    b = _timings(200, 1.00, 0.005, seed=10, drift=drift)
    r = paired_ratio(a, b)
    assert r.ratio == pytest.approx(1 / 0.9, rel=0.01)
    assert r.verdict == FASTER


@pytest.mark.parametrize("low,high,expected", [(1.01, 1.05, FASTER), (0.90, 0.99, SLOWER),
                                               (0.99, 1.01, TIE), (1.0, 1.02, TIE)])
def test_tie_rule(low, high, expected):
    assert verdict(low, high) == expected


def test_unpaired_samples_are_refused():
    with pytest.raises(ValueError, match="one length"):
        paired_ratio([1.0, 2.0], [1.0])


def test_the_interval_is_widened_by_the_timer_resolution_for_short_kernels():
    """A 17 us kernel 1.8% faster than its baseline, 0.05% noise: CUPTI's 32 ns ticks leave it
    faster; CUDA events' 0.5 us (6% of the pair) make it a tie. On a 2 ms kernel either timer
    moves the interval by at most 0.05%."""
    from src.job.paired import widen

    k, b = _timings(300, 0.0170, 0.0005, seed=11), _timings(300, 0.0173, 0.0005, seed=12)
    r = paired_ratio(k, b)
    assert r.verdict == FASTER
    cupti = widen(r, 32e-6, float(np.median(k)), float(np.median(b)))
    events = widen(r, 500e-6, float(np.median(k)), float(np.median(b)))
    assert cupti.verdict == FASTER and events.verdict == TIE
    assert cupti.ci_low < r.ci_low and cupti.ci_high > r.ci_high and cupti.ratio == r.ratio
    assert events.ci_low == pytest.approx(r.ci_low * (1 - 500e-6 / np.median(k) - 500e-6 / np.median(b)))
    long = widen(r, 500e-6, 2.0, 2.0)
    assert long.ci_low == pytest.approx(r.ci_low, rel=6e-4)


@pytest.mark.parametrize("intervals,expected", [
    ([(1.063, 1.070)], FASTER),                          # one run (the table marks it)
    ([(1.063, 1.070), (1.01, 1.02)], FASTER),            # every run above 100%
    ([(0.90, 0.95), (0.97, 0.99), (0.95, 0.96)], SLOWER),
    ([(1.063, 1.070), (0.976, 0.980)], TIE),             # chapter 20 at 1024 on two H100s
    ([(1.01, 1.02), (0.99, 1.01)], TIE),                 # one run could not tell
])
def test_a_replicated_verdict_needs_every_run_on_the_same_side(intervals, expected):
    from src.records.verdicts import replicated_verdict

    assert replicated_verdict(intervals) == expected
