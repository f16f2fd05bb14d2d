"""Tuning evidence carried over a kernel source change (src/tune/carry.py, `sgemm-lab tune
--carry-over REV`), on the CPU with nvcc: a candidate's identity is the machine code and launch
nvcc builds, not its names; a row measured from REV's source is carried over to today's only where
the two builds agree. The rows here are made up (no figure is read); the builds are real, of the
kernels as committed at REV and as they are today."""

from __future__ import annotations

import json
import subprocess

import pytest

from src.errors import ConfigError
from src.job.config import kernel_config
from src.job.gpu import limits_from_spec
from src.job.nvcc import nvcc_path
from src.job.problem import Problem
from src.paths import ROOT
from src.tune import carry, evidence
from src.tune import space as tune

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")

# The commit whose kernels measured the committed H100 and H200 evidence of gemm_tf32 (before
# unaligned_rows 2 came, 4cb4100): its rows lack that parameter, their source is another.
REV = "0bc1b41"
TILE = {"bm": 128, "bn": 128, "fit": 1, "group_m": 8, "in_flight": 2, "min_slice_k": 256,
        "min_slices": 1, "split_k": 8, "stages": 4}


def in_history(rev: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode == 0


def spec(params: dict, m: int, n: int, k: int):
    verdict = tune.check(kernel_config("gemm_tf32"), params, Problem(m, n, k, 0.5, 3.0),
                         limits_from_spec("h100_sxm"))
    assert not isinstance(verdict, str), verdict
    return verdict


@needs_nvcc
def test_an_identity_is_the_code_and_the_launch(tmp_path):
    """The same candidate at the same shape: one identity, its build kept and reused; another
    ring depth: other code; another shape with the same entry: another launch, the build reused."""
    base = spec(TILE, 512, 512, 512)
    first = carry.identity(base, tmp_path)
    assert len(list((tmp_path / "identities").iterdir())) == 1
    assert carry.identity(spec(TILE, 512, 512, 512), tmp_path) == first
    deeper = spec({**TILE, "stages": 5}, 512, 512, 512)
    assert deeper.entry != base.entry and carry.identity(deeper, tmp_path) != first
    wider = spec(TILE, 512, 1024, 512)
    assert wider.entry == base.entry and wider.grid != base.grid
    assert carry.identity(wider, tmp_path) != first
    assert len(list((tmp_path / "identities").iterdir())) == 2  # the entry's build, once


def row(params: dict, shape: tuple, source: str, **extra) -> dict:
    m, n, k = shape
    return {"gpu_spec": "h100_sxm", "dispatcher": "best_tf32", "precision": "tf32",
            "shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "aligned": int(n % 4 == 0 and k % 4 == 0),
            "kernel": "gemm_tf32", "params": json.dumps(params, sort_keys=True), "status": "ok",
            "gflops": 1000.0, "ratio_best": 1.0, "source_sha256": source, "same_as": None,
            "carried_from": None, "stage": 2, **extra}


@needs_nvcc
@pytest.mark.skipif(not in_history(REV), reason=f"{REV} is not in this clone's history")
def test_rows_of_an_earlier_source_are_carried_over_where_they_build_the_same(tmp_path, monkeypatch):
    """gemm_tf32's rows measured at REV, an aligned shape and one with unaligned rows (padded by
    the pre-pass then as with unaligned_rows 1 now), carried over: today's source, unaligned_rows
    1, split_tail 0 and c_staged 0 added, the old source kept in carried_from, a same_as row with them. A row whose REV build
    differs from today's (stood in for: today's identity altered) and one of a source REV did not
    have stay as they were; a row of today's source is not rebuilt."""
    with_tree = tmp_path / "tree"
    with_tree.mkdir()
    carry._tree_at(ROOT, REV, with_tree)
    then = carry._sources_in(with_tree, ["gemm_tf32"])["gemm_tf32"]
    today = evidence.source_sha256("gemm_tf32")
    assert then != today
    other_tile = {**TILE, "min_slice_k": 512}
    rows = [row(TILE, (512, 512, 512), then),
            row(other_tile, (512, 512, 512), then, same_as=json.dumps(TILE, sort_keys=True)),
            row(TILE, (67, 3579, 2991), then),
            row({**TILE, "stages": 5}, (512, 512, 512), then),
            row(TILE, (1024, 1024, 1024), "0" * 64),
            row({**TILE, "unaligned_rows": 1}, (256, 256, 256), today)]
    real = carry.identities

    def fifth_differs(asked, gpu_spec, cache_dir=None, threads=None):
        found = real(asked, gpu_spec, cache_dir, threads)
        return [("changed" if json.loads(r["params"])["stages"] == 5 else i)
                for r, i in zip(asked, found)]

    monkeypatch.setattr(carry, "identities", fifth_differs)
    out, report = carry.carry_over(rows, REV, "h100_sxm", ROOT, tmp_path / "cache")
    assert report == {"gemm_tf32": (3, 2)}
    # the parameters REV did not have, at today's defaults: unaligned_rows 1, split_tail 0, c_staged 0
    completed = json.dumps({**TILE, "unaligned_rows": 1, "split_tail": 0, "c_staged": 0}, sort_keys=True)
    for r in (out[0], out[2]):
        assert r["params"] == completed and r["source_sha256"] == today and r["carried_from"] == then
    assert out[1]["same_as"] == completed and out[1]["carried_from"] == then
    assert json.loads(out[1]["params"])["unaligned_rows"] == 1
    assert out[3:] == rows[3:]  # left: another build, a source REV did not have, today's own


def test_a_same_as_row_goes_back_when_its_source_row_is_not_carried():
    """The file keeps each same_as row beside its source row: when the source stays another
    source's, so does the same_as row."""
    rows = [row(TILE, (8, 8, 8), "a"), row({**TILE, "stages": 5}, (8, 8, 8), "a",
                                           same_as=json.dumps(TILE, sort_keys=True))]
    out = [dict(rows[0]), {**rows[1], "carried_from": "a", "source_sha256": "b", "params": "{}"}]
    assert carry._twins_apart(out, rows) == set()
    assert out == rows


def test_a_same_as_row_not_carried_beside_its_carried_source_row_is_dropped():
    """Today's code builds the source row's launch as REV did but not the twin's: the twin's
    figures were that launch's, so it goes, to be measured again; the write then holds."""
    source = json.dumps(TILE, sort_keys=True)
    rows = [row(TILE, (8, 8, 8), "a"), row({**TILE, "stages": 5}, (8, 8, 8), "a", same_as=source),
            row({**TILE, "stages": 6}, (8, 8, 8), "a", same_as=source)]
    out = [{**rows[0], "carried_from": "a", "source_sha256": "b"}, dict(rows[1]),
           {**rows[2], "carried_from": "a", "source_sha256": "b"}]
    assert carry._twins_apart(out, rows) == {1}
    assert out[2]["source_sha256"] == "b"


def test_the_writer_refuses_a_twin_of_another_source_than_its_source_row(tmp_path):
    source = json.dumps(TILE, sort_keys=True)
    rows = [row(TILE, (8, 8, 8), "b"), row({**TILE, "stages": 5}, (8, 8, 8), "a", same_as=source)]
    with pytest.raises(ConfigError) as info:
        evidence.write(rows, tmp_path / "e.csv")
    assert "rule:" in str(info.value) and "another source" in str(info.value)
    assert not (tmp_path / "e.csv").exists()


def test_a_rev_that_is_no_commit_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        carry._tree_at(ROOT, "no-such-revision", tmp_path)
    assert "rule:" in str(info.value) and "no-such-revision" in str(info.value)


def test_carry_over_of_an_evidence_file_of_todays_sources_changes_nothing(tmp_path, capsys):
    """Every row of today's sources: nothing is built, the file stays as it was."""
    from src.tune import command

    path = tmp_path / "e.csv"
    evidence.write([row({**TILE, "unaligned_rows": 1}, (512, 512, 512),
                        evidence.source_sha256("gemm_tf32"))], path)
    before = path.read_text()
    assert command.main(["--gpu", "h100_sxm", "--csv", str(path), "--carry-over", "HEAD"]) == 0
    assert "nothing to carry over" in capsys.readouterr().out and path.read_text() == before
