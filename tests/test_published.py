"""The published files are exactly what the publication steps make of the published runs: each
GPU's results/<gpu>/progression.md, .csv and metrics.json from its runs.csv, and its shape suite's
tables and metrics from its suite_runs.csv; results/compare/ from those tables. A hand edit, or runs and tables from different
runs, fails here. And every claim the tables make against the stronger cuBLAS is the paired
figure of its record."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from src.publish.compare import write_compare
from src.publish.suite import publish
from src.publish.table import progression_frame, write_table
from src.records.collect import read_runs, records_from_runs
from tests.conftest import CONF_DIR, ROOT
from tests.test_dvc import params

RESULTS = ROOT / "results" / "h100_sxm"


def test_every_published_set_is_a_gpu_of_the_list():
    """results/ holds one set per GPU spec of params.yaml's published.gpus, the compare, and the
    tuner's evidence (results/tuning/<gpu>.csv, one file per GPU spec)."""
    gpus = params()["published"]["gpus"]
    sets = {p.name for p in (ROOT / "results").iterdir() if p.is_dir()}
    assert sets - {"compare", "tuning"} <= set(gpus) and "h100_sxm" in sets
    assert {p.stem for p in (ROOT / "results" / "tuning").glob("*.csv")} <= set(gpus)
    assert all((CONF_DIR / "gpu" / f"{gpu}.yaml").is_file() for gpu in gpus)


def test_compare_files_are_made_from_the_published_tables(tmp_path):
    published = params()["published"]
    write_compare(ROOT / "results", published["gpus"], tmp_path, published["headline"])
    for name in ("progression.csv", "progression.md", "headline.md", "suite.csv", "suite.md"):
        assert (tmp_path / name).read_text() == (ROOT / "results" / "compare" / name).read_text(), name


def test_the_readme_shows_the_gpus_side_by_side_as_compare_wrote_them():
    """The README's headline table is results/compare/headline.md as the stage wrote it: every
    GPU of published.gpus, a GPU not measured saying so."""
    headline = (ROOT / "results" / "compare" / "headline.md").read_text()
    assert headline in (ROOT / "README.md").read_text()
    for gpu in params()["published"]["gpus"]:
        assert f"| {gpu} |" in headline


def test_progression_files_are_made_from_the_published_runs(tmp_path):
    write_table(RESULTS / "runs.csv", tmp_path, RESULTS / "ceilings.json")
    for name in ("progression.md", "progression.csv", "metrics.json"):
        assert (tmp_path / name).read_text() == (RESULTS / name).read_text(), name


def test_every_published_run_is_paired_with_the_stronger_cublas_and_timed_by_cupti():
    runs = read_runs(RESULTS / "runs.csv")
    mine = runs[(runs.backend != "cublas") & (runs.status == "ok")]
    kernels = [k for k in params()["progression"]["kernels"].split(",") if not k.startswith("cublas")]
    sizes = str(params()["progression"]["sizes"]).split(",")
    first = mine[mine.replicate.fillna(1) == 1]  # each row's first run; replicates come on top
    assert len(first) == len(kernels) * len(sizes) and set(runs.timer) == {"cupti"}
    assert mine.pct_of_best_cublas.notna().all() and mine.cublaslt_gflops.notna().all()
    # the stronger baseline is never weaker than the default one: % of it is at most % of cuBLAS
    assert (mine.pct_of_best_cublas <= mine.pct_of_cublas + 1e-9).all()
    text = (RESULTS / "progression_wide.md").read_text()
    # a row's cell against the stronger cuBLAS: its median run's %, its runs, the verdict
    frame = progression_frame(records_from_runs(runs))
    row = frame[(frame.kernel == "17_flagship") & (frame.m == 4096)].iloc[0]
    line = next(line for line in text.splitlines()
                if line.startswith("| 17_flagship |") and "cuBLASLt" in line)
    cell = line.split("|")[1 + 1 + sizes.index("4096")]
    runs_said = f", {row.replicates} runs" if row.replicates > 1 else ""
    assert cell.strip().startswith(f"{row.pct_of_best_cublas:.1f}%{runs_said}"), cell
    assert cell.strip().endswith(f"{row.verdict_best} (cuBLASLt autotuned)"), cell


def test_suite_files_are_made_from_the_published_suite_runs(tmp_path):
    metrics = publish(RESULTS / "suite_runs.csv", tmp_path, "h100_sxm")
    assert metrics == json.loads((RESULTS / "suite_metrics.json").read_text())
    for name in ("suite.csv", "suite.md", "suite_wide.md", "suite_metrics.json"):
        assert (tmp_path / name).read_text() == (RESULTS / name).read_text(), name
    table = pd.read_csv(RESULTS / "suite.csv")
    ok = table[table.status == "ok"]
    # each ratio is the kernel's GFLOP/s over its paired baseline's, to the rounding
    assert (abs(ok.ratio - ok.gflops / ok.baseline_gflops) < 1e-3).all()
    assert set(table.kernel) == {"best_fp32", "best_tf32"} and len(table) == 96
    assert table.chosen.notna().all() and table.rule.str.contains("conf/tuned/h100_sxm.yaml").all()


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_suite_metrics_are_the_geometric_mean_and_minimum_of_the_table(precision):
    import math

    table = pd.read_csv(RESULTS / "suite.csv")
    rows = table[(table.kernel == f"best_{precision}") & (table.status == "ok")]
    stats = json.loads((RESULTS / "suite_metrics.json").read_text())["h100_sxm"][precision]
    for key, column in (("vs_default", "ratio"), ("vs_best", "ratio_best")):
        values = rows[column].tolist()
        assert stats[key]["geomean"] == pytest.approx(
            math.exp(sum(map(math.log, values)) / len(values)), abs=1e-4)
        assert stats[key]["min"] == min(values)
