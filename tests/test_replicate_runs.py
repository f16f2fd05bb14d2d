"""Producing replicates (src/sweep/replicate.py) on CPU: which rows of the published H100 sweep
run again, the fresh-process sweeps it launches, and collect reading them back with the sweep."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from src.records.collect import load_source, read_runs, records_from_runs
from src.sweep import replicate
from src.sweep.replicate import Problem, commands, select
from tests.conftest import ROOT

HEADLINE = {"20_wgmma_tf32", "cublas_tf32"}


@pytest.fixture(scope="module")
def records():
    return records_from_runs(read_runs(ROOT / "results" / "h100_sxm" / "runs.csv"))


def test_headline_rows_and_close_verdicts_are_selected(records):
    chosen = select(records, HEADLINE, 5.0)
    picked = {(k, p.m) for p, kernels in chosen.items() for k in kernels}
    assert {(k, m) for k in HEADLINE for m in (1024, 2048, 4096, 8192)} <= picked
    near: dict[tuple, bool] = {}  # a row (kernel, size) is picked when any of its runs is close
    for r in records:
        if r.kernel in HEADLINE or r.backend == "cublas" or not r.ok:
            continue
        near[(r.kernel, r.m)] = near.get((r.kernel, r.m), False) or any(
            low is not None and low < 105 and high > 95 for low, high in
            ((r.pct_ci_low, r.pct_ci_high), (r.pct_best_ci_low, r.pct_best_ci_high)))
    assert any(near.values()) and not all(near.values())
    for row, close in near.items():
        assert (row in picked) == close, row
    assert ("21_ffma_hopper", 4096) in picked and ("01_naive", 1024) not in picked
    assert ("cublas_fp32", 1024) not in picked  # a baseline row only as a headline
    # no headline and within 0%: exactly the rows whose interval holds 100% (the ties)
    ties = {(r.kernel, r.m) for r in records if r.ok and r.backend != "cublas"
            and any(low is not None and low < 100 < high for low, high in
                    ((r.pct_ci_low, r.pct_ci_high), (r.pct_best_ci_low, r.pct_best_ci_high)))}
    assert {(k, p.m) for p, kernels in select(records, set(), 0.0).items() for k in kernels} == ties


def test_rows_whose_paired_baseline_drifted_are_selected(records):
    """--baseline-drift P: a row whose paired cuBLAS ran more than P % from that baseline's median
    over the sweep's rows of its problem is replicated (its % of cuBLAS carries the baseline's luck
    of that job); the others are not, and without the option nothing changes."""
    rows = []
    for r in records:
        if r.ok and r.backend != "cublas" and r.m == 2048 and r.baseline == "cublas_fp32" \
                and r.kernel not in {x.kernel for x in rows}:
            row = copy.deepcopy(r)
            row.baseline_gflops, row.pct_ci_low, row.pct_ci_high = 50_000.0, 40.0, 42.0
            row.pct_best_ci_low = row.pct_best_ci_high = None
            rows.append(row)
    assert len(rows) >= 5
    rows[1].baseline_gflops, rows[2].baseline_gflops = 51_000.0, 49_500.0  # +2%, -1%
    chosen = select(rows, set(), 5.0, drift=1.5)
    assert [k for kernels in chosen.values() for k in kernels] == [rows[1].kernel]
    assert select(rows, set(), 5.0) == {} and select(rows, set(), 5.0, drift=0.5) == {
        Problem(2048, 2048, 2048, rows[0].alpha, rows[0].beta): [rows[1].kernel, rows[2].kernel]}


def test_failed_rows_are_not_replicated(records):
    row = copy.deepcopy(next(r for r in records if r.kernel == "20_wgmma_tf32" and r.m == 1024))
    row.status = "failed_throttled"
    assert select([row], HEADLINE, 5.0) == {}


def test_each_problem_runs_in_its_own_fresh_sweep(tmp_path):
    chosen = {Problem(1024, 1024, 1024, 1.0, 0.0): ["20_wgmma_tf32", "cublas_tf32"],
              Problem(511, 513, 8191, 0.5, 3.0): ["25_wgmma_tf32_any_shape"]}
    made = commands(tmp_path, chosen, 3, ["bench=default", "bench.best_cublas=true"])
    assert [where for where, _ in made] == [tmp_path / "replicates" / "run3" / "1024x1024x1024",
                                            tmp_path / "replicates" / "run3" / "511x513x8191"]
    cmd = made[1][1]
    assert cmd[:5] == [sys.executable, "-m", "src.run", "-m", "kernel=25_wgmma_tf32_any_shape"]
    assert {"m=511", "n=513", "k=8191", "alpha=0.5", "beta=3.0", "replicate=3",
            "bench=default", f"hydra.sweep.dir={made[1][0]}"} <= set(cmd)
    assert made[0][1][4] == "kernel=20_wgmma_tf32,cublas_tf32"


def _sweep(tmp_path, records, names):
    for i, r in enumerate(records):
        r.write(tmp_path / names[i])


def test_main_runs_each_replicate_and_fails_when_a_sweep_has_no_ok_job(tmp_path, records, monkeypatch):
    rows = [copy.deepcopy(r) for r in records if r.m == 1024 and r.kernel in HEADLINE | {"01_naive"}]
    _sweep(tmp_path, rows, [f"{i}_{r.kernel}_1024x1024x1024" for i, r in enumerate(rows)])
    launched = []
    monkeypatch.setattr(replicate.subprocess, "run",
                        lambda cmd: launched.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert replicate.main([str(tmp_path), "--runs", "3", "--headline", ",".join(sorted(HEADLINE)),
                           "--", "bench=default"]) == 0
    assert [c[4] for c in launched] == ["kernel=20_wgmma_tf32,cublas_tf32"] * 2
    assert [next(a for a in c if a.startswith("replicate=")) for c in launched] == ["replicate=2", "replicate=3"]
    assert all("bench=default" in c for c in launched)
    monkeypatch.setattr(replicate.subprocess, "run",
                        lambda cmd: subprocess.CompletedProcess(cmd, 1))
    assert replicate.main([str(tmp_path), "--runs", "2", "--headline", "cublas_tf32"]) == 1


def test_a_bad_option_names_the_rule(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        replicate.main([str(tmp_path), "--runs", "2", "--first", "1"])
    assert exited.value.code == 2 and "replicate 1 is the sweep itself" in capsys.readouterr().err


def test_collect_reads_the_replicate_sweeps_with_the_sweep(tmp_path, records):
    first = copy.deepcopy(next(r for r in records if r.kernel == "20_wgmma_tf32" and r.m == 1024))
    again = copy.deepcopy(first)
    again.replicate = 2
    first.write(tmp_path / "0_20_wgmma_tf32_1024x1024x1024")
    again.write(tmp_path / "replicates" / "run2" / "1024x1024x1024" / "0_20_wgmma_tf32_1024x1024x1024")
    jobs = load_source(tmp_path)
    assert [job for job, _ in jobs] == ["0_20_wgmma_tf32_1024x1024x1024",
                                        "replicates/run2/1024x1024x1024/0_20_wgmma_tf32_1024x1024x1024"]
    assert [r.replicate for _, r in jobs] == [first.replicate, 2]
