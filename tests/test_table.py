"""Table step on the recorded H100 runs (tests/data/runs_h100.csv): the published contract
(progression.csv), the Markdown table and metrics.json; failed jobs appear, never with a figure."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from src.records.collect import write_runs
from src.publish.table import CONTRACT_COLUMNS, write_table
from tests.conftest import DATA_DIR, ROOT
from tests.runs_fixture import RUNS_FIXTURE, jsonl_jobs

CEILINGS_FIXTURE = DATA_DIR / "ceilings_fixture_not_measured.json"
KERNELS = ["01_naive", "02_gmem_coalesce", "03_smem_blocking", "04_blocktile_1d",
           "05_blocktile_2d", "06_vectorize", "cublas_fp32", "cublas_tf32"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    write_table(RUNS_FIXTURE, out, CEILINGS_FIXTURE)
    return out


def test_progression_csv_is_the_contract(published):
    table = pd.read_csv(published / "progression.csv", dtype={"kernel": str, "status": str})
    assert list(table.columns) == CONTRACT_COLUMNS
    assert len(table) == 18  # one row per kernel and size, baselines included
    assert list(table.drop_duplicates("kernel").kernel) == KERNELS
    assert set(table.precision) == {"fp32", "tf32"}
    assert set(table.loc[table.kernel == "cublas_tf32", "precision"]) == {"tf32"}
    assert not table.duplicated(["kernel", "m", "n", "k"]).any()
    runs = pd.read_csv(RUNS_FIXTURE)
    for row in table[table.status == "ok"].itertuples():
        run = runs[(runs.kernel == row.kernel) & (runs.m == row.m)].iloc[0]
        assert row.gflops == round(run.gflops, 1)
        assert row.pct_of_cublas_fp32 == round(run.pct_of_cublas_fp32, 2)
        assert row.gpu == "NVIDIA H100 80GB HBM3" and row.rel_err <= run.tolerance


def test_failed_jobs_are_rows_without_figures(published):
    table = pd.read_csv(published / "progression.csv")
    failed = table[table.status != "ok"]
    assert sorted(zip(failed.kernel, failed.m, failed.status)) == [
        ("04_blocktile_1d", 1000, "unsupported_size"), ("05_blocktile_2d", 1000, "unsupported_size")]
    assert failed[["gflops", "pct_of_cublas_fp32", "pct_of_cublas_tf32"]].isna().all().all()
    text = (published / "progression.csv").read_text()
    assert "04_blocktile_1d,fp32,ffma,1000,1000,1000,,,,,unsupported_size," in text


def test_markdown_is_the_seed_table_with_gpu_and_date(published):
    text = (published / "progression.md").read_text()
    assert text.startswith("# SGEMM progression on NVIDIA H100 80GB HBM3, 2026-11-20\n")
    assert "L2 flushed before every sample" in text and "18 jobs: 16 ok, 2 failed" in text
    assert "NOT measured" in text  # the ceilings fixture says what it is
    header = next(line for line in text.splitlines() if line.startswith("| kernel"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["kernel", "math", "1000", "1024", "4096"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in text.splitlines() if line.startswith("| 0") or line.startswith("| cublas")}
    assert list(rows) == KERNELS
    # the same figures as the README's measured table (the same recorded run), GFLOP/s and % of
    # cuBLAS in one cell, so the table fits a terminal
    assert rows["06_vectorize"] == ["FFMA", "", "9,908 29%", "32,657 63%"]
    # the TF32 baseline against itself: a TF32 row is compared with cuBLAS TF32
    assert rows["cublas_tf32"] == ["TF32", "", "117,529 100%", "406,278 100%"]
    assert rows["04_blocktile_1d"][:2] == ["FFMA", "unsupported_size"]
    assert max(len(line) for line in text.splitlines() if line.startswith("|")) <= 100
    wide = (published / "progression_wide.md").read_text()
    header = next(line for line in wide.splitlines() if line.startswith("| kernel"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "kernel", "math", "1000 GFLOP/s", "1000 % cuBLAS", "1024 GFLOP/s", "1024 % cuBLAS",
        "4096 GFLOP/s", "4096 % cuBLAS"]
    wide_rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
                 for line in wide.splitlines() if line.startswith("| 0") or line.startswith("| cublas")}
    assert wide_rows["06_vectorize"][5:] == ["32,657.4", "62.8%"]
    assert wide_rows["cublas_tf32"][3:] == ["117,528.7", "100.0% of TF32", "406,278.0", "100.0% of TF32"]
    assert "- `05_blocktile_2d` at 1000: **unsupported_size**: unsupported problem size" in text


def test_metrics(published):
    metrics = json.loads((published / "metrics.json").read_text())
    assert metrics["jobs"] == {"total": 18, "ok": 16, "failed": 2}
    assert metrics["ceilings"] == {"ffma_gflops": 66900.0, "dram_gbs": 3350.0}
    assert metrics["size_4096"] == {
        "best_kernel": "06_vectorize", "best_gflops": 32657.4, "best_pct_of_cublas_fp32": 62.77,
        "best_pct_of_ffma_peak": round(100 * 32657.4 / 66900.0, 2),
        "cublas_fp32_gflops": 52041.9, "cublas_tf32_gflops": 406278.0}
    assert metrics["size_1024"]["best_kernel"] == "04_blocktile_1d"
    assert "size_1000" not in metrics  # nothing ran there


def test_ceilings_fixture_is_marked_and_traceable():
    """The stand-in ceilings say they are not measured, and hold the datasheet's figures."""
    from omegaconf import OmegaConf

    ceilings = json.loads(CEILINGS_FIXTURE.read_text())
    sheet = OmegaConf.load(ROOT / "conf" / "gpu" / "h100_sxm.yaml")
    assert ceilings["measured"] is False and "NOT A MEASUREMENT" in ceilings["provenance"]
    assert ceilings["ffma_gflops"] == sheet.fp32_tflops * 1e3
    assert ceilings["dram_gbs"] == sheet.mem_bandwidth_gbs


