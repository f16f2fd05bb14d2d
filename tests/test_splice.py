"""src/publish/splice.py on recorded H200 rows: the published held-out runs (results/h200/
heldout_runs.csv) and a replicate of its TF32 half measured through the same dispatch
(results/tuning/probes/h200_heldout_tf32_replicate_1204_runs.csv, 2026-12-04)."""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from src.job import autotune
from src.publish import splice
from src.publish.heldout import publish

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "results" / "h200" / "heldout_runs.csv"
REPLICATE = ROOT / "results" / "tuning" / "probes" / "h200_heldout_tf32_replicate_1204_runs.csv"


@pytest.fixture(autouse=True)
def rules_alone(monkeypatch):
    """Both recorded files were measured by the dispatch rules alone (dispatch.autotune=false):
    today's dispatch for them is the rules' (tests/test_heldout.py checks autotuned rows)."""
    monkeypatch.setattr(autotune, "default_settings", lambda: autotune.Settings(enabled=False))


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns or list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_measured_again_rows_replace_their_published_rows_and_the_rest_stay_as_read(tmp_path, capsys):
    """Three replicate rows go in place of their published rows, field for field; every other
    line of the file is the published text byte for byte; the held-out report built from the
    spliced file reads the new figures (a new column only the new rows record is added, empty
    elsewhere)."""
    runs = shutil.copy(PUBLISHED, tmp_path / "heldout_runs.csv")
    again = _rows(REPLICATE)[10:13]
    for row in again:
        row["recorded_later"] = "yes"
    new = _write(tmp_path / "again.csv", again)
    assert splice.main([str(runs), "--gpu", "h200", str(new)]) == 0
    out = capsys.readouterr().out
    assert f"spliced 3 rows into {runs}" in out
    shapes = {f"{r['m']}x{r['n']}x{r['k']}" for r in again}
    assert all(f"best_tf32 {s}:" in out for s in shapes)
    before, after = PUBLISHED.read_text().splitlines(), Path(runs).read_text().splitlines()
    assert len(before) == len(after) and after[0] == before[0] + ",recorded_later"
    changed = [i for i, (a, b) in enumerate(zip(before[1:], after[1:]), 1) if b != a + ","]
    assert len(changed) == 3
    spliced = {(r["kernel"], r["m"], r["n"], r["k"]): r for r in _rows(Path(runs))}
    for row in again:
        got = spliced[row["kernel"], row["m"], row["n"], row["k"]]
        assert {c: got[c] for c in row} == row
    metrics = publish(Path(runs), tmp_path / "out", "h200")["h200"]["tf32"]
    ratios = [float(r["pct_of_best_cublas"]) / 100 for r in spliced.values()
              if r["kernel"] == "best_tf32" and r["status"] == "ok"]
    assert metrics["min"] == round(min(ratios), 4)


def test_rows_that_would_make_the_file_say_what_was_not_measured_are_refused(tmp_path, capsys):
    """No published row to replace, two rows for one, another GPU spec, a launch other than
    today's dispatch: each is an error naming the rows and the rule, and the file is unchanged."""
    runs = shutil.copy(PUBLISHED, tmp_path / "heldout_runs.csv")
    good = _rows(REPLICATE)[20]
    unknown = {**good, "m": "7"}
    params = json.loads(good["params"])
    other_launch = {**good, "params": json.dumps({**params, "bm": 128 if params["bm"] == 64 else 64})}
    other_gpu = {**good, "gpu_spec": "h100_sxm"}
    cases = [([unknown], r"no published row to replace \(best_tf32 7x"),
             ([good, good], r"more than one new row for best_tf32"),
             ([other_launch], r"measured through another dispatch than today's \(best_tf32 .*today runs gemm_"),
             ([other_gpu], r"it holds jobs measured on h100_sxm")]
    for i, (rows, needle) in enumerate(cases):
        new = _write(tmp_path / f"case{i}.csv", rows)
        assert splice.main([str(runs), "--gpu", "h200", str(new)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert re.search(needle, err), err
        assert Path(runs).read_bytes() == PUBLISHED.read_bytes()
    lines = PUBLISHED.read_text().splitlines()
    tf32_line = next(line for line in lines[1:] if ",best_tf32," in line)
    doubled = tmp_path / "doubled_runs.csv"  # one published TF32 row twice: neither is "its" row
    doubled.write_text("\n".join(lines + [tf32_line]) + "\n")
    row = _rows(doubled)[-1]
    again = [r for r in _rows(REPLICATE) if (r["m"], r["n"], r["k"]) == (row["m"], row["n"], row["k"])]
    assert splice.main([str(doubled), "--gpu", "h200", str(_write(tmp_path / "d.csv", again))]) == 1
    assert "more than one published row for best_tf32" in capsys.readouterr().err
    assert splice.main([str(tmp_path / "none.csv"), "--gpu", "h200", str(new)]) == 1
    assert "is not a file" in capsys.readouterr().err
