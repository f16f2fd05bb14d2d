"""Throttled samples (src/job/timing.py): which are left out, and what the timing says about them."""

from __future__ import annotations

import numpy as np
import pytest

from src.job.protocol import POWER_CAP, SLOWDOWN, reason_names
from src.job.timing import Throttled, select_rounds, summarize

HW_THERMAL, SW_THERMAL, HW_SLOWDOWN, POWER_BRAKE = 0x40, 0x20, 0x8, 0x80


def test_a_round_with_a_clock_far_below_what_the_card_sustains_is_left_out_and_counted():
    # the kernel arm held ~1,400 MHz under the power cap; rounds 2 and 4 dropped to 990 / 1,050
    kernel = [1400.0, 1390.0, 990.0, 1410.0, 1050.0, 1405.0]
    baseline = [1300.0, 1310.0, 1290.0, 1305.0, 1300.0, 1295.0]
    rounds = select_rounds([kernel, baseline], [POWER_CAP] * 6, 0.8)
    assert rounds.kept == (0, 1, 3, 5) and rounds.slow_clock == 2 and rounds.slowdown == 0
    assert rounds.sustained_mhz == (pytest.approx(1395.0), pytest.approx(1300.0))
    assert rounds.floor_mhz[0] == pytest.approx(0.8 * 1395.0)
    assert rounds.power_capped_share == 1.0 and rounds.clock_range_mhz == (1295.0, 1410.0)
    times = [1.0, 1.01, 1.4, 1.0, 1.3, 1.02]
    timing = summarize([times[i] for i in rounds.kept], throttled=6 - len(rounds.kept))
    assert timing.samples == 4 and timing.samples_throttled == 2 and timing.max_ms == 1.02


def test_the_power_cap_is_a_condition_not_a_reason_to_leave_a_round_out():
    """Chapter 20 at 8192 on an H100: every sample under the power cap, every clock below 75% of
    the 1,980 MHz maximum (the old rule failed the job): all rounds count."""
    rng = np.random.default_rng(3)
    kernel = list(1260 + 240 * rng.random(300))
    baseline = list(1260 + 240 * rng.random(300))
    rounds = select_rounds([kernel, baseline], [POWER_CAP] * 300, 0.8)
    assert len(rounds.kept) == 300 and rounds.power_capped_share == 1.0
    assert max(kernel) < 0.76 * 1980


def test_each_arm_is_held_to_its_own_sustained_clock():
    """A light kernel at the boost clock paired with a heavy baseline at the power cap: neither
    arm's rounds are left out for the other's clock."""
    light = [1980.0] * 10
    heavy = [1300.0] * 10
    assert len(select_rounds([light, heavy], [None] * 10, 0.8).kept) == 10


@pytest.mark.parametrize("reason", [HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, POWER_BRAKE])
def test_rounds_with_a_thermal_or_hardware_slowdown_are_left_out(reason):
    clocks = [[1400.0] * 8, [1300.0] * 8]
    reasons = [POWER_CAP] * 5 + [POWER_CAP | reason] * 3
    rounds = select_rounds(clocks, reasons, 0.8)
    assert rounds.kept == (0, 1, 2, 3, 4) and rounds.slowdown == 3 and rounds.slow_clock == 0
    assert reason_names(reason)[0] in {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                       "hw_power_brake_slowdown"}
    assert reason & SLOWDOWN and not POWER_CAP & SLOWDOWN


def test_the_sustained_clock_is_taken_over_the_rounds_without_a_slowdown():
    """Slowed-down rounds do not drag the reference down (so the floor stays where the card
    holds its clock when healthy)."""
    clocks = [[1400.0] * 6 + [500.0] * 10]
    rounds = select_rounds(clocks, [0] * 6 + [HW_THERMAL] * 10, 0.8)
    assert rounds.sustained_mhz == (1400.0,) and rounds.kept == tuple(range(6))


def test_without_clocks_or_reasons_every_round_counts():
    rounds = select_rounds([[float("inf")] * 5, [float("inf")] * 5], [None] * 5, 0.8)
    assert len(rounds.kept) == 5 and rounds.power_capped_share is None
    assert rounds.sustained_mhz == (None, None)
    assert len(select_rounds([[100.0, 2000.0]], [None] * 2, None).kept) == 2  # no threshold


