"""The paired figures from measure() to the published table, on CPU: % of cuBLAS is exactly the
kernel's GFLOP/s over the paired baseline GFLOP/s published beside it, with its interval."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from src.errors import TimedVerificationFailed
from src.job.recording import keep_pairing, keep_timing
from src.job.timing import Interleaved, summarize
from src.publish.table import progression_frame
from src.records.record import mark_failed
from src.records.summary import summary_table


def _paired(record, kernel_ms: float, baseline_ms: float, seed: int):
    rng = np.random.default_rng(seed)
    k = kernel_ms * (1 + 0.01 * rng.standard_normal(60))
    b = baseline_ms * (1 + 0.01 * rng.standard_normal(60))
    result = Interleaved((summarize(k), summarize(b)), (tuple(k), tuple(b)))
    flops = 2 * record.m * record.n * record.k
    keep_timing(record, result.timings[0], flops)
    keep_pairing(record, record.precision, "cublas_fp32", result, flops)
    return record


@pytest.fixture
def paired(progression):
    mine = [r for r in progression if r.kernel == "06_vectorize"]
    return [_paired(copy.deepcopy(r), r.time_ms_median, r.time_ms_median * f, seed)
            for seed, (r, f) in enumerate(zip(mine, (0.5, 1.002)))]


def test_published_pct_is_the_ratio_of_the_published_figures(paired):
    frame = progression_frame(paired)
    for row in frame.itertuples():
        assert row.pct_of_cublas_fp32 == pytest.approx(100 * row.gflops / row.baseline_gflops,
                                                       abs=0.01)
        assert row.pct_ci_low <= row.pct_of_cublas_fp32 <= row.pct_ci_high
    assert list(frame.verdict) == ["slower", "tie"]  # at half cuBLAS's speed; within 0.2%


def test_the_table_cell_names_the_paired_baseline_and_the_interval(paired):
    table = summary_table(paired, wide=True)
    cell = table.loc["06_vectorize", "1024 % cuBLAS"]
    r = paired[0]
    assert cell.startswith(f"{r.pct_of_cublas:.1f}% of {r.baseline_gflops:,.0f} [")
    assert cell.endswith("slower") and "tie" not in table.loc["06_vectorize", "4096 % cuBLAS"]


def test_a_kernel_caught_after_timing_has_no_figure_anywhere(paired):
    r = paired[0]
    mark_failed(r, TimedVerificationFailed("kernel x failed verification of the last timed "
                                           "launch", rel_err=0.5))
    assert r.status == "failed_timed_verification"
    for name in ("gflops", "pct_of_cublas", "pct_ci_low", "baseline_gflops", "verdict",
                 "kernel_time_ms", "pct_of_cublas_fp32", "cublas_fp32_gflops"):
        assert getattr(r, name) is None, name
    row = progression_frame([r]).iloc[0]
    assert pd.isna(row.gflops) and pd.isna(row.baseline_gflops) and row.verdict is None
    assert "GFLOP/s" not in r.console_line() and "FAILED_TIMED_VERIFICATION" in r.console_line()