def test_tile_variants_get_their_own_rows(tmp_path):
    """A tile sweep (the mixed H100 sweep: no baselines, five failed jobs) labels rows by the
    parameters that vary, as the sweep summary does."""
    write_runs(jsonl_jobs("records_h100_mixed.jsonl"), tmp_path / "runs.csv")
    frame = write_table(tmp_path / "runs.csv", tmp_path)
    assert len(frame) == 8 and (frame.status != "ok").sum() == 5
    assert "04_blocktile_1d bm=128" in set(frame.kernel) and "05_blocktile_2d bm=64" in set(frame.kernel)
    assert frame.loc[frame.status != "ok", "gflops"].isna().all()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["size_1024"] == {"best_kernel": "04_blocktile_1d bm=64",
                                    "best_gflops": 13240.4, "best_pct_of_cublas_fp32": 38.42}


def test_repeated_jobs_are_refused(tmp_path):
    """Records of two sweeps mixed together (stale records) would give two rows for one kernel
    and size: the table step stops and says so."""
    jobs = jsonl_jobs("records_h100_progression.jsonl") + jsonl_jobs("records_h100_progression.jsonl")[:1]
    write_runs(jobs, tmp_path / "runs.csv")
    proc = subprocess.run([sys.executable, "-m", "src.publish.table", str(tmp_path / "runs.csv"),
                           "--out-dir", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "more than one job for 01_naive at 1024 (2 jobs)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out" / "progression.csv").exists()


def test_ceilings_of_another_gpu_are_refused(tmp_path):
    other = json.loads(CEILINGS_FIXTURE.read_text()) | {"gpu": "NVIDIA A100-SXM4-80GB"}
    (tmp_path / "ceilings.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="ceilings and runs must come from one GPU"):
        write_table(RUNS_FIXTURE, tmp_path, tmp_path / "ceilings.json")


@pytest.mark.parametrize("warmup_ms, says", [(500.0, "3 warm-up launches and at least 500 ms,"),
                                             (0.0, "3 warm-up launches, median"),
                                             (None, "3 warm-up launches, median")])
def test_the_protocol_line_names_the_timed_warm_up(tmp_path, warmup_ms, says):
    """progression.md's protocol line says how long jobs warmed up when they did (bench.warmup_ms;
    runs recorded before it have no such column)."""
    runs = pd.read_csv(ROOT / "results" / "h100_sxm" / "runs.csv")
    assert (runs["bench.warmup"] == 3).all()
    if warmup_ms is None:
        runs = runs.drop(columns=["bench.warmup_ms"])
    else:
        runs["bench.warmup_ms"] = warmup_ms
    runs.to_csv(tmp_path / "runs.csv", index=False)
    write_table(tmp_path / "runs.csv", tmp_path / "out", ROOT / "results" / "h100_sxm" / "ceilings.json")
    assert says in (tmp_path / "out" / "progression.md").read_text()


def test_every_chapter_names_its_math():
    """Tables, figures and metrics tell FFMA, 3xTF32 and TF32 apart from the chapter's config:
    a TF32-precision chapter runs TF32; an FP32-accurate one runs FFMA or 3xTF32."""
    from omegaconf import OmegaConf

    from src.paths import CONF_DIR

    for path in sorted((CONF_DIR / "kernel").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        if cfg.get("dispatch"):
            assert cfg.get("math") is None, path.stem  # best_*: the chosen chapter's math
            continue
        assert cfg.get("math") == "tf32" if cfg.precision == "tf32" else \
            cfg.get("math") in ("ffma", "3xtf32"), path.stem


def test_a_table_run_that_fails_midway_leaves_the_published_files(tmp_path, monkeypatch):
    """progression.csv was written, progression.md failed (a full disk, a bug): the three
    published files stay as they were, with no new file beside them."""
    import src.publish.table as table

    out = tmp_path / "results"
    write_table(RUNS_FIXTURE, out, CEILINGS_FIXTURE)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["metrics.json", "progression.csv", "progression.md", "progression_wide.md"]

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(table, "markdown", disk_full)
    runs = pd.read_csv(RUNS_FIXTURE)
    runs = runs[runs.m == runs.m.max()]  # another table than the published one
    runs.to_csv(tmp_path / "fewer.csv", index=False)
    with pytest.raises(OSError, match="No space left"):
        write_table(tmp_path / "fewer.csv", out, CEILINGS_FIXTURE)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("missing", ["runs", "ceilings"])
def test_a_table_from_a_file_that_is_not_there_is_refused_with_the_rule(missing, tmp_path, capsys):
    """`python -m src.publish.table` on a missing runs CSV or ceilings.json: argparse's one-line
    refusal naming what the file is and which step writes it (it was "error: [Errno 2] ..."), and
    nothing written."""
    from src.publish.table import main

    runs = tmp_path / "runs.csv"
    write_runs(jsonl_jobs("records_h100_progression.jsonl"), runs)
    paths = {"runs": runs, "ceilings": CEILINGS_FIXTURE}
    paths[missing] = tmp_path / "gone"
    with pytest.raises(SystemExit) as info:
        main([str(paths["runs"]), "--ceilings", str(paths["ceilings"]), "--out-dir", str(tmp_path / "set")])
    assert info.value.code == 2 and not (tmp_path / "set").exists()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gone'} is not a file (rule: " in err
    assert ("the bench stage collects" if missing == "runs" else "src.job.ceilings writes") in err
