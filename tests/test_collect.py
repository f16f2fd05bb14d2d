"""Collect step: job records -> runs.csv (one row per job), on the real H100 records in tests/data/."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from src.records.collect import main as collect_main
from src.records.collect import read_runs, records_from_runs
from src.records.record import Record
from tests.conftest import DATA_DIR, ROOT
from tests.runs_fixture import RUNS_FIXTURE, build, fixture_jobs


def jsonl(name: str) -> list[Record]:
    lines = (DATA_DIR / name).read_text().splitlines()
    return [Record.from_dict(json.loads(line)) for line in lines if line.strip()]


def test_runs_fixture_is_built_from_the_recorded_jobs(tmp_path):
    """tests/data/runs_h100.csv is exactly what src.records.collect makes of the real records."""
    assert build(tmp_path / "runs.csv").read_bytes() == RUNS_FIXTURE.read_bytes()
    frame = read_runs(RUNS_FIXTURE)
    assert len(frame) == 18
    assert (frame.status == "ok").sum() == 16
    failed = frame[frame.status != "ok"]
    assert sorted(failed.kernel) == ["04_blocktile_1d", "05_blocktile_2d"]
    assert set(failed.status) == {"unsupported_size"} and failed.error.str.contains("m % bm").all()
    assert failed.gflops.isna().all() and failed.pct_of_cublas_fp32.isna().all()
    # every ok figure is the recorded one, to the last digit
    recorded = {(r.kernel, r.m): r.gflops for r in jsonl("records_h100_progression.jsonl")}
    for row in frame[frame.status == "ok"].itertuples():
        assert row.gflops == recorded[row.kernel, row.m]


def test_rows_round_trip_to_records():
    originals = [record for _, record in fixture_jobs()]
    back = records_from_runs(read_runs(RUNS_FIXTURE))
    skip = {"device", "bench", "math"}  # spread into device.* / bench.* columns, not rebuilt
    for a, b in zip(originals, back, strict=True):
        # recorded before records carried math: read back with their chapter's (conf/kernel/)
        assert a.math is None and b.math == {"cublas_tf32": "tf32"}.get(b.kernel, "ffma")
        for f in dataclasses.fields(Record):
            if f.name not in skip:
                assert getattr(a, f.name) == getattr(b, f.name), f.name


def test_nested_fields_are_flattened():
    frame = read_runs(RUNS_FIXTURE)
    row = frame[(frame.kernel == "06_vectorize") & (frame.m == 4096)].iloc[0]
    assert json.loads(row["params"]) == {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8}
    assert json.loads(row["grid"]) == [32, 32]
    assert row["device.name"] == "NVIDIA H100 80GB HBM3" and row["device.sms"] == 132
    assert row["bench.min_samples"] == 20 and row["bench.tolerance.fp32"] == 1e-5
    assert row["size"] == "4096" and row["job"] == "records_h100_progression.jsonl:12"


def test_collects_a_sweep_directory_in_job_order(tmp_path):
    records = jsonl("records_h100_mixed.jsonl") + jsonl("records_h100_progression.jsonl")
    sweep = tmp_path / "sweep"
    for num, r in enumerate(records):
        r.write(sweep / f"{num}_{r.kernel}_{r.m}x{r.n}x{r.k}")
    (sweep / "summary.md").write_text("not a record\n")
    proc = subprocess.run([sys.executable, "-m", "src.records.collect", str(sweep), "-o",
                           str(tmp_path / "runs.csv")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "24 jobs (19 ok, 5 failed)" in proc.stdout
    frame = read_runs(tmp_path / "runs.csv")
    assert list(frame.job) == [f"{num}_{r.kernel}_{r.m}x{r.n}x{r.k}" for num, r in enumerate(records)]
    assert list(frame.status) == [r.status for r in records]


def test_an_empty_sweep_is_an_error(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    with pytest.raises(SystemExit) as info:
        collect_main([str(tmp_path / "sweep"), "-o", str(tmp_path / "runs.csv")])
    assert info.value.code == 1
    assert "no record.json under" in capsys.readouterr().err
    assert not (tmp_path / "runs.csv").exists()
