"""The held-out report (src/publish/heldout.py) from recorded rows: real H100 suite records
(tests/data/suite_h100_exploration.csv, dispatched as in tests/runs_fixture) stand in for a
held-out sweep's runs; the report's figures are recomputed here from those rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from src.job import autotune
from src.job.config import kernel_config
from src.publish import dispatched, heldout
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


def test_rows_measured_through_an_earlier_dispatch_are_counted_listed_and_keep_a_goal_unmet(tmp_path, capsys):
    """RECORDED: the H200's published held-out runs (results/h200/heldout_runs.csv) against today's
    conf/tuned/h200.yaml. Whatever a re-fit has moved since is the baseline set; then one FP32 row
    outside it is edited to record another tile (as if a re-fit had moved its choice since) and
    one TF32 row to record another kernel. Both are counted as measured through an earlier
    dispatch, listed with what today's dispatch runs, printed by `--stale` as MxNxK sweeps, and
    the FP32 goal reads unmet whatever its figures; publishing without --out-dir is refused."""
    import json

    from src.records.collect import read_runs
    from src.paths import ROOT

    recorded = ROOT / "results" / "h200" / "heldout_runs.csv"
    runs = read_runs(recorded)
    before = {key for key, now in dispatched.dispatched_today(runs, "h200").items() if now}
    fp32 = runs[(runs.kernel == "best_fp32") & (runs.dispatched_to == "gemm_3xtf32")]
    fp32 = fp32[[("best_fp32", int(r.m), int(r.n), int(r.k)) not in before for r in fp32.itertuples()]].index[0]
    params = json.loads(runs.at[fp32, "params"])
    params["stages"] = params["stages"] + 2
    runs.at[fp32, "params"] = json.dumps(params)
    tf32 = runs[(runs.kernel == "best_tf32") & (runs.dispatched_to == "gemm_tf32")]
    tf32 = tf32[[("best_tf32", int(r.m), int(r.n), int(r.k)) not in before for r in tf32.itertuples()]].index[-1]
    runs.at[tf32, "dispatched_to"] = "gemm_tf32_swapped"
    edited = tmp_path / "runs.csv"
    runs.to_csv(edited, index=False)

    metrics = heldout.publish(edited, tmp_path / "h200", "h200")["h200"]
    moved = {(r.kernel, int(r.m), int(r.n), int(r.k)) for r in runs.loc[[fp32, tf32]].itertuples()}
    assert metrics["fp32"]["earlier_dispatch"] + metrics["tf32"]["earlier_dispatch"] == len(before) + 2
    assert not metrics["fp32"]["goal_met"]
    text = (tmp_path / "h200" / "heldout.md").read_text()
    assert "## best_fp32: measured through an earlier dispatch" in text
    shape = lambda key: f"{key[1]}x{key[2]}x{key[3]}"  # noqa: E731
    runs_now = {"best_fp32": "gemm_3xtf32 {", "best_tf32": "gemm_tf32 {"}  # the recorded choices, today
    for key in moved:  # in its own dispatcher's section: a shape may be listed under both
        section = text.split(f"## {key[0]}: measured through an earlier dispatch")[1].split("\n## ")[0]
        line = next(x for x in section.splitlines() if x.startswith(f"| {shape(key)} |") and "{" in x)
        assert line.split(" | ")[-1].removeprefix("autotune from ").startswith(runs_now[key[0]])
    published = pd.read_csv(tmp_path / "h200" / "heldout.csv")
    assert published.dispatch_now.notna().sum() == len(before) + 2

    assert heldout.main([str(edited), "--gpu", "h200", "--stale"]) == 0
    lines = capsys.readouterr().out.split("\n")
    for key in moved:
        assert shape(key) in next(x for x in lines if x.startswith(key[0] + " ")).split(" ")[1].split(",")
    with pytest.raises(SystemExit):
        heldout.main([str(edited), "--gpu", "h200"])
    assert "--out-dir is required" in capsys.readouterr().err


def test_a_row_whose_params_build_todays_launch_is_measured_through_todays_dispatch(monkeypatch):
    """RECORDED: the H200's held-out row at 2x338x1906 (best_tf32, gemm_ffma_skinny; the rules
    alone, results/tuning/probes/h200_heldout_tf32_replicate_1204_runs.csv). At two rows
    of C the skinny kernel clamps `rows_per_warp`, so params that differ only there build the same
    entry, grid and block (the tuner's twins, KernelSpec.launch_identity): the row measured what
    today's dispatch runs. Params that build another launch (half the warps a block) are an
    earlier dispatch, listed with today's choice."""
    import json

    from src.job.gpu import limits_from_spec
    from src.job.problem import Problem
    from src.job.spec import candidate_spec
    from src.paths import ROOT
    from src.records.collect import read_runs

    # the row was measured by the rules alone: today's dispatch with autotune off is its own
    monkeypatch.setattr(autotune, "default_settings", lambda: autotune.Settings(enabled=False))
    runs = read_runs(ROOT / "results" / "tuning" / "probes" / "h200_heldout_tf32_replicate_1204_runs.csv")
    at = runs[(runs.kernel == "best_tf32") & (runs["size"] == "2x338x1906")].index[0]
    key = ("best_tf32", 2, 338, 1906)
    assert runs.at[at, "dispatched_to"] == "gemm_ffma_skinny" and dispatched.dispatched_today(runs, "h200")[key] is None
    params = json.loads(runs.at[at, "params"])
    spec = lambda p: candidate_spec({**kernel_config("gemm_ffma_skinny"), "precision": "tf32"}, p,  # noqa: E731
                                    Problem(2, 338, 1906, 0.5, 3.0), limits_from_spec("h200"))
    for rows_per_warp, warps, same in ((1, params["warps"], True), (4, params["warps"], True),
                                       (params["rows_per_warp"], params["warps"] // 2, False)):
        edited = {**params, "rows_per_warp": rows_per_warp, "warps": warps}
        assert (spec(edited).launch_identity() == spec(params).launch_identity()) is same
        runs.at[at, "params"] = json.dumps(edited)
        now = dispatched.dispatched_today(runs, "h200")[key]
        assert (now is None) is same and (same or now.startswith("gemm_ffma_skinny {"))


def test_with_autotune_on_a_row_is_todays_where_autotune_acts_then_and_now_from_one_rules_choice(monkeypatch):
    """RECORDED: the H200's held-out set with autotune on (results/tuning/probes/
    h200_heldout_autotune_{tf32,fp32_half_a}_1205_runs.csv, 2026-12-05: TF32 before the margin,
    FP32 with it) and a TF32 run of the rules alone (h200_heldout_tf32_replicate_1204_runs.csv). With
    autotune on by default (conf/dispatch/default.yaml) every FP32 probe row is today's dispatch;
    a TF32 probe row is an earlier one exactly where it switched to a candidate the recorded brief
    timings put no more than the margin ahead of the rule's choice (today the rule's choice runs
    there). A row of the rules alone is an earlier one exactly where the probe autotuned (autotune now
    measures candidates there: "autotune from" the rule's choice). A probe row whose rule's choice
    is edited to another launch, or recorded as not autotuned, is an earlier dispatch. These runs
    predate dispatch.autotune_variants and best_fp32's 8 candidates, so it is read with no variant
    and 4 candidates (as they were measured). Since
    2026-12-06 autotune also measures a near shape whose nearest training shape measured the
    rule's choice more than the margin below its best there (src/job/autotune_coverage.py): the
    probes' rows left to the rules there (`not_needed`: FP32 2x23936x3328; TF32 131^3, 349^3, 506x49x138)
    are earlier dispatches too."""
    import json
    import re
    from dataclasses import replace

    from src.paths import ROOT
    from src.records.collect import read_runs

    without_variants = replace(autotune.default_settings(), variants=(), candidates=4, counts=())
    monkeypatch.setattr(autotune, "default_settings", lambda: without_variants)
    probes = ROOT / "results" / "tuning" / "probes"
    fp32 = read_runs(probes / "h200_heldout_autotune_fp32_half_a_1205_runs.csv")
    assert autotune.default_settings().enabled and autotune.default_settings().margin == 0.02
    assert (fp32.autotuned == "measured").sum() == 25
    disagreed = {("best_fp32", 2, 23936, 3328)}  # the nearest shape's evidence: now measured
    assert set(fp32[fp32.autotuned == "not_needed"].apply(lambda r: ("best_fp32", r.m, r.n, r.k), axis=1)) >= disagreed
    assert {key for key, now in dispatched.dispatched_today(fp32, "h200").items() if now} == disagreed

    probe = read_runs(probes / "h200_heldout_autotune_tf32_1205_runs.csv")
    marginal = set()
    for r in probe[probe.autotuned == "measured"].itertuples():
        lines = json.loads(r.autotune_candidates)
        timed = [re.search(r": ([\d,]+) GFLOP/s", x) for x in lines]  # a left-out line has none
        gflops = [float(t[1].replace(",", "")) if t else 0.0 for t in timed]
        ran = next(i for i, x in enumerate(lines) if x.endswith("<- runs"))
        if ran and gflops[ran] <= 1.02 * gflops[0]:
            marginal.add(("best_tf32", int(r.m), int(r.n), int(r.k)))
    assert len(marginal) == 10
    disagreed = {("best_tf32", 131, 131, 131), ("best_tf32", 349, 349, 349), ("best_tf32", 506, 49, 138)}
    assert all(r.autotuned == "not_needed" for r in probe.itertuples() if ("best_tf32", r.m, r.n, r.k) in disagreed)
    assert {key for key, now in dispatched.dispatched_today(probe, "h200").items() if now} == marginal | disagreed

    rules_alone = read_runs(probes / "h200_heldout_tf32_replicate_1204_runs.csv")
    now = dispatched.dispatched_today(rules_alone, "h200")
    measured = {("best_tf32", int(r.m), int(r.n), int(r.k)): r.autotuned for r in probe.itertuples()}
    assert set(now) == set(measured)
    for key, runs_now in now.items():
        assert (runs_now is not None) == (measured[key] == "measured" or key in disagreed), key
        assert runs_now is None or runs_now.startswith("autotune from ")

    at = fp32[fp32.autotuned == "measured"].index[0]
    lines = json.loads(fp32.at[at, "autotune_candidates"])
    (kernel, params), _ = autotune.recorded(lines, 0.02)
    other = {**params, "stages": params["stages"] + 2}
    edited = fp32.copy()
    edited.at[at, "autotune_candidates"] = json.dumps(
        [lines[0].replace(json.dumps(params, sort_keys=True), json.dumps(other, sort_keys=True))] + lines[1:])
    assert autotune.recorded(edited.at[at, "autotune_candidates"], 0.02)[0] == (kernel, other)
    key = (edited.at[at, "kernel"], *(int(edited.at[at, d]) for d in "mnk"))
    got = dispatched.dispatched_today(edited.loc[[at]], "h200")[key]
    prefix = f"autotune from {kernel} "
    assert got.startswith(prefix), got
    # the rule's choice the row recorded, named as today's tuned file names it: a parameter added
    # since (carried over at its default, as split_by 1) comes in at the kernel config's default
    named = json.loads(got[len(prefix):])
    defaults = kernel_config(kernel)["params"]
    assert named == {**{p: defaults[p] for p in named if p not in params}, **params}, got
    edited = fp32.copy()
    edited.at[at, "autotuned"] = None  # as if the rules alone had chosen there
    assert dispatched.dispatched_today(edited.loc[[at]], "h200")[key].startswith("autotune from ")


@pytest.mark.parametrize("module", ["heldout", "suite"])
def test_a_report_from_a_runs_csv_that_is_not_there_is_refused_with_the_rule(module, tmp_path, capsys):
    """`python -m src.publish.heldout` and `.suite` on a missing runs CSV: argparse's one-line
    refusal naming the file the stage collects (it was a FileNotFoundError's traceback), and
    nothing written."""
    import importlib

    main = importlib.import_module(f"src.publish.{module}").main
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "gone.csv"), "--gpu", "h200", "--out-dir", str(tmp_path / "set")])
    assert info.value.code == 2 and not (tmp_path / "set").exists()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gone.csv'} is not a file (rule: the " in err and "_runs.csv, which the " in err
