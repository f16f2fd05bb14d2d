"""CUPTI kernel timestamps (src/job/kernel_clock.py): samples are cut out of the activity records
between the clock-probe kernels; anything that does not add up falls back to CUDA events."""

from __future__ import annotations

import pytest

from src.errors import ConfigError
from src.job import kernel_clock
from src.job.kernel_clock import bracketed_spans_ms
from src.job.protocol import check_bench

P = True   # a probe kernel
K = False  # a timed kernel


def test_one_kernel_per_bracket_is_its_own_duration():
    records = [(0, 1_000, P), (2_000, 19_000, K), (19_500, 20_000, P),
               (21_000, 21_500, P), (22_000, 52_000, K), (52_500, 53_000, P)]
    assert bracketed_spans_ms(records, 2) == [pytest.approx(0.017), pytest.approx(0.030)]


def test_several_kernels_in_a_bracket_are_timed_together_without_the_gaps_between_them():
    # a pre-pass then the product (chapter 23), or cuBLAS's split-K reduction: 500 + 1450 ns;
    # in the second sample the host enqueued the product 20 µs late, which is not GPU time
    records = [(0, 10, P), (100, 600, K), (650, 2_100, K), (2_200, 2_210, P),
               (3_000, 3_010, P), (3_100, 3_600, K), (23_600, 25_050, K), (25_100, 25_110, P)]
    assert bracketed_spans_ms(records, 2) == [pytest.approx(0.00195), pytest.approx(0.00195)]


def test_kernels_outside_brackets_are_not_samples():
    # warm-up launches, restoring C, the spot check's copy: before, between and after brackets
    records = [(0, 500, K), (600, 610, P), (700, 1_700, K), (1_800, 1_810, P),
               (1_900, 2_500, K), (2_600, 2_610, P), (2_700, 3_700, K), (3_800, 3_810, P),
               (3_900, 4_000, K)]
    assert bracketed_spans_ms(records, 2) == [pytest.approx(0.001), pytest.approx(0.001)]


@pytest.mark.parametrize("records, expected", [
    ([(0, 10, P), (100, 200, K), (300, 310, P)], 2),            # fewer samples than launched
    ([(0, 10, P), (100, 200, K)], 1),                           # a bracket left open
    ([(0, 10, P), (300, 310, P)], 1),                           # a bracket with no kernel
    ([], 1),
])
def test_lost_records_give_none_so_the_batch_keeps_its_event_times(records, expected):
    assert bracketed_spans_ms(records, expected) is None


def test_events_timer_needs_no_cupti():
    assert kernel_clock.shared("events") is None


def test_timer_must_be_a_known_clock():
    from src.job.config import compose

    bench = dict(compose().bench)
    check_bench(bench)
    bench["timer"] = "wallclock"
    with pytest.raises(ConfigError, match="bench.timer.*cupti, events"):
        check_bench(bench)


@pytest.mark.gpu
def test_cupti_times_the_kernels_alone_and_agrees_with_events_up_to_the_gaps(compose):
    """The same job timed with each clock: CUPTI's kernel stamps leave out what an event pair
    adds around a launch (the gap before the kernel starts), so its median is shorter, and both
    clocks' records say which clock they used. (No bound on how much shorter: once CUPTI traces
    the process, launches are slower on the host and the event pairs of a 24 µs kernel took 62 µs
    on the H100.)"""
    from src.job.pipeline import run_job

    records = {timer: run_job(compose("kernel=20_wgmma_tf32", "size=1024", f"bench.timer={timer}"))
               for timer in ("cupti", "events")}
    for timer, record in records.items():
        assert record.status == "ok", record.error
        assert record.timer == timer
    cupti, events = records["cupti"], records["events"]
    assert cupti.time_ms_median < events.time_ms_median
    assert cupti.baseline_gflops > events.baseline_gflops  # cuBLAS too: the same clock for both