class _Clocks:
    """timing.ClockProbe's stand-in: one arm's SM clock per round, from a given sequence."""

    def __init__(self, sequence):
        self.sequence, self.at = sequence, 0

    def probe(self, batch):
        outer = self

        class Probe:
            def __init__(self, _):
                pass

            def before(self, i):
                pass

            def after(self, i):
                pass

            def read(self, count):
                got = outer.sequence[outer.at:outer.at + count]
                outer.at += count
                return got
        return Probe


def _measure(monkeypatch, clocks, reasons, **protocol):
    """measure_interleaved with one arm, its probe clocks and NVML reasons from the sequences
    (the reasons are read once before the first batch, then after each batch)."""
    from src.job import timing
    from tests import fake_cupy

    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(timing, "ClockProbe", _Clocks(clocks).probe(None))
    read = iter(reasons)
    settings = dict(warmup=0, min_samples=10, max_samples=40, target_rel_iqr=1e-9,
                    max_seconds=60.0, throttle_threshold=0.8)
    settings.update(protocol)
    return timing.measure_interleaved([timing.Arm(lambda: None)],
                                      read_reasons=lambda: next(read), **settings)


def test_a_power_capped_job_is_timed_with_the_cap_recorded(monkeypatch):
    result = _measure(monkeypatch, [1300.0] * 40, [POWER_CAP] * 5)
    assert result.rounds is not None and len(result.rounds.kept) == 40
    assert result.rounds.power_capped_share == 1.0 and result.timings[0].samples_throttled == 0
    assert reason_names(result.reasons_seen) == ["sw_power_cap"]


def test_a_job_fails_throttled_only_when_fewer_than_min_samples_rounds_are_usable(monkeypatch):
    """Batches of 10 rounds; the reasons read at a batch's edges stand for its rounds. Overheating
    from the first batch on: no usable round, failed_throttled with the rule and the reasons."""
    with pytest.raises(Throttled) as caught:
        _measure(monkeypatch, [1400.0] * 40, [0] + [HW_THERMAL] * 4)
    text = str(caught.value)
    assert "only 0 of 40 timed rounds are usable" in text and "bench.min_samples=10" in text
    assert "hw_thermal_slowdown" in text and "40 rounds left out for a slowdown" in text


def test_a_job_with_enough_usable_rounds_is_timed_on_those(monkeypatch):
    """The first batch calm (edges 0 and 0), then overheating: its 10 rounds are enough."""
    result = _measure(monkeypatch, [1400.0] * 40, [0, 0] + [HW_THERMAL] * 3)
    assert result.rounds.kept == tuple(range(10)) and result.timings[0].samples == 10
    assert result.timings[0].samples_throttled == 30 and result.rounds.slowdown == 30


def test_one_slow_round_at_the_time_limit_takes_more_rounds_instead_of_failing(monkeypatch):
    """A heavy job fills max_seconds with its first 10 rounds (16384^3 TF32 does in the tune
    protocol's 0.6 s); one of them under the clock floor left 9 usable, and the job failed. Past
    the limit it now takes rounds up to 2 x min_samples, and fails only short of min_samples."""
    result = _measure(monkeypatch, [1400.0] * 9 + [500.0] + [1400.0] * 30, [None] * 5,
                      max_seconds=0.0)
    assert len(result.rounds.kept) >= 10 and result.rounds.slow_clock == 1
    with pytest.raises(Throttled, match="only 9 of 20 timed rounds are usable"):
        _measure(monkeypatch, [1400.0] * 9 + [500.0] + [1400.0] * 30, [0, 0] + [HW_THERMAL] * 3,
                 max_seconds=0.0)


def test_a_floor_above_the_sustained_clock_fails_the_job(monkeypatch):
    """bench.throttle_threshold above 1: no round reaches the floor (the GPU test's way to
    force failed_throttled)."""
    with pytest.raises(Throttled, match="bench.throttle_threshold=1.5"):
        _measure(monkeypatch, [1400.0] * 40, [None] * 5, throttle_threshold=1.5)


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
