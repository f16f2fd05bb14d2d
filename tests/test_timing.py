"""Throttled samples (src/job/timing.py): which are left out, and what the timing says about them."""

from __future__ import annotations

from src.job.timing import keep_unthrottled, summarize


def test_samples_below_the_clock_floor_are_left_out_and_counted():
    times = [1.0, 1.1, 2.5, 1.05, 3.0]
    clocks = [1980.0, 1975.0, 990.0, 1960.0, 1200.0]
    kept, kept_clocks, flagged = keep_unthrottled(times, clocks, 0.75 * 1980)
    assert kept == [1.0, 1.1, 1.05] and kept_clocks == [1980.0, 1975.0, 1960.0] and flagged == 2
    timing = summarize(kept, 1980, 1965, kept_clocks, flagged)
    assert timing.samples == 3 and timing.samples_throttled == 2
    assert timing.median_ms == 1.05 and timing.max_ms == 1.1  # the slow throttled ones are gone
    assert timing.sample_clock_mhz == (1980.0, 1975.0, 1960.0)


def test_without_a_floor_nothing_is_flagged():
    kept, clocks, flagged = keep_unthrottled([1.0, 2.0], [100.0, 2000.0], None)
    assert kept == [1.0, 2.0] and flagged == 0


def test_warm_up_runs_its_count_then_until_its_time_has_passed(monkeypatch):
    """bench.warmup launches at least; with bench.warmup_ms, more rounds (every arm, each after
    its `between`) until that much wall time has passed, so a power-limited job is timed at the
    clock it settles at (timing.warm_up says why)."""
    import time

    from src.job.timing import Arm, warm_up
    from tests import fake_cupy

    fake_cupy.install(monkeypatch)
    calls = []
    arms = [Arm(lambda: (calls.append("a"), time.sleep(0.002))), Arm(lambda: calls.append("b"),
                                                                       lambda: calls.append("flush"))]
    assert warm_up(arms, 3, 0.0) == 3 and calls == ["a", "flush", "b"] * 3
    calls.clear()
    started = time.perf_counter()
    rounds = warm_up(arms, 3, 60.0)
    assert time.perf_counter() - started >= 0.060
    assert rounds > 3 and calls == ["a", "flush", "b"] * rounds
    calls.clear()
    assert warm_up(arms, 0, 0.0) == 0 and calls == []  # no warm-up asked for: none
