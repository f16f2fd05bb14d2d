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
