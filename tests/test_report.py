"""Records and the sweep summary, on real records from an H100 run (tests/data/, written by the
issue-2 acceptance run, benchmarks/progression.sh, retired since): the progression sweep and a
sweep with failing jobs."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from src.records.record import RECORD_FILE, Record, load_records
from src.records.summary import gflops_figure, row_labels, summary_frame, summary_table, write_summary


def as_sweep(records: list[Record], root):
    """Lay records out as Hydra does: one numbered job directory each."""
    for num, record in enumerate(records):
        record.write(root / f"{num}_{record.kernel}_{record.m}x{record.n}x{record.k}")
    return root


def test_recorded_data_is_real_and_complete(progression):
    assert len(progression) == 16 and all(r.ok for r in progression)
    assert {r.gpu for r in progression} == {"NVIDIA H100 80GB HBM3"}
    for r in progression:
        assert r.rel_err <= r.tolerance and r.samples >= 20
        # gflops is 2MNK over the median time, and pct_of_cublas_fp32 the ratio to the baseline
        assert r.gflops == pytest.approx(2 * r.m * r.n * r.k / (r.time_ms_median * 1e-3) / 1e9)
        assert r.pct_of_cublas_fp32 == pytest.approx(100 * r.gflops / r.cublas_fp32_gflops)


def test_record_round_trips_through_json(progression, tmp_path):
    record = progression[0]
    path = record.write(tmp_path)
    assert path.name == RECORD_FILE and not list(tmp_path.glob("*.tmp"))
    assert Record.from_dict(json.loads(path.read_text())) == record


def test_load_records_orders_jobs_numerically(progression, tmp_path):
    as_sweep(progression, tmp_path)
    loaded = load_records(tmp_path)
    assert [r.kernel for r in loaded] == [r.kernel for r in progression]  # 10_ after 9_


def test_summary_table_is_kernel_by_size(progression):
    table = summary_table(progression, wide=True)
    assert list(table.index) == ["01_naive", "02_gmem_coalesce", "03_smem_blocking",
                                 "04_blocktile_1d", "05_blocktile_2d", "06_vectorize",
                                 "cublas_fp32", "cublas_tf32"]
    assert list(table.columns) == ["math", "1024 GFLOP/s", "1024 % cuBLAS",
                                   "4096 GFLOP/s", "4096 % cuBLAS"]
    by_key = {(r.kernel, r.size_label): r for r in progression}
    assert table.loc["06_vectorize", "4096 GFLOP/s"] == f"{by_key['06_vectorize', '4096'].gflops:,.1f}"
    assert table.loc["cublas_fp32", "4096 % cuBLAS"] == "100.0%"
    # the default fits a terminal: one cell a size, GFLOP/s and % of cuBLAS, and the math
    short = summary_table(progression)
    assert list(short.columns) == ["math", "1024", "4096"]
    assert short.loc["06_vectorize", "4096"] == f"{by_key['06_vectorize', '4096'].gflops:,.0f} 63%"
    assert list(short.math) == ["FFMA"] * 7 + ["TF32"]
    assert max(map(len, short.to_markdown().splitlines())) <= 100


def test_failed_jobs_show_their_status_and_never_a_figure(mixed):
    failed = [r for r in mixed if not r.ok]
    assert {r.status for r in failed} == {"invalid_params", "unsupported_size"}
    for r in failed:
        assert r.gflops is None and r.pct_of_cublas_fp32 is None and r.error
    table = summary_table(mixed, wide=True)
    # a tile sweep keeps one row per parameter set
    assert "04_blocktile_1d bm=64" in table.index and "04_blocktile_1d bm=128" in table.index
    assert table.loc["04_blocktile_1d bm=128", "1024 GFLOP/s"] == "invalid_params"
    assert table.loc["04_blocktile_1d bm=128", "1024 % cuBLAS"] == ""
    frame = summary_frame(mixed)
    assert frame.loc[frame.status != "ok", "gflops"].isna().all()


def test_write_summary_writes_csv_and_markdown(progression, mixed, tmp_path):
    text = write_summary(progression + mixed, tmp_path)
    n = len(progression) + len(mixed)
    failed = sum(not r.ok for r in mixed)
    assert text.startswith(f"SGEMM on NVIDIA H100 80GB HBM3: {n} jobs, {n - failed} ok, {failed} failed")
    assert (tmp_path / "summary.md").read_text() == text
    frame = pd.read_csv(tmp_path / "summary.csv")
    assert len(frame) == n
    assert set(frame.columns) >= {"kernel", "precision", "m", "n", "k", "gflops",
                                  "pct_of_cublas_fp32", "pct_of_cublas_tf32", "rel_err", "status", "gpu"}
    assert frame.loc[frame.status != "ok", "gflops"].isna().all()


def test_console_line(progression, mixed):
    ok = next(r for r in progression if r.kernel == "06_vectorize" and r.m == 4096)
    line = ok.console_line()
    assert "06_vectorize" in line and "GFLOP/s" in line and "% of cuBLAS FP32" in line
    bad = next(r for r in mixed if not r.ok)
    assert bad.status.upper() in bad.console_line() and "GFLOP/s" not in bad.console_line()


def test_gflops_figure_has_one_bar_per_job_that_ran(progression, mixed):
    """The sweep's figure (logged to its MLflow run): a bar per ok job at its kernel and size,
    none for a failed job, on a log scale."""
    for records, sizes in ((progression, ["1024", "4096"]), (mixed, ["1000", "1024"])):
        fig = gflops_figure(records)
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == sizes
        assert ax.get_yscale() == "log"
        drawn = {}
        for container in ax.containers:
            for bar in container:
                size = sizes[round(bar.get_x() + bar.get_width() / 2)]
                drawn[container.get_label(), size] = bar.get_height()
        expected = {(label, r.size_label): r.gflops
                    for label, r in zip(row_labels(records), records) if r.ok}
        assert drawn == pytest.approx(expected)
        png = io.BytesIO()
        fig.savefig(png, format="png")
        assert png.getvalue().startswith(b"\x89PNG\r\n\x1a\n")
    assert ("04_blocktile_1d bm=128", "1024") not in drawn  # invalid_params: no bar
    # a row whose every job failed is not in the legend, and the legend lies inside the saved image
    legend = fig.legends[0]
    assert "04_blocktile_1d bm=128" not in [text.get_text() for text in legend.get_texts()]
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert box.x1 <= fig.bbox.x1 + 1 and box.y0 >= fig.bbox.y0 - 1
