"""The held-out report (src/publish/heldout.py) from recorded rows: real H100 suite records
(tests/data/suite_h100_exploration.csv, dispatched as in tests/runs_fixture) stand in for a
held-out sweep's runs; the report's figures are recomputed here from those rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from src.publish import heldout
from tests.runs_fixture import as_dispatched


def test_the_report_has_geomean_min_goal_and_the_worst_five(tmp_path):
    runs = as_dispatched(tmp_path)
    metrics = heldout.publish(runs, tmp_path / "out", "h100_sxm")
    assert set(metrics) == {"h100_sxm"}
    frame = pd.read_csv(runs)
    for precision, kernel in heldout.KERNELS.items():
        mine = frame[(frame.kernel == kernel) & (frame.status == "ok")]
        ratios = mine.pct_of_best_cublas.where(mine.pct_of_best_cublas.notna(), mine.pct_of_cublas) / 100
        s = metrics["h100_sxm"][precision]
        assert s["shapes"] == (frame.kernel == kernel).sum() and s["failed"] == s["shapes"] - len(mine)
        assert s["geomean"] == round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4)
        assert s["min"] == round(ratios.min(), 4)
        worst = sorted(ratios.round(4))[:5]
        assert [w["ratio"] for w in s["worst"]] == worst
        goal_geo, goal_min = heldout.GOALS[precision]
        assert s["goal_met"] == (s["failed"] == 0 and s["geomean"] >= goal_geo and s["min"] >= goal_min)
    text = (tmp_path / "out" / "heldout.md").read_text()
    assert "# Held-out shapes on h100_sxm" in text and text.count("the worst five") == 2
    assert f"| {metrics['h100_sxm']['tf32']['worst'][0]['shape']} |" in text
    assert len(pd.read_csv(tmp_path / "out" / "heldout.csv")) == len(frame[frame.kernel.isin(heldout.KERNELS.values())])


def test_a_gpu_set_refuses_another_gpus_heldout_runs(tmp_path):
    """The recorded H100 rows cannot become the H200's held-out report: nothing is written."""
    out = tmp_path / "h200"
    with pytest.raises(ValueError, match=r"into results/h200/: it holds jobs measured on h100_sxm"):
        heldout.publish(as_dispatched(tmp_path), out, "h200")
    assert not out.exists() or not any(out.iterdir())


def test_runs_timed_otherwise_than_their_protocol_are_not_published(tmp_path):
    """Recorded H200 held-out rows (2026-12-02) measured without the CUDA extras' wheels: CUPTI's
    bindings missing, so CUDA events stood in for the `cupti` clock, and nvmath-python missing, so
    `bench.best_cublas` ran no cuBLASLt. The guard names both and nothing is written; the same
    rows with the protocol met pass, and so does the published set as it stands."""
    from pathlib import Path

    from src.records.collect import protocol_shortfalls, runs_refusal

    recorded = Path(__file__).parent / "data" / "heldout_h200_without_cuda_extras.csv"
    out = tmp_path / "h200"
    with pytest.raises(ValueError, match=r"3 job\(s\) were timed by events where the protocol asks "
                                         r"cupti.*3 job\(s\) asked for the stronger cuBLAS"):
        heldout.publish(recorded, out, "h200")
    assert not out.exists() or not any(out.iterdir())
    rows = pd.read_csv(recorded, dtype=str, keep_default_na=False)
    assert len(rows) == 3 and set(rows.timer) == {"events"} and not any(rows.cublaslt_gflops)
    met = rows.assign(timer="cupti", cublaslt_gflops="1000.0")
    assert protocol_shortfalls(met.to_dict("records")) == []
    failed = rows.assign(status="launch_failed")  # a failed job has no figures to fall short
    assert protocol_shortfalls(failed.to_dict("records")) == []
    assert len(protocol_shortfalls(rows.assign(timer="cupti").to_dict("records"))) == 1
    published = Path(__file__).parents[1] / "results" / "h200" / "heldout_runs.csv"
    assert runs_refusal("h200", published) is None
