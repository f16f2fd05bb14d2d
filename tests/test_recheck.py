"""The recheck (src/publish/recheck.py) on small progression tables cut from the published H100
table (results/h100_sxm/progression.csv, its real header and rows): a fresh table is a copy with
one figure, verdict or status changed, and the exit status and report must say so."""

from __future__ import annotations

import csv

import pytest

from src.publish import recheck
from tests.conftest import ROOT

PUBLISHED = ROOT / "results" / "h100_sxm" / "progression.csv"
# 22 at 1024: FP32, faster against both cuBLAS; 20 at 2048: TF32, faster; 20 at 1024: TF32, a tie
ROWS = [("22_ffma_warp_specialized", "1024"), ("20_wgmma_tf32", "2048"), ("20_wgmma_tf32", "1024")]


def published_rows() -> tuple[list[str], list[dict]]:
    with PUBLISHED.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = {(r["kernel"], r["m"]): r for r in reader}
        return reader.fieldnames, [dict(rows[key]) for key in ROWS]


def write(path, columns, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in columns} for r in rows)
    return path


def run(tmp_path, fresh_rows, capsys, *extra, columns=None):
    """recheck's exit status and printed report: the published rows against fresh_rows."""
    header, rows = published_rows()
    published = write(tmp_path / "published.csv", header, rows)
    fresh = write(tmp_path / "fresh.csv", columns or header, fresh_rows)
    status = recheck.main([str(published), str(fresh), *extra])
    out = capsys.readouterr()
    return status, out.out + out.err


def scaled(row: dict, column: str, factor: float) -> dict:
    return {**row, column: str(round(float(row[column]) * factor, 2))}


def test_identical_tables_agree(tmp_path, capsys):
    _, rows = published_rows()
    status, text = run(tmp_path, rows, capsys)
    assert status == 0
    assert "3 rows compared: 0 failed, 0 outside 2%, 0 verdict disagreements" in text
    assert "GFLOP/s fresh / published: min 1.000, median 1.000, max 1.000" in text
    assert "outside:" not in text and "disagrees:" not in text


def test_a_3_percent_gflops_move_is_outside_and_1_5_percent_is_not(tmp_path, capsys):
    _, rows = published_rows()
    moved = scaled(rows[0], "gflops", 1.03)
    status, text = run(tmp_path, [moved] + rows[1:], capsys, "--within", "2")
    assert status == 1
    assert "1 outside 2%" in text
    assert (f"outside: 22_ffma_warp_specialized 1024x1024x1024: GFLOP/s {rows[0]['gflops']} -> "
            f"{moved['gflops']} (+3.00%)") in text
    status, text = run(tmp_path, [scaled(rows[0], "gflops", 1.015)] + rows[1:], capsys, "--within", "2")
    assert status == 0 and "0 outside 2%" in text
    assert "max 1.015" in text


def test_the_own_precision_pct_is_compared(tmp_path, capsys):
    """A TF32 row's % of cuBLAS is pct_of_cublas_tf32 (its FP32 column is empty)."""
    _, rows = published_rows()
    moved = scaled(rows[1], "pct_of_cublas_tf32", 0.97)
    status, text = run(tmp_path, [rows[0], moved, rows[2]], capsys)
    assert status == 1
    assert (f"outside: 20_wgmma_tf32 2048x2048x2048: % of cuBLAS {rows[1]['pct_of_cublas_tf32']} -> "
            f"{moved['pct_of_cublas_tf32']} (-3.00%)") in text
    assert "% of cuBLAS, change: min -3.00%" in text


def test_published_faster_and_fresh_tie_disagree(tmp_path, capsys):
    _, rows = published_rows()
    assert rows[1]["verdict"] == "faster"
    status, text = run(tmp_path, [rows[0], {**rows[1], "verdict": "tie (runs disagree)"}, rows[2]],
                       capsys)
    assert status == 1
    assert "1 verdict disagreements" in text
    assert ("disagrees: 20_wgmma_tf32 2048x2048x2048: verdict published faster, fresh tie "
            "(runs disagree)") in text


def test_published_tie_accepts_slower_and_extra_text_after_the_word(tmp_path, capsys):
    _, rows = published_rows()
    assert rows[2]["verdict"] == "tie" and rows[0]["verdict_best"] == "faster"
    fresh = [{**rows[0], "verdict_best": "faster (3 runs)"}, rows[1], {**rows[2], "verdict": "slower"}]
    status, text = run(tmp_path, fresh, capsys)
    assert status == 0 and "0 verdict disagreements" in text


def test_a_failed_row_is_reported(tmp_path, capsys):
    _, rows = published_rows()
    failed = {**rows[0], "status": "failed_launch", "gflops": "", "pct_of_cublas_fp32": "",
              "pct_of_best_cublas": "", "verdict": "", "verdict_best": ""}
    status, text = run(tmp_path, [failed] + rows[1:], capsys)
    assert status == 1
    assert "1 failed" in text
    assert "failed: 22_ffma_warp_specialized 1024x1024x1024: published ok, fresh failed_launch" in text
    assert "disagrees:" not in text  # a failed row has no verdict to compare


def test_rows_in_one_table_only_are_listed_not_errors(tmp_path, capsys):
    _, rows = published_rows()
    extra = {**rows[0], "m": "512", "n": "512", "k": "512"}
    status, text = run(tmp_path, rows[1:] + [extra], capsys)
    assert status == 0 and "2 rows compared" in text
    assert "only in the published table: 1 (22_ffma_warp_specialized 1024x1024x1024)" in text
    assert "only in the fresh table: 1 (22_ffma_warp_specialized 512x512x512)" in text


def test_a_table_without_a_required_column_is_refused(tmp_path, capsys):
    header, rows = published_rows()
    status, text = run(tmp_path, rows, capsys, columns=[c for c in header if c != "gflops"])
    assert status == 2
    assert "error:" in text and "fresh.csv" in text and "no column(s) gflops" in text


def test_a_missing_file_is_refused(tmp_path, capsys):
    header, rows = published_rows()
    published = write(tmp_path / "published.csv", header, rows)
    assert recheck.main([str(published), str(tmp_path / "absent.csv")]) == 2
    assert "absent.csv cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize("within", ["2", "5"])
def test_within_sets_the_tolerance(tmp_path, capsys, within):
    _, rows = published_rows()
    status, _ = run(tmp_path, [scaled(rows[0], "pct_of_best_cublas", 0.96)] + rows[1:], capsys,
                    "--within", within)
    assert status == (1 if within == "2" else 0)
