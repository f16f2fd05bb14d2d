"""The two-stage tuning plan of `sgemm-lab tune` (src/tune/plan.py, src/tune/screen.py,
src/tune/command.py) and how the fit reads two-stage evidence (src/tune/fit.py), on the CPU.

Every figure here is SYNTHETIC (made up in this file from simple laws or a hash of the candidate
and shape, not measured on any GPU): the tests check which jobs are planned and which candidates
survive and can be chosen, never a GPU figure; one test, marked RECORDED, screens rows
recorded by a real H200 tune (tests/data/). The sweeps of the command are stood in for by a
function that writes records as the tuning sweeper does, with a dictionary for the measurement
cache."""

from __future__ import annotations

import json
import random
import zlib

import pytest


from src.errors import ConfigError
from src.job.training import NearestModel
from src.job.training import read as read_evidence
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.paths import ROOT
from src.records.record import Record
from src.tune import budget, command, distribution, fit, partial, refit, screen, sweeps
from src.tune import plan as plan_mod
from src.tune import space as tune

H100 = limits_from_spec("h100_sxm")


def settings(**screen_settings) -> dict:
    data = plan_mod.load_settings()
    data["screen"] = {**data["screen"], **screen_settings}
    return data


def test_screening_shapes_are_the_first_of_the_round_robin_over_the_classes():
    training = distribution.training()
    classes = {s.cls for s in training if not s.added}  # stage 3's shapes are never screened
    screen_shapes, rest = plan_mod.screening(training, settings(shapes=len(classes)))
    assert screen_shapes == distribution.stratified(training, len(classes))
    assert {s.cls for s in screen_shapes} == classes          # one of each class
    assert {s.dims for s in screen_shapes}.isdisjoint(s.dims for s in rest)
    assert sorted(s.dims for s in screen_shapes + rest) == sorted(s.dims for s in training)
    assert rest == [s for s in training if s not in screen_shapes]  # in their planned order
    # the committed setting takes every class; no `screen` (or too many) is one stage
    committed, _ = plan_mod.screening(training, plan_mod.load_settings())
    assert {s.cls for s in committed} == classes
    assert plan_mod.screening(training[:5], settings(shapes=None)) == (training[:5], [])
    assert plan_mod.screening(training[:5], settings(shapes=5)) == (training[:5], [])


def test_before_the_screen_stage_two_is_every_candidate_at_the_other_shapes():
    """The upper bound: the two stages together plan exactly the one-stage plan's jobs, stage 1
    at the screening shapes and stage 2 at the rest."""
    shapes = distribution.stratified(distribution.training(), 14)
    staged = plan_mod.build("h100_sxm", shapes, settings(shapes=10))
    whole = plan_mod.build("h100_sxm", shapes, settings(shapes=None))
    assert not whole.rest and not whole.stage2 and not staged.screened
    assert [s.dims for s in staged.rest] == [s.dims for s in shapes[10:]]
    assert staged.jobs == whole.jobs
    per_kernel = {}
    for sweep in staged.sweeps + staged.stage2:
        per_kernel[(sweep.dispatcher, sweep.kernel)] = \
            per_kernel.get((sweep.dispatcher, sweep.kernel), 0) + sweep.jobs
    assert per_kernel == {(s.dispatcher, s.kernel): s.jobs for s in whole.sweeps}
    rest = {s.dims for s in staged.rest}  # a kernel measured at none of them has no stage 2
    assert {s.name for s in staged.stage2} == {s.name + "_stage2" for s in whole.sweeps
                                               if rest & {shape.dims for shape in s.shapes}}
    assert all(s.stage == 2 and s.candidates is None for s in staged.stage2)


def test_a_candidate_is_measured_only_where_its_measured_where_holds_and_carries_it_as_a_guard():
    """conf/tuning/dispatch.yaml's measured_where: gemm_ffma's sweeps hold only the training shapes
    where its `when` holds (narrow or tiny products), the others are counted as skipped under that
    rule, and the fit's guard for it is that `when` (its rules carry it, like a size constraint)."""
    data = plan_mod.load_settings()
    own = data["measured_where"]["gemm_ffma"]["when"]
    where = plan_mod.measured_where(data)["gemm_ffma"]  # its own, outside the reserved regions
    assert own in where
    shapes = distribution.stratified(distribution.training(), 24)
    plan = plan_mod.build("h100_sxm", shapes, settings(shapes=None))
    ffma = [s for s in plan.sweeps if s.kernel == "gemm_ffma"]
    assert {s.dispatcher for s in ffma} == set(data["dispatchers"])
    outside = [s for s in shapes if not fit.holds(where, s.dims)]
    assert outside and len(outside) < len(shapes)
    for sweep in ffma:
        assert sweep.shapes and all(fit.holds(where, s.dims) for s in sweep.shapes)
        assert sweep.skipped[f"measured_where: {where}"] == len(outside)
    tree = refit.guards(data, outside_reserved=False)
    assert tree["gemm_ffma"] == own and tree["gemm_ffma_skinny"] == "min(m, n) <= 32"
    assert refit.guards(data)["gemm_ffma"] == where
    assert tree["gemm_tf32"] is None


def test_a_reserved_region_is_measured_and_chosen_for_its_owner_alone():
    """conf/tuning/dispatch.yaml's `reserved`: at the training shapes of gemm_ffma_skinny's region
    (the matrix-vector products) no other candidate's sweep holds the shape, the skinny kernel's
    do; every other candidate's guard (the nearest model's and the screen's) excludes the region,
    the tree's guards do not (the region is a rule of its own, first: tests/test_fit.py). A region
    whose owner is no candidate, or without a `when`, is a ConfigError naming the rule."""
    data = plan_mod.load_settings()
    region = data["reserved"]["gemm_ffma_skinny"]["when"]
    shapes = distribution.stratified(distribution.training(), 48)
    inside = [s for s in shapes if fit.holds(region, s.dims)]
    assert inside and len(inside) < len(shapes)
    plan = plan_mod.build("h100_sxm", shapes, settings(shapes=None))
    for sweep in plan.sweeps:
        held = {s.dims for s in sweep.shapes}
        if sweep.kernel == "gemm_ffma_skinny":
            assert {s.dims for s in inside} <= held
        elif not sweep.fallback:
            assert not held & {s.dims for s in inside}, sweep.name
    guards, tree = refit.guards(data), refit.guards(data, outside_reserved=False)
    for kernel in partial.candidates(data) - {"gemm_ffma_skinny", data["fallback"]["kernel"]}:
        assert all(not fit.holds(guards[kernel], s.dims) for s in inside), kernel
        assert tree[kernel] is None or any(fit.holds(tree[kernel], s.dims) for s in inside), kernel
    assert guards["gemm_ffma_skinny"] == tree["gemm_ffma_skinny"]
    for bad in ({"gemm_ffma_skinny": {}}, {"17_flagship": {"when": "m <= 2"}},
                {"no_such_kernel": {"when": "m <= 2"}}):
        with pytest.raises(ConfigError, match="rule: a reserved region"):
            plan_mod.measured_where({**data, "reserved": bad})


def test_a_kernel_the_screen_misses_is_screened_at_shapes_of_its_own_region():
    """`screen.region_shapes`: gemm_ffma_narrow's region (few columns or rows, a large operand to
    stream) holds none of the screening shapes, so stage 1 measures its whole grid at the first 2
    of its region's stage-2 shapes (planned order), for each dispatcher; its stage-2 survivors are
    measured at its other region shapes, not again at those 2. No count, no extra sweep; a count the
    screening shapes already meet (gemm_ffma_skinny's 3), none either; an unknown kernel is a
    ConfigError naming the rule."""
    shapes = distribution.stratified(distribution.training(), 144)
    data = settings(shapes=12, region_shapes={"gemm_ffma_narrow": 2})
    where = plan_mod.measured_where(data)["gemm_ffma_narrow"]
    staged = plan_mod.build("h200", shapes, data)
    screening = [s for s in shapes if s not in staged.rest]
    assert not any(fit.holds(where, s.dims) for s in screening)
    own = [s for s in staged.rest if fit.holds(where, s.dims)]
    assert len(own) > 2 and staged.region == {"gemm_ffma_narrow": own[:2]}
    region = [s for s in staged.sweeps if s.name.endswith("_region")]
    assert {s.dispatcher for s in region} == set(data["dispatchers"])
    assert all(s.kernel == "gemm_ffma_narrow" and s.shapes == own[:2] and s.candidates is None
               and s.jobs > 0 for s in region)
    assert "gemm_ffma_narrow at 2 more of its own" in staged.describe(1.0, 1)
    # a survivor every region shape allows (warps_k > 1 builds at few rows only)
    narrow = [p for p in tune.grid(plan_mod.kernel_space("gemm_ffma_narrow")) if p.get("warps_k", 1) == 1]
    kept = {(d, "gemm_ffma_narrow"): {tune.params_key(narrow[0])} for d in data["dispatchers"]}
    second = plan_mod.build("h200", shapes, data, kept)
    assert [s.name for s in second.sweeps] == [s.name for s in staged.sweeps]
    for dispatcher in data["dispatchers"]:  # its stage-2 sweeps (few rows, few columns) cover the rest
        sweeps = [s for s in second.stage2 if s.kernel == "gemm_ffma_narrow" and s.dispatcher == dispatcher]
        assert sorted(s.dims for sweep in sweeps for s in sweep.shapes) == sorted(s.dims for s in own[2:])
        assert all(sweep.candidates == [narrow[0]] for sweep in sweeps), dispatcher
    assert plan_mod.build("h200", shapes, settings(shapes=12, region_shapes={})).region == {}
    skinny = settings(shapes=12, region_shapes={"gemm_ffma_skinny": 2})
    assert plan_mod.build("h200", shapes, skinny).region == {}
    with pytest.raises(ConfigError, match="rule: a region screen"):
        plan_mod.build("h200", shapes, settings(shapes=12, region_shapes={"no_such_kernel": 1}))


def row(dispatcher, kernel, params, shape, ratio, status="ok", stage=1):
    m, n, k = shape
    return {"dispatcher": dispatcher, "kernel": kernel, "params": params, "shape": f"{m}x{n}x{k}",
            "m": m, "n": n, "k": k, "status": status, "ratio_best": ratio, "ratio": ratio,
            "stage": stage}


P = {name: json.dumps({"bm": i}, sort_keys=True) for i, name in enumerate("ABCDEFG")}
SKINNY = json.dumps({"warps": 8}, sort_keys=True)
GUARDS = {"gemm_tf32": None, "gemm_ffma_skinny": "min(m, n) <= 32", "gemm_3xtf32": None}


def test_survivors_come_within_the_margin_at_some_screening_shape_of_their_dispatcher():
    """SYNTHETIC: A is the best at the first shape and B within 2% there; C is best at the second
    shape only; D is 4% behind everywhere, E only within the margin where it failed; the skinny
    kernel wins its skinny shape. Another dispatcher's figures never count."""
    s1, s2, s3 = (512, 512, 512), (4096, 4096, 4096), (8, 4096, 4096)
    tf = "best_tf32"
    rows = [row(tf, "gemm_tf32", P["A"], s1, 1.00), row(tf, "gemm_tf32", P["B"], s1, 0.98),
            row(tf, "gemm_tf32", P["C"], s1, 0.50), row(tf, "gemm_tf32", P["D"], s1, 0.96),
            row(tf, "gemm_tf32", P["E"], s1, None, status="failed_verification"),
            row(tf, "gemm_tf32", P["A"], s2, 0.80), row(tf, "gemm_tf32", P["B"], s2, 0.70),
            row(tf, "gemm_tf32", P["C"], s2, 1.10), row(tf, "gemm_tf32", P["D"], s2, 1.05),
            row(tf, "gemm_tf32", P["E"], s2, 0.90),
            row(tf, "gemm_tf32", P["A"], s3, 0.30), row(tf, "gemm_tf32", P["B"], s3, 0.20),
            row(tf, "gemm_tf32", P["C"], s3, 0.20), row(tf, "gemm_tf32", P["D"], s3, 0.20),
            row(tf, "gemm_tf32", P["E"], s3, 0.20), row(tf, "gemm_ffma_skinny", SKINNY, s3, 1.4),
            # best_fp32: G far ahead of A there; it must not drop A from best_tf32
            row("best_fp32", "gemm_3xtf32", P["G"], s1, 5.0),
            row("best_fp32", "gemm_3xtf32", P["A"], s1, 1.0)]
    kept = screen.survivors(rows, settings(margin=0.03), GUARDS)
    assert kept[("best_tf32", "gemm_tf32")] == {P["A"], P["B"], P["C"]}
    assert kept[("best_tf32", "gemm_ffma_skinny")] == {SKINNY}
    assert kept[("best_fp32", "gemm_3xtf32")] == {P["G"]}
    # a wider margin lets D in (4% behind); order does not matter
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    assert screen.survivors(shuffled, settings(margin=0.05), GUARDS)[("best_tf32", "gemm_tf32")] \
        == {P["A"], P["B"], P["C"], P["D"]}


def test_the_screens_catch_all_survives_so_the_fit_keeps_one():
    """SYNTHETIC: each of A and B is best where it runs but misses a screening shape; C runs at
    all of them, never within the margin: it survives as the catch-all the fit needs."""
    s1, s2 = (512, 512, 512), (4096, 4096, 4096)
    rows = [row("best_tf32", "gemm_tf32", P["A"], s1, 1.0),
            row("best_tf32", "gemm_tf32", P["B"], s2, 1.0),
            row("best_tf32", "gemm_tf32", P["C"], s1, 0.8),
            row("best_tf32", "gemm_tf32", P["C"], s2, 0.8),
            row("best_tf32", "gemm_tf32", P["D"], s2, 0.9)]
    kept = screen.survivors(rows, settings(margin=0.03), GUARDS)
    assert kept[("best_tf32", "gemm_tf32")] == {P["A"], P["B"], P["C"]}


def test_stage_two_measures_the_survivors_and_the_whole_grid_only_where_none_builds():
    shapes = distribution.stratified(distribution.training(), 16)
    cfg = settings(shapes=10)
    tf32 = tune.grid(plan_mod.kernel_space("gemm_tf32"))
    skinny = tune.grid(plan_mod.kernel_space("gemm_ffma_skinny"))
    big = next(p for p in tf32 if p["bm"] == 256 and p["bn"] == 128)  # not built everywhere
    kept = {("best_tf32", "gemm_tf32"): {tune.params_key(p) for p in (tf32[1], big)},
            ("best_tf32", "gemm_ffma_skinny"): {tune.params_key(skinny[0])}}
    staged = plan_mod.build("h100_sxm", shapes, cfg, kept)
    assert staged.screened and [s.name for s in staged.sweeps] == \
        [s.name for s in plan_mod.build("h100_sxm", shapes, cfg).sweeps]  # stage 1 as before
    by_name = {s.name: s for s in staged.stage2}
    survivors = by_name["best_tf32_gemm_tf32_stage2"]
    assert survivors.candidates == [tf32[1], big]  # in grid order
    expected, where = 0, plan_mod.measured_where(cfg).get("gemm_tf32")
    measured = [shape for shape in staged.rest if fit.holds(where, shape.dims)]
    for shape in measured:
        problem = Problem(*shape.dims, 0.5, 3.0)
        expected += len(tune.prune(plan_mod.candidate_config("gemm_tf32", "tf32"),
                                   [tf32[1], big], problem, H100).valid)
    assert survivors.jobs == expected > 0 and survivors.shapes == measured
    assert "best_tf32_gemm_ffma_skinny_stage2" in by_name
    # best_fp32 has no survivors: its rest shapes get the whole grids, as a screen never ran
    assert by_name["best_fp32_gemm_3xtf32_stage2_all"].candidates is None
    outside = plan_mod.measured_where(cfg).get("gemm_3xtf32")
    assert by_name["best_fp32_gemm_3xtf32_stage2_all"].shapes == \
        [shape for shape in staged.rest if fit.holds(outside, shape.dims)]
    assert not any(n.startswith("best_tf32") and n.endswith("_all") for n in by_name)
    assert staged.jobs < plan_mod.build("h100_sxm", shapes, cfg).jobs
    # the survivors reach the sweeper in their file (run_sweeps writes it), named by one override
    args = survivors.overrides(cfg, command.SWEEP_DIR)
    assert f"++tune.candidates_file={survivors.file(command.SWEEP_DIR, 'candidates')}" in args
    assert not any(a.startswith("++tune.candidates=") for a in args)
    assert "resume=false" not in " ".join(args)


def test_the_fit_chooses_only_what_stage_two_measured():
    """SYNTHETIC two-stage evidence: Z ran only at the four screening shapes (the screen dropped
    it); V1 and V2 beat it at each screening shape but each misses one; W runs everywhere. Over
    the screening shapes alone Z would win by the survivors' absence; it must not be chosen."""
    screen_shapes = [(16, 16, 16), (32, 32, 32), (48, 48, 48), (64, 64, 64)]
    rest = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024)]
    d, k = "best_tf32", "gemm_tf32"
    rows = []
    for i, s in enumerate(screen_shapes):
        rows.append(row(d, k, P["A"], s, 1.0))                          # W
        rows.append(row(d, k, P["C"], s, 1.2))                          # Z (dropped)
        rows.append(row(d, k, P["B"] if i % 2 else P["D"], s, 1.3))     # V1 / V2
    for s in rest:
        rows += [row(d, k, P["A"], s, 1.0, stage=2), row(d, k, P["B"], s, 1.1, stage=2),
                 row(d, k, P["D"], s, 1.1, stage=2)]
    settings_fit = {"max_depth": 4, "min_shapes": 2, "min_gain": 0.01, "features": ["m"]}
    tab = fit.table(rows, d)
    assert fit.Candidate(k, P["C"]) not in tab.candidates
    assert tab.shapes == sorted(screen_shapes + rest)
    rules = fit.rules_for(rows, d, GUARDS, settings_fit)
    assert rules and all(r["params"] != json.loads(P["C"]) for r in rules)
    assert rules[-1]["when"] == "True" and rules[-1]["params"] == json.loads(P["A"])
    # one-stage evidence (no stage 2 rows) is read as before: Z can be chosen there
    one_stage = [dict(r, stage=None) for r in rows if r["stage"] == 1]
    chosen = fit.rules_for(one_stage, d, GUARDS, settings_fit)
    assert any(r["params"] == json.loads(P["C"]) for r in chosen)


_PRUNINGS: dict = {}  # the stand-in's prunings: the same sweeps recur in every tune of a test


def _pruned(cfg: dict, candidates: list[dict], dims: tuple, limits: dict):
    key = (json.dumps(cfg, sort_keys=True, default=str), tuple(map(tune.params_key, candidates)),
           tuple(dims), json.dumps(limits, sort_keys=True))
    if key not in _PRUNINGS:
        _PRUNINGS[key] = tune.prune(cfg, candidates, Problem(*dims, 0.5, 3.0), limits)
    return _PRUNINGS[key]


def stand_in_sweeps(cache: dict, measured: list, cut_after: int | None = None, cut_by_sigterm=False):
    """run_sweeps as the tuning sweeper does it, with SYNTHETIC figures (a hash of candidate and
    shape): each sweep's candidates, pruned by the same rules and less those it holds
    (`held`, tune.held), a record each; a candidate already in `cache` is taken from it
    (resume=true), a new one is counted in `measured`. `cut_after`: a KeyboardInterrupt (Ctrl-C,
    a time limit's SIGINT) right after that many new records, in the middle of a sweep; with
    `cut_by_sigterm` a real SIGTERM to this process instead (SLURM's time limit or preemption)."""
    import os
    import shutil
    import signal

    from src.tune import evidence

    sources = {}

    def run(sweeps, settings, sweep_dir, extra, gpu_spec=None):
        limits = limits_from_spec("h100_sxm")
        for sweep in sweeps:
            sources.setdefault(sweep.kernel, evidence.source_sha256(sweep.kernel))
        for sweep in sweeps:
            target = sweep_dir / sweep.name
            if target.exists():
                shutil.rmtree(target)
            cfg = plan_mod.candidate_config(sweep.kernel, sweep.precision)
            candidates = sweep.candidate_list()
            for shape in sweep.shapes:
                pruning = _pruned(cfg, candidates, shape.dims, limits)
                held = set(sweep.held.get(shape.label, ()))
                for i, (params, spec) in enumerate(pruning.valid):
                    if tune.params_key(params) in held:
                        continue
                    key = (sweep.dispatcher, sweep.kernel, shape.label, tune.params_key(params))
                    if key not in cache:
                        measured.append(key)
                        pct = 50 + zlib.crc32(repr(key).encode()) % 60
                        cache[key] = dict(gflops=10.0 * pct, pct_of_best_cublas=float(pct),
                                          pct_best_ci_low=pct - 1.0, pct_best_ci_high=pct + 1.0,
                                          pct_of_cublas=float(pct))
                    Record(kernel=sweep.kernel, precision=sweep.precision, backend="nvrtc",
                           m=shape.m, n=shape.n, k=shape.k, alpha=0.5, beta=3.0,
                           params=spec.params, source_sha256=sources[sweep.kernel],
                           **cache[key]).write(
                        target / f"{i}_{sweep.kernel}_{shape.label}")
                    if len(measured) == cut_after:
                        if cut_by_sigterm:
                            os.kill(os.getpid(), signal.SIGTERM)
                        raise KeyboardInterrupt
        return 0
    return run


def test_two_stages_end_to_end_are_deterministic_and_resume_from_the_cache(tmp_path, monkeypatch,
                                                                          capsys):
    from src.cli import main as cli

    cache, measured = {}, []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps(cache, measured))
    count = plan_mod.load_settings()["screen"]["shapes"]
    args = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--sweep-dir", str(tmp_path / "sw"),
            "--csv", str(tmp_path / "e.csv"), "--tuned", str(tmp_path / "t.yaml")]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert f"stage 1 (screen): {count} shapes" in out and "stage 2: 4 shapes" in out
    assert "at most" in out.split("after the screen:")[0]
    assert "the survivors of the screen" in out.split("after the screen:")[1]
    rows_written = len(read_evidence(tmp_path / "e.csv"))
    assert f"(stages 1, 2) on 1 GPU(s); {rows_written} rows, 0 of them from the measurement cache" in out
    rows = read_evidence(tmp_path / "e.csv")
    first = [r for r in rows if r["stage"] == 1]
    second = [r for r in rows if r["stage"] == 2]
    assert first and second and len(first) + len(second) == len(rows)
    training = distribution.stratified(distribution.training(), count + 4)
    assert {r["shape"] for r in first} == {s.label for s in training[:count]}
    assert {r["shape"] for r in second} == {s.label for s in training[count:]}
    # stage 2 measured the survivors of stage 1's rows (or the whole grids where none builds)
    kept = screen.survivors(first, plan_mod.load_settings(), refit.guards(
        plan_mod.load_settings()))
    staged = plan_mod.build("h100_sxm", training, plan_mod.load_settings(), kept)
    listed = {(s.dispatcher, s.kernel): {tune.params_key(p) for p in s.candidates}
              for s in staged.stage2 if s.candidates is not None}
    assert listed and all(r["params"] in listed[(r["dispatcher"], r["kernel"])]
                          for r in second if (r["dispatcher"], r["kernel"]) in listed)
    assert len(second) < len(first) * 4 / count  # fewer candidates than the screen's
    assert len([k for k in measured if k[2] in {s.label for s in training[count:]}]) == \
        sum(s.jobs for s in staged.stage2)
    # every candidate that a rule or the catch-all chooses was measured in stage 2
    chosen = {(r["kernel"], json.dumps(r["params"], sort_keys=True))
              for rules in fit.fit(rows, refit.guards(plan_mod.load_settings()),
                                   {"min_shapes": 4}).values() for r in rules}
    assert chosen <= {(r["kernel"], r["params"]) for r in second}
    csv_text, tuned_text = (tmp_path / "e.csv").read_text(), (tmp_path / "t.yaml").read_text()
    # a re-run: every job from the cache, the same survivors, the same files
    count = len(measured)
    assert cli(args) == 0
    assert len(measured) == count
    assert (tmp_path / "e.csv").read_text() == csv_text
    assert (tmp_path / "t.yaml").read_text() == tuned_text
    # a dry run after the screen has run knows stage 2 exactly
    capsys.readouterr()
    assert cli(args + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "the survivors of the screen" in out and "at most" not in out
    assert f"{sum(s.jobs for s in staged.sweeps) + sum(s.jobs for s in staged.stage2)} jobs" in out


def test_a_partial_retune_measures_the_named_candidates_and_keeps_the_others_rows(
        tmp_path, monkeypatch, capsys):
    """`--kernels gemm_tf32`: only gemm_tf32's jobs run; the other candidates' rows come from the
    evidence file, into the screen (stage 2's gemm_tf32 survivors are those of the whole run) and
    into the evidence, which is the whole run's again (SYNTHETIC figures, the same law)."""
    from src.cli import main as cli

    count = plan_mod.load_settings()["screen"]["shapes"]
    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, []))
    assert cli(common + ["--sweep-dir", str(tmp_path / "whole")]) == 0
    whole = (tmp_path / "e.csv").read_text()
    tuned = (tmp_path / "t.yaml").read_text()
    rows = read_evidence(tmp_path / "e.csv")
    assert rows and all(r["source_sha256"] for r in rows)
    measured = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))  # an empty cache
    capsys.readouterr()
    assert cli(common + ["--sweep-dir", str(tmp_path / "part"), "--kernels", "gemm_tf32"]) == 0
    out = capsys.readouterr().out
    others = sum(1 for r in rows if r["kernel"] != "gemm_tf32")
    assert f"keeping {others} rows of the other candidates" in out
    assert measured and {k[1] for k in measured} == {"gemm_tf32"}
    assert len(measured) == len({(r["dispatcher"], r["shape"], r["params"]) for r in rows
                                 if r["kernel"] == "gemm_tf32" and not r["same_as"]})
    assert (tmp_path / "e.csv").read_text() == whole
    assert (tmp_path / "t.yaml").read_text() == tuned


def test_a_partial_retune_keeps_no_row_whose_source_changed_or_is_unknown(tmp_path, monkeypatch):
    """Kept rows must be of the kernel as it is built now: a row whose source_sha256 is another
    source's, or missing (a file from before the column), stops a partial re-tune with the rule;
    so do an unknown candidate and an evidence file over other training shapes. A screen row that
    only a re-measured candidate holds (its old region, before `measured_where` moved) is no
    obstacle: that candidate's rows are replaced."""
    import csv

    from src.errors import ConfigError
    from src.tune import evidence

    count = plan_mod.load_settings()["screen"]["shapes"]
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, []))
    args = ["--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
            "--tuned", str(tmp_path / "t.yaml"), "--sweep-dir", str(tmp_path / "sw")]
    assert command.main(args) == 0
    rows = list(csv.DictReader((tmp_path / "e.csv").open()))

    def rewrite(change):
        with (tmp_path / "e.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(change(dict(r)) for r in rows)

    plan = budget.within_budget("h100_sxm", distribution.training(), None, count + 4, 1.0, 1)
    # a screen row only the re-measured candidate holds (its old region) is replaced, not kept
    rest = {s.label for s in plan.rest}
    moved = next(r["shape"] for r in rows if r["kernel"] == "gemm_tf32" and r["shape"] in rest)
    rewrite(lambda r: {**r, "stage": "1"} if r["shape"] == moved and r["kernel"] == "gemm_tf32" else r)
    kept = partial.kept_evidence(plan, plan_mod.load_settings(), tmp_path / "e.csv", {"gemm_tf32"})
    assert kept and {r["kernel"] for r in kept} == {r["kernel"] for r in rows} - {"gemm_tf32"}
    with pytest.raises(ConfigError, match="same training shapes and screen"):
        partial.kept_evidence(plan, plan_mod.load_settings(), tmp_path / "e.csv", {"gemm_ffma"})
    # a screen shape that only the re-measured candidates hold is screened again, by them
    screen_shape = next(r["shape"] for r in rows if r["stage"] == "1" and r["shape"] != moved)
    holders = {r["kernel"] for r in rows if r["stage"] == "1" and r["shape"] == screen_shape}
    kept = partial.kept_evidence(plan, plan_mod.load_settings(), tmp_path / "e.csv",
                                 holders | {"gemm_tf32"})
    assert {r["kernel"] for r in kept} == {r["kernel"] for r in rows} - holders - {"gemm_tf32"}
    assert screen_shape not in {r["shape"] for r in kept if r["stage"] == 1}
    for change, said in [
            (lambda r: {**r, "source_sha256": "0" * 64 if r["kernel"] == "gemm_ffma" else r["source_sha256"]},
             "the evidence rows of gemm_ffma were measured from another source"),
            (lambda r: {**r, "source_sha256": ""}, "no source_sha256"),
            (lambda r: r if r["shape"] != rows[-1]["shape"] else {**r, "shape": "1x2x3"},
             "same training shapes and screen")]:
        rewrite(change)
        with pytest.raises(ConfigError) as info:
            partial.kept_evidence(plan, plan_mod.load_settings(), tmp_path / "e.csv", {"gemm_tf32"})
        assert said in str(info.value) and "rule:" in str(info.value)
    with pytest.raises(ConfigError, match="gemm_nonesuch"):
        partial.kept_evidence(plan, plan_mod.load_settings(), tmp_path / "e.csv", {"gemm_nonesuch"})
    assert evidence.source_sha256("gemm_tf32") != evidence.source_sha256("gemm_3xtf32")
    assert command.main(args + ["--kernels", "gemm_tf32"]) == 1  # the rule, said on stderr


def test_missing_measures_only_the_candidates_the_evidence_lacks(tmp_path, monkeypatch, capsys):
    """`--missing` keeps every row of today's sources and measures the plan's other pairs: after
    a whole run nothing; with rows taken out (a screen shape's and a stage-2 shape's of one
    kernel) exactly those candidates; with same_as rows alone taken out nothing, their rows
    written again; with a row of another source its kernel's candidates; each time the evidence
    and the fit are the whole run's again (SYNTHETIC figures, one law)."""
    from src.cli import main as cli
    from src.tune import evidence

    count = plan_mod.load_settings()["screen"]["shapes"]
    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, []))
    assert cli(common + ["--sweep-dir", str(tmp_path / "whole")]) == 0
    whole, tuned = (tmp_path / "e.csv").read_text(), (tmp_path / "t.yaml").read_text()
    lines = read_evidence(tmp_path / "e.csv")  # a row per candidate, its twins' too

    def missing_run(name: str, more: tuple = ()) -> list:
        measured = []
        monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))  # an empty cache
        capsys.readouterr()
        assert cli(common + ["--sweep-dir", str(tmp_path / name), "--missing", *more]) == 0
        assert (tmp_path / "e.csv").read_text() == whole
        assert (tmp_path / "t.yaml").read_text() == tuned
        return measured

    assert missing_run("again") == []
    assert f"keeping {len(lines)} rows of today's sources" in capsys.readouterr().out

    def rewrite(keep, change=lambda r: r):
        evidence.write([change(dict(r)) for r in lines if keep(r)], tmp_path / "e.csv")

    # gemm_tf32's rows at one screening shape and one stage-2 shape, same_as rows included; and
    # another kernel's same_as rows alone at a shape (a candidate new to the grid, the same kernel
    # as a kept one there): written again from the kept rows, nothing measured for them
    screen_shape = next(r["shape"] for r in lines if r["kernel"] == "gemm_tf32" and r["stage"] == 1)
    later = next(r["shape"] for r in lines if r["kernel"] == "gemm_tf32" and r["stage"] == 2)
    gone = [r for r in lines if r["kernel"] == "gemm_tf32" and r["shape"] in (screen_shape, later)]
    twin = next(r for r in lines if r["same_as"] and r["kernel"] != "gemm_tf32")
    twins = [r for r in lines if r["same_as"] and (r["shape"], r["kernel"]) == (twin["shape"], twin["kernel"])]
    gone_ids, twin_ids = {id(r) for r in gone}, {id(r) for r in twins}  # rows of `lines`, by identity
    rewrite(lambda r: id(r) not in gone_ids and id(r) not in twin_ids)
    measured = missing_run("gaps")
    assert sorted(measured) == sorted(("best_tf32", "gemm_tf32", r["shape"], r["params"])
                                      for r in gone if not r["same_as"])
    # a row of another source: its kernel's candidates are measured again, wherever planned
    rewrite(lambda r: True, lambda r: {**r, "source_sha256": "0" * 64}
            if r["kernel"] == "gemm_ffma_skinny" else r)
    measured = missing_run("stale")
    assert {k[1] for k in measured} == {"gemm_ffma_skinny"}
    assert len(measured) == sum(1 for r in lines if r["kernel"] == "gemm_ffma_skinny" and not r["same_as"])
    # with --kernels: another candidate's rows of another source would be dropped unmeasured
    rewrite(lambda r: True, lambda r: {**r, "source_sha256": "0" * 64}
            if r["kernel"] == "gemm_ffma_skinny" else r)
    assert command.main(common[1:] + ["--missing", "--kernels", "gemm_tf32"]) == 1
    assert "would drop the rows of gemm_ffma_skinny" in capsys.readouterr().err
    # with --kernels: only the named candidates' missing jobs; the others' gaps stay gaps
    rewrite(lambda r: id(r) not in gone_ids)
    measured = missing_run("gaps, named", ["--kernels", "gemm_tf32"])
    assert sorted(measured) == sorted(("best_tf32", "gemm_tf32", r["shape"], r["params"])
                                      for r in gone if not r["same_as"])
    rewrite(lambda r: id(r) not in gone_ids)
    measured = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))
    assert cli(common + ["--sweep-dir", str(tmp_path / "other"), "--missing", "--kernels",
                         "gemm_3xtf32,gemm_ffma"]) == 0
    assert measured == [] and len(read_evidence(tmp_path / "e.csv")) == len(lines) - len(gone)
    assert command.main(common[1:] + ["--missing", "--kernels", "gemm_nonesuch"]) == 1
    assert "gemm_nonesuch" in capsys.readouterr().err
    # the rules: another evidence file's shapes
    last = lines[-1]["shape"]  # a shape this plan does not hold
    rewrite(lambda r: True, lambda r: {**r, "shape": "1x2x3", "m": 1, "n": 2, "k": 3}
            if r["shape"] == last else r)
    assert command.main(common[1:] + ["--sweep-dir", str(tmp_path / "x"), "--missing"]) == 1
    assert "same training shapes and screen" in capsys.readouterr().err


def _uninterrupted(common: list[str], tmp_path, monkeypatch) -> tuple[str, str, list]:
    """An uninterrupted tune's evidence and fit (their text) and what it measured; the two files
    are then removed, for a cut-short run to write them again."""
    from src.cli import main as cli

    measured: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))
    assert cli(common + ["--sweep-dir", str(tmp_path / "whole")]) == 0
    texts = (tmp_path / "e.csv").read_text(), (tmp_path / "t.yaml").read_text()
    (tmp_path / "e.csv").unlink()
    (tmp_path / "t.yaml").unlink()
    return *texts, measured


def _cut_short(common: list[str], tmp_path, monkeypatch, stops) -> tuple[list, list]:
    """A tune interrupted (KeyboardInterrupt, as Ctrl-C or a time limit) before the first batch
    of sweeps for which `stops(sweeps)` holds: the evidence file it left and what it measured."""
    from src.cli import main as cli

    before: list = []
    inner = stand_in_sweeps({}, before)

    def cut(sweeps, *rest, **kw):
        if stops(sweeps):
            raise KeyboardInterrupt
        return inner(sweeps, *rest, **kw)

    monkeypatch.setattr(command, "run_sweeps", cut)
    assert cli(common + ["--sweep-dir", str(tmp_path / "cut")]) == 130  # Ctrl-C's status, no traceback
    return read_evidence(tmp_path / "e.csv"), before


def _resumed(common: list[str], tmp_path, monkeypatch, whole: str, tuned: str) -> list:
    """`--missing` after a cut-short tune: it ends with the uninterrupted run's evidence and fit,
    byte for byte; what it measured."""
    from src.cli import main as cli

    after: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, after))
    assert cli(common + ["--sweep-dir", str(tmp_path / "resumed"), "--missing"]) == 0
    assert (tmp_path / "e.csv").read_text() == whole and (tmp_path / "t.yaml").read_text() == tuned
    return after


def test_a_tune_cut_short_keeps_its_finished_sweeps_and_missing_resumes_it(tmp_path, monkeypatch):
    """The evidence file is saved after each sweep: a first tune interrupted in stage 2 (Ctrl-C,
    a time limit) leaves the rows of every finished sweep and no fit; `--missing` then measures
    only the unfinished sweeps' candidates (at shapes the file does not hold yet too), so the two
    runs measure together exactly what an uninterrupted run measures, and the evidence and the
    fit come out as its, byte for byte."""
    count = plan_mod.load_settings()["screen"]["shapes"]
    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    whole, tuned, whole_measured = _uninterrupted(common, tmp_path, monkeypatch)

    stage_2: list = []

    def third_stage_2(sweeps) -> bool:  # the third stage-2 sweep with jobs is never finished
        stage_2.extend(s.name for s in sweeps if s.jobs and s.name.endswith("stage2"))
        return len(stage_2) >= 3

    saved, before = _cut_short(common, tmp_path, monkeypatch, third_stage_2)
    assert not (tmp_path / "t.yaml").exists()
    held = {(r["dispatcher"], r["kernel"], r["shape"], r["params"]) for r in saved if not r["same_as"]}
    assert held == set(before) and before  # every finished sweep's rows, and only those

    after = _resumed(common, tmp_path, monkeypatch, whole, tuned)
    assert after and not held & set(after)  # nothing measured twice
    assert sorted(before + after) == sorted(whole_measured)


@pytest.mark.parametrize("stage, by", [(1, "SIGINT"), (2, "SIGINT"), (2, "SIGTERM")])
def test_a_sweep_cut_midway_keeps_its_finished_jobs_and_missing_measures_only_the_rest(
        tmp_path, monkeypatch, capsys, stage, by):
    """A time limit's SIGINT in the middle of a sweep (stage 1's screen, or stage 2's), or a real
    SIGTERM (SLURM's time limit or preemption; exit status 143): the jobs that sweep finished join
    the evidence file with those of the sweeps before it, so a machine held for minutes loses none
    of its measurements; `--missing` then measures exactly the jobs the uninterrupted run measured
    and the first did not, and the evidence and the fit come out as the uninterrupted run's, byte
    for byte."""
    import signal
    import threading

    from src.cli import main as cli

    if by == "SIGTERM" and threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")
    handler = signal.getsignal(signal.SIGTERM)

    count = plan_mod.load_settings()["screen"]["shapes"]
    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    whole, tuned, whole_measured = _uninterrupted(common, tmp_path, monkeypatch)
    stage_1 = sum(1 for key in whole_measured if not read_stage_2(whole, key))
    # the cut: within the screen's second half, or a few jobs into stage 2
    cut = stage_1 // 2 + 7 if stage == 1 else stage_1 + 5
    before: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, before, cut_after=cut,
                                                                cut_by_sigterm=by == "SIGTERM"))
    assert cli(common + ["--sweep-dir", str(tmp_path / "cut")]) == (143 if by == "SIGTERM" else 130)
    assert "cut short: the" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is handler  # the tune's own handler is gone again
    saved = {(r["dispatcher"], r["kernel"], r["shape"], r["params"])
             for r in read_evidence(tmp_path / "e.csv") if not r["same_as"]}
    assert len(before) == cut and saved == set(before)  # the cut sweep's finished jobs too
    assert not (tmp_path / "t.yaml").exists()

    after = _resumed(common, tmp_path, monkeypatch, whole, tuned)
    assert after and not saved & set(after)  # nothing measured twice
    assert sorted(before + after) == sorted(whole_measured)


def read_stage_2(evidence_text: str, key: tuple) -> bool:
    """Whether the evidence file's text holds `key` (dispatcher, kernel, shape, params) as a
    stage-2 row."""
    import csv
    import io

    for r in csv.DictReader(io.StringIO(evidence_text)):
        if (r["dispatcher"], r["kernel"], r["shape"]) == key[:3] \
                and json.loads(r["params"]) == json.loads(key[3]):
            return r["stage"] == "2"
    return False


def test_no_fit_writes_the_evidence_alone_and_fit_only_then_fits_it(tmp_path, monkeypatch, capsys):
    """`--no-fit` (the GPU box measures, the fit runs elsewhere): the tune writes its evidence and
    neither writes nor touches the tuned file; `--fit-only` afterwards fits that evidence (the
    tuned file names its sha256, so the dispatch takes it). With --fit-only itself it is refused."""
    from src.cli import main as cli
    from src.job.training import evidence_sha256

    count = plan_mod.load_settings()["screen"]["shapes"]
    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 2), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    measured: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))
    assert cli(common + ["--sweep-dir", str(tmp_path / "nofit"), "--no-fit"]) == 0
    rows = read_evidence(tmp_path / "e.csv")
    assert measured and {(r["dispatcher"], r["kernel"], r["shape"], r["params"])
                         for r in rows if not r["same_as"]} == set(measured)
    assert not (tmp_path / "t.yaml").exists()
    assert "--no-fit" in capsys.readouterr().out
    assert cli(common + ["--fit-only"]) == 0
    assert f"evidence_sha256: {evidence_sha256(tmp_path / 'e.csv')}" in (tmp_path / "t.yaml").read_text()
    assert cli(common + ["--fit-only", "--no-fit"]) == 1
    assert "rule: --no-fit goes with a tune that measures" in capsys.readouterr().err


def test_a_capped_kernel_keeps_its_winners_then_the_closest_near_misses():
    """SYNTHETIC: seven variants of one kernel all within the margin at two screening shapes;
    `max_survivors: 4` keeps the two that were best at a shape, then the two closest others
    (by their best ratio, then their geomean over the screen); an uncapped kernel keeps all."""
    s1, s2 = (64, 64, 64), (128, 32, 4096)
    tf = "best_tf32"
    ratios = {"A": (1.00, 0.980), "B": (0.985, 1.00), "C": (0.995, 0.980), "D": (0.975, 0.995),
              "E": (0.990, 0.990), "F": (0.990, 0.972), "G": (0.995, 0.971)}
    rows = [row(tf, "gemm_tf32", P[name], shape, value)
            for name, values in ratios.items() for shape, value in zip((s1, s2), values)]
    capped = settings(margin=0.03)
    capped["screen"]["max_survivors"] = {"gemm_tf32": 4}
    kept = screen.survivors(rows, capped, GUARDS)[("best_tf32", "gemm_tf32")]
    # winners A, B; then C, D and G share the best ratio 0.995 and their geomean orders them
    # (C 0.987, D 0.985, G 0.983); E and F (0.990) come after
    assert kept == {P["A"], P["B"], P["C"], P["D"]}
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    assert screen.survivors(shuffled, capped, GUARDS)[("best_tf32", "gemm_tf32")] == kept
    assert screen.survivors(rows, settings(margin=0.03), GUARDS)[("best_tf32", "gemm_tf32")] \
        == {P[name] for name in ratios}


def test_a_survivors_twins_survive_with_it_where_the_screen_could_not_tell_them_apart():
    """SYNTHETIC: A1 and A2 differ in a parameter that changes nothing at the (aligned) screening
    shapes, so A2's rows there are `same_as` A1's; B1 and B2 likewise, but behind. With
    `max_survivors: 1` the cap keeps the A twins, ranked as one, and both go on (stage 2 measures A2
    where its launch differs); B2 does not (B1 did not survive). C, A1's twin at one shape but
    measured apart (and far behind) at the other, is a candidate of its own."""
    s1, s2 = (512, 512, 512), (4096, 4096, 4096)
    tf = "best_tf32"
    a1, a2, b1, b2, c = (json.dumps({"bm": 64, "ur": u}, sort_keys=True) for u in (1, 2, 3, 4, 5))
    rows = []
    for shape, (a, b, c_value) in ((s1, (1.0, 0.995, 1.0)), (s2, (1.0, 0.995, 0.5))):
        rows += [row(tf, "gemm_mma_tf32", P["G"], shape, 1.02),  # the best: none of A-C is a winner
                 row(tf, "gemm_tf32", a1, shape, a), dict(row(tf, "gemm_tf32", a2, shape, a), same_as=a1),
                 row(tf, "gemm_tf32", b1, shape, b), dict(row(tf, "gemm_tf32", b2, shape, b), same_as=b1),
                 dict(row(tf, "gemm_tf32", c, shape, c_value), same_as=a1 if shape == s1 else None)]
    capped = settings(margin=0.03)
    capped["screen"]["max_survivors"] = {"gemm_tf32": 1}
    kept = screen.survivors(rows, capped, GUARDS)[("best_tf32", "gemm_tf32")]
    assert kept == {a1, a2}
    # twins take one place of a cap: at 2, C (as close at its best, lower geomean) goes on too
    capped["screen"]["max_survivors"] = {"gemm_tf32": 2}
    assert screen.survivors(rows, capped, GUARDS)[("best_tf32", "gemm_tf32")] == {a1, a2, c}
    capped["screen"]["max_survivors"] = {"gemm_tf32": 1}
    # uncapped, every candidate within the margin survives anyway (C was, at s1): twins add none
    assert screen.survivors(rows, settings(margin=0.03), GUARDS)[("best_tf32", "gemm_tf32")] \
        == {a1, a2, b1, b2, c}
    # without the twins' same_as, A2 is a near-miss like any other and the cap drops it
    apart = [dict(r, same_as=None) for r in rows]
    assert screen.survivors(apart, capped, GUARDS)[("best_tf32", "gemm_tf32")] == {a1}


def test_a_kernel_named_in_own_best_sends_on_its_own_best_at_each_screening_shape():
    """SYNTHETIC: gemm_tf32 wins both screening shapes; the skinny kernel's variants all trail it
    by far more than the margin, so none would go on. `own_best: 1` sends the skinny kernel's
    best at each shape (one a shape, two in all); `own_best: 2` its two best at each; other
    kernels and dispatchers are untouched, and a kernel a dispatcher never ran adds nothing
    (`own_best` here replaces the committed one)."""
    s1, s2 = (8, 4096, 4096), (4096, 8, 512)
    tf = "best_tf32"
    skinny = {name: json.dumps({"warps": i}, sort_keys=True) for i, name in enumerate("VWXY")}
    values = {"V": (0.50, 0.40), "W": (0.60, 0.30), "X": (0.55, 0.45), "Y": (0.20, 0.10)}
    rows = [row(tf, "gemm_tf32", P["A"], s, 1.0) for s in (s1, s2)]
    rows += [row(tf, "gemm_ffma_skinny", skinny[name], shape, value)
             for name, pair in values.items() for shape, value in zip((s1, s2), pair)]
    plain = screen.survivors(rows, settings(margin=0.03, own_best={}), GUARDS)
    assert (tf, "gemm_ffma_skinny") not in plain
    one = screen.survivors(rows, settings(margin=0.03, own_best={"gemm_ffma_skinny": 1}), GUARDS)
    assert one[(tf, "gemm_ffma_skinny")] == {skinny["W"], skinny["X"]}  # best at s1, at s2
    assert one[(tf, "gemm_tf32")] == plain[(tf, "gemm_tf32")]
    two = screen.survivors(rows, settings(margin=0.03, own_best={"gemm_ffma_skinny": 2}), GUARDS)
    assert two[(tf, "gemm_ffma_skinny")] == {skinny["W"], skinny["X"], skinny["V"]}
    assert not any(d == "best_fp32" for d, _ in two)


def test_the_committed_screen_sends_the_whole_skinny_grid_on():
    """The skinny kernel's screening shapes are matrix-vector products (its reserved region),
    where its K cut hardly matters, so the committed `own_best` sends every variant of its grid
    (conf/tune/gemm_ffma_skinny.yaml) to stage 2: at least as many as the grid has combinations.
    A grid grown past it fails here."""
    import math

    from omegaconf import OmegaConf

    space = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "tune" / "gemm_ffma_skinny.yaml"))
    combinations = math.prod(len(v) for v in space["tune"]["space"].values())
    assert combinations > 1  # the space was read
    assert int(plan_mod.load_settings()["screen"]["own_best"]["gemm_ffma_skinny"]) >= combinations


def test_the_committed_screen_keeps_gemm_ffma_for_tf32_on_the_h200s_recorded_screen():
    """RECORDED (tests/data/tuning_h200_screen_tf32.csv: the 3 best rows of each kernel at each
    screening shape of best_tf32, stage 1 of the 4x H200 tune of 2026-11-26, from
    results/tuning/h200.csv): at every screening shape gemm_ffma trailed the best TF32 candidate
    by more than the 3% margin (0.953x and 0.959x at its closest), though it is the best measured
    candidate at 17 of the H100's 144 training shapes in TF32. The committed `own_best` sends its
    best at each screening shape on, so noise at the screen does not drop a kernel for the whole
    of stage 2."""
    rows = read_evidence(ROOT / "tests" / "data" / "tuning_h200_screen_tf32.csv")
    assert rows and {(r["gpu_spec"], str(r["stage"])) for r in rows} == {("h200", "1")}
    committed = plan_mod.load_settings()
    without = {**committed, "screen": {**committed["screen"], "own_best": {
        k: v for k, v in committed["screen"]["own_best"].items() if k != "gemm_ffma"}}}
    assert ("best_tf32", "gemm_ffma") not in screen.survivors(rows, without, refit.guards(without))
    kept = screen.survivors(rows, committed, refit.guards(committed))[("best_tf32", "gemm_ffma")]
    screened_at = {r["shape"] for r in rows if r["kernel"] == "gemm_ffma"}
    # one best a shape; its twins (the same launch at every screening shape) go on with it
    launches: dict = {}
    for r in rows:
        if r["kernel"] == "gemm_ffma" and r["params"] in kept:
            launches.setdefault(r["params"], set()).add((r["shape"], r.get("same_as") or r["params"]))
    groups = len({frozenset(v) for v in launches.values()})
    assert 1 <= groups <= len(screened_at)


def test_a_finished_sweep_is_not_run_again_and_anything_it_depends_on_reruns_it(tmp_path, monkeypatch,
                                                                               capsys):
    """run_sweeps with a stand-in `python -m src.run` that writes a record and exits 0, or 1 for a
    sweep told to fail: a sweep that exited 0 is skipped by the next run with the same command
    line, source and configs (its records stay); another override, GPU spec, kernel source or
    config runs it again; one that failed or was cut short (no finished.json) runs again."""
    import shutil

    from src import paths
    from src.tune import evidence

    settings = plan_mod.load_settings()
    plan = plan_mod.build("h100_sxm", distribution.training()[:3], settings)
    planned, sweep_dir = plan.sweeps[:2], tmp_path / "sw"
    names = [s.name for s in planned]
    ran, failing = [], set()

    def stand_in(args):
        name = next(a for a in args if a.startswith("hydra.sweep.dir=")).split("/")[-1]
        ran.append(name)
        Record(kernel="k", precision="fp32", backend="nvrtc", m=8, n=8, k=8, alpha=0.5, beta=3.0,
               gflops=1.0).write(sweep_dir / name / "0_k_8x8x8")
        return 1 if name in failing else 0

    def runs(extra=(), gpu="h100_sxm", failed=0):
        ran.clear()
        assert command.run_sweeps(planned, settings, sweep_dir, list(extra), gpu) == failed
        return list(ran)

    monkeypatch.setattr(sweeps, "sweep_exit", stand_in)
    assert runs() == names
    assert all((sweep_dir / n / sweeps.FINISHED).is_file() for n in names)
    capsys.readouterr()
    assert runs() == []
    assert capsys.readouterr().out.count("finished in an earlier run") == 2
    assert all(len(list((sweep_dir / n).glob("*/record.json"))) == 1 for n in names)  # kept

    assert runs(["resume=false"]) == names   # another command line
    assert runs(gpu="h200") == names         # another GPU spec
    assert runs(gpu="h200") == []
    monkeypatch.setattr(evidence, "source_sha256", lambda kernel: "edited " + kernel)
    assert runs(gpu="h200") == names         # a changed kernel source

    failing.add(names[0])
    for n in names:  # both cut short before they finished
        (sweep_dir / n / sweeps.FINISHED).unlink()
    assert runs(gpu="h200", failed=1) == names
    assert not (sweep_dir / names[0] / sweeps.FINISHED).exists()
    failing.clear()
    assert runs(gpu="h200") == [names[0]]    # the failed one again; the other finished

    conf = tmp_path / "conf"  # a changed config of the second sweep's kernel
    shutil.copytree(paths.CONF_DIR, conf)
    grid = conf / "tune" / f"{planned[1].kernel}.yaml"
    grid.write_text(grid.read_text() + "\n# edited\n")
    monkeypatch.setattr(paths, "CONF_DIR", conf)
    assert runs(gpu="h200") == [names[1]]


def test_a_listed_sweep_passes_its_candidates_in_a_file_and_reruns_when_they_change(tmp_path,
                                                                                     monkeypatch):
    """A stage's listed candidates reach its sweeper as a JSON file (`tune.candidates_file`), not
    on the command line: hundreds there cost every job's compose about a second (Hydra parses and
    merges the list per job). The file holds the list in order; the sweeper's settings read it
    back; the fingerprint holds the list, so a sweep with other candidates runs again."""
    from dataclasses import replace

    settings = plan_mod.load_settings()
    plan = plan_mod.build("h100_sxm", distribution.training()[:3], settings)
    whole = next(s for s in plan.sweeps if s.jobs)
    listed = tune.grid(whole.space)[:5]
    sweep, sweep_dir, commands = replace(whole, candidates=listed), tmp_path / "sw", []

    def stand_in(args):
        commands.append(args)
        return 0

    monkeypatch.setattr(sweeps, "sweep_exit", stand_in)
    assert command.run_sweeps([sweep], settings, sweep_dir, [], "h100_sxm") == 0
    args = commands[-1]
    assert not any(a.startswith("++tune.candidates=") for a in args)
    given = [a.split("=", 1)[1] for a in args if a.startswith("++tune.candidates_file=")]
    assert given == [str(sweep.file(sweep_dir, "candidates"))]
    assert json.loads(sweep.file(sweep_dir, "candidates").read_text()) == listed
    block = {**tune_block(whole.kernel), "candidates_file": given[0]}
    assert tune.Settings.from_cfg(block).candidates == listed

    commands.clear()
    assert command.run_sweeps([sweep], settings, sweep_dir, [], "h100_sxm") == 0 and not commands
    other = replace(whole, candidates=listed[1:])
    assert command.run_sweeps([other], settings, sweep_dir, [], "h100_sxm") == 0 and commands
    assert json.loads(other.file(sweep_dir, "candidates").read_text()) == listed[1:]


def tune_block(kernel: str) -> dict:
    from omegaconf import OmegaConf

    from src.paths import CONF_DIR

    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "tune" / f"{kernel}.yaml"))["tune"]


@pytest.mark.parametrize("given,rule", [
    ({"candidates": [{}]}, "tune.candidates is given too"),
    ({}, "it holds a dict"),
    (None, "FileNotFoundError"),
])
def test_a_bad_candidates_file_is_one_clear_error(tmp_path, given, rule):
    from src.errors import InvalidParams

    path = tmp_path / "candidates.json"
    if given is not None:
        path.write_text(json.dumps({"a": 1}))
    block = {**tune_block("gemm_tf32"), **(given or {}), "candidates_file": str(path)}
    with pytest.raises(InvalidParams, match="tune.candidates_file must name a JSON file") as err:
        tune.Settings.from_cfg(block)
    assert rule in str(err.value) and "a grid sweep's candidates are one list" in str(err.value)


def test_the_second_screen_keeps_winners_the_nearest_models_choices_and_the_catch_all():
    """SYNTHETIC, stage 3's candidates (screen.rescreened) over stage-1 and -2 rows at six shapes
    on a line: A wins the small three and B the large three; C is 1% behind the winner at every
    shape (a steady second, never close enough at one shape: kept only as the nearest model's
    choice where A and B split the neighbours); D ties A at one shape only as A's twin (same_as),
    never close as its own launch: dropped; E is far behind everywhere: dropped; F was not a
    stage-2 survivor and is never listed."""
    shapes = [(64 * 2 ** i, 64 * 2 ** i, 64 * 2 ** i) for i in range(6)]
    rows = []
    for i, s in enumerate(shapes):
        a, b = (1.0, 0.5) if i < 3 else (0.5, 1.0)
        if i in (2, 3):  # where the neighbourhood holds both halves, the steady second wins
            a, b = (1.0, 0.9) if i == 2 else (0.9, 1.0)
        rows += [row("best_tf32", "gemm_tf32", P["A"], s, a, stage=2),
                 row("best_tf32", "gemm_tf32", P["B"], s, b, stage=2),
                 row("best_tf32", "gemm_tf32", P["C"], s, 0.985 * max(a, b), stage=2),
                 row("best_tf32", "gemm_tf32", P["E"], s, 0.3, stage=2),
                 row("best_tf32", "gemm_tf32", P["F"], s, 2.0, stage=1)]
        twin = row("best_tf32", "gemm_tf32", P["D"], s, a if i == 0 else 0.4, stage=2)
        rows.append({**twin, "same_as": P["A"]} if i == 0 else twin)
    survivors = {("best_tf32", "gemm_tf32"): {P[x] for x in "ABCDE"}}
    kept = screen.rescreened(rows, settings(rescreen_margin=0.0), GUARDS, survivors)
    assert kept == {("best_tf32", "gemm_tf32"): {P["A"], P["B"], P["C"]}}
    # a margin of 2% lets C in by closeness alone, never D (its closeness was A's launch)
    wide = screen.rescreened(rows, settings(rescreen_margin=0.02), GUARDS, survivors)
    assert P["C"] in wide[("best_tf32", "gemm_tf32")] and P["D"] not in wide[("best_tf32", "gemm_tf32")]
    # stage-3 rows never count in the second screen
    late = [{**r, "stage": 3, "ratio_best": 9.0} for r in rows if r["params"] == P["E"]]
    assert screen.rescreened(rows + late, settings(rescreen_margin=0.0), GUARDS, survivors) == kept


def test_under_auto_weighting_the_second_screen_keeps_either_weightings_choice():
    """SYNTHETIC: five cubes, 64 and 72 near each other, 256, 1024 and 4096 far. H runs 1.0
    everywhere; X only at 72 (1.5, the winner there); G is X's twin at 72 (1.5) and 0.5 to 0.6 at
    its own launches, best nowhere. Left out, 64's nearest model with equal weights takes H and with
    inverse distance G (72 outweighs the far three). `fit.weighting: auto` is settled only on the
    whole evidence, stage 3's included, so the second screen keeps G under auto and under inverse
    distance, never under equal."""
    from src.tune import fit, judge

    shapes = [(d, d, d) for d in (64, 72, 256, 1024, 4096)]
    rows = [row("best_tf32", "gemm_tf32", P["A"], s, 1.0, stage=2) for s in shapes]  # H
    rows.append(row("best_tf32", "gemm_tf32", P["B"], shapes[1], 1.5, stage=2))      # X
    rows.append({**row("best_tf32", "gemm_tf32", P["G"], shapes[1], 1.5, stage=2), "same_as": P["B"]})
    rows += [row("best_tf32", "gemm_tf32", P["G"], s, 0.5 if s == shapes[0] else 0.6, stage=2)
             for s in shapes if s != shapes[1]]
    survivors = {("best_tf32", "gemm_tf32"): {P["A"], P["B"], P["G"]}}

    def with_weighting(name):
        data = settings(rescreen_margin=0.0)
        data["fit"] = {**data["fit"], "weighting": name}
        return data

    fitter = fit.Fitter(fit.table(rows, "best_tf32"), GUARDS, with_weighting("equal")["fit"])
    others = shapes[1:]
    assert judge.nearest_choice(fitter, shapes[0], others, NearestModel(4, "equal")).params == P["A"]
    assert judge.nearest_choice(fitter, shapes[0], others, NearestModel(4, "inverse_distance")).params == P["G"]
    kept = {w: screen.rescreened(rows, with_weighting(w), GUARDS, survivors)[("best_tf32", "gemm_tf32")]
            for w in ("equal", "inverse_distance", "auto")}
    assert P["G"] not in kept["equal"] and {P["A"], P["B"]} <= kept["equal"]
    assert kept["inverse_distance"] == kept["auto"] == kept["equal"] | {P["G"]}


def test_the_second_screen_asks_the_nearest_model_with_the_reserved_sides_the_fit_may_choose(monkeypatch):
    """`fit.reserved_sides` in the second screen, as `auto` weighting: where the fit may keep the
    reserved regions' sides apart for a dispatcher (true for it, or auto, settled only on the
    whole evidence), the nearest model's choice at each left-out shape is asked with those regions,
    under auto without them too; where it may not, without. Each choice asked is kept."""
    from src.tune import judge

    shapes = [(d, d, d) for d in (64, 72, 256, 1024)]
    rows = [row("best_tf32", "gemm_tf32", P["A"], s, 1.0, stage=2) for s in shapes]
    survivors = {("best_tf32", "gemm_tf32"): {P["A"]}}
    asked = []

    def choice(fitter, shape, among, model):
        asked.append(model.regions)
        return fit.Candidate("gemm_tf32", P["B"]) if model.regions else None

    monkeypatch.setattr(judge, "nearest_choice", choice)
    whens = ("min(m, n) <= 2",)
    for sides, expected in ((False, {()}), (True, {whens}), ("auto", {(), whens}),
                            ({"best_tf32": True, "best_fp32": False}, {whens}), ({"best_fp32": True}, {()})):
        data = settings(rescreen_margin=0.0)
        data["fit"] = {**data["fit"], "weighting": "equal", "reserved_sides": sides}
        asked.clear()
        kept = screen.rescreened(rows, data, GUARDS, survivors)[("best_tf32", "gemm_tf32")]
        assert set(asked) == expected and len(asked) == len(shapes) * len(expected)
        assert (P["B"] in kept) is (whens in expected)


def test_added_draws_are_stage_three_an_upper_bound_until_the_second_screen():
    """training.added's draws (flagged `added`) are planned in stage 3: before stage 2 has run with
    stage 2's candidates (the upper bound), then with the second screen's; without a screen they
    are ordinary stage-1 shapes."""
    base = distribution.stratified(distribution.training(), 14)
    added = [distribution.Shape(*s.dims, cls=s.cls, added=True)
             for s in distribution.stratified(distribution.heldout(), 3)]
    shapes = base + added
    staged = plan_mod.build("h100_sxm", shapes, settings(shapes=10))
    assert staged.added == added and [s.dims for s in staged.rest] == [s.dims for s in base[10:]]
    assert staged.stage3 and all(s.stage == 3 and s.name.endswith("_stage3") for s in staged.stage3)
    assert {sh.dims for s in staged.stage3 for sh in s.shapes} <= {s.dims for s in added}
    assert "stage 3: 3 added shapes" in staged.describe(1.0, 1) and "at most" in staged.describe(1.0, 1)
    # c_staged 0 only: c_staged 1 is the same launch at most of these shapes (measured once)
    unstaged = [p for p in tune.grid(plan_mod.kernel_space("gemm_tf32")) if not p.get("c_staged")]
    survivors = {("best_tf32", "gemm_tf32"): {tune.params_key(p) for p in unstaged[:6]}}
    again = {("best_tf32", "gemm_tf32"): set(sorted(survivors[("best_tf32", "gemm_tf32")])[:2])}
    upper = plan_mod.build("h100_sxm", shapes, settings(shapes=10), survivors)
    exact = plan_mod.build("h100_sxm", shapes, settings(shapes=10), survivors, rescreened=again)
    listed = lambda plan: {tune.params_key(p) for s in plan.stage3 if s.candidates is not None
                           and s.kernel == "gemm_tf32" for p in s.candidates}
    assert listed(upper) == survivors[("best_tf32", "gemm_tf32")]
    assert listed(exact) == again[("best_tf32", "gemm_tf32")] and exact.rescreened
    assert exact.jobs < upper.jobs and "the survivors of the second screen" in exact.describe(1.0, 1)
    assert exact.only({"gemm_tf32"}).stage3 == [s for s in exact.stage3 if s.kernel == "gemm_tf32"]
    one = plan_mod.build("h100_sxm", shapes, settings(shapes=None))
    assert not one.added and not one.stage3 and len({sh.dims for s in one.sweeps for sh in s.covered}
                                                    & {s.dims for s in added}) == 3


def test_three_stages_end_to_end_measure_the_second_screens_survivors_at_the_added_draws(
        tmp_path, monkeypatch, capsys):
    from src.cli import main as cli

    cache, measured = {}, []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps(cache, measured))
    count = plan_mod.load_settings()["screen"]["shapes"]
    base = distribution.stratified(distribution.training(), count + 4)
    added = [distribution.Shape(*s.dims, cls=s.cls, added=True)
             for s in distribution.stratified(distribution.heldout(), 3)]
    monkeypatch.setattr(distribution, "training", lambda *a, **k: base + added)
    args = ["tune", "--gpu", "h100_sxm", "--sweep-dir", str(tmp_path / "sw"),
            "--csv", str(tmp_path / "e.csv"), "--tuned", str(tmp_path / "t.yaml")]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert "stage 3: 3 added shapes" in out and "(stages 1, 2, 3) on 1 GPU(s)" in out
    assert "the survivors of the second screen" in out.split("after the second screen:")[1]
    rows = read_evidence(tmp_path / "e.csv")
    third = [r for r in rows if r["stage"] == 3]
    assert {r["shape"] for r in third} == {s.label for s in added}
    settings_now = plan_mod.load_settings()
    g = refit.guards(settings_now)
    survivors = screen.survivors([r for r in rows if r["stage"] == 1], settings_now, g)
    again = screen.rescreened(rows, settings_now, g, survivors)
    stage2 = {(r["dispatcher"], r["kernel"], r["params"]) for r in rows if r["stage"] == 2}
    listed = {(d, k, p) for (d, k), ps in again.items() for p in ps}
    assert listed < stage2 | {(d, k, p) for (d, k), ps in survivors.items() for p in ps}
    assert all((r["dispatcher"], r["kernel"], r["params"]) in listed for r in third
               if r["kernel"] != "17_flagship")
    csv_text = (tmp_path / "e.csv").read_text()
    done = len(measured)  # a re-run: every job from the cache, the same evidence
    assert cli(args) == 0 and len(measured) == done
    assert (tmp_path / "e.csv").read_text() == csv_text


def test_a_new_twin_of_a_kept_twin_names_the_row_that_holds_the_figures(tmp_path):
    """`--missing` after a grid grew (min_slice_k 32 appended): at a shape where the tiles fill the
    SMs, min_slice_k cuts no slice, so 256, 512 and 32 build one launch. The earlier run measured
    256 (A) and wrote 512 (B) as its twin; a sweep now listing B before the new 32 (C) prunes C as
    B's twin. C's row must name A, whose row holds the figures, or the evidence file is refused
    (the H200's first such run, 2026-11-28, lost a 520-job sweep to it). SYNTHETIC figures."""
    from src.tune import evidence

    base = {"bm": 128, "bn": 128, "fit": 1, "stages": 4, "group_m": 8, "in_flight": 2,
            "split_k": 8, "min_slices": 1, "unaligned_rows": 1}
    a, b, c = ({**base, "min_slice_k": v} for v in (256, 512, 32))
    shape = distribution.Shape(8192, 8192, 8192)
    limits = limits_from_spec("h200")
    cfg = plan_mod.candidate_config("gemm_tf32", "tf32")
    pruning = tune.prune(cfg, [b, c, a], Problem(*shape.dims, 0.5, 3.0), limits)
    assert len(pruning.valid) == 1 and pruning.same_as == {tune.params_key(c): tune.params_key(b),
                                                           tune.params_key(a): tune.params_key(b)}
    source = evidence.source_sha256("gemm_tf32")
    measured = {**row("best_tf32", "gemm_tf32", tune.params_key(a), shape.dims, 1.2, stage=2),
                "source_sha256": source, "precision": "tf32", "gpu_spec": "h200"}
    kept = [measured, {**measured, "params": tune.params_key(b), "same_as": tune.params_key(a)}]
    sweep = plan_mod.Sweep("best_tf32", "tf32", "gemm_tf32", plan_mod.kernel_space("gemm_tf32"),
                           covered=[shape], stage=2, candidates=[b, c], tag="_stage2")
    new = evidence.sweep_rows(sweep, tmp_path, "h200", plan_mod.load_settings(), kept)
    assert [(r["params"], r["same_as"]) for r in new] == [(tune.params_key(c), tune.params_key(a))]
    assert new[0]["ratio_best"] == 1.2
    evidence.write(kept + new, tmp_path / "e.csv")   # accepted: every twin names a written row
    back = {r["params"]: r for r in read_evidence(tmp_path / "e.csv")}
    assert back[tune.params_key(c)]["same_as"] == tune.params_key(a)


def test_a_launch_the_evidence_holds_by_a_twin_is_not_measured_again(tmp_path):
    """`--missing` after an axis was added before a measured value (c_staged 1 listed first): at
    a shape where staging builds nothing (N % 4 != 0), c_staged 1 and 0 build one launch and the
    grid keeps c_staged 1 as its first. The evidence holds c_staged 0's row: the plan holds the
    launch (no job), and the sweep's rows give c_staged 1 that row's figures (the H200's
    2026-12-04 `--missing` measured such launches again). SYNTHETIC figures."""
    from src.tune import evidence

    base = {"bm": 128, "bn": 128, "fit": 1, "stages": 4, "group_m": 8, "in_flight": 2,
            "split_k": 8, "min_slice_k": 256, "split_tail": 0, "min_slices": 0, "unaligned_rows": 1}
    staged, plain, other = {**base, "c_staged": 1}, {**base, "c_staged": 0}, {**base, "stages": 5, "c_staged": 0}
    shape = distribution.Shape(8067, 417, 114)
    limits = limits_from_spec("h200")
    cfg = plan_mod.candidate_config("gemm_tf32", "tf32")
    problem = Problem(*shape.dims, 0.5, 3.0)
    pruning = tune.prune(cfg, [staged, plain, other], problem, limits)
    assert [tune.params_key(p) for p, _ in pruning.valid] == [tune.params_key(staged), tune.params_key(other)]
    assert pruning.same_as == {tune.params_key(plain): tune.params_key(staged)}
    source = evidence.source_sha256("gemm_tf32")
    kept = [{**row("best_tf32", "gemm_tf32", tune.params_key(plain), shape.dims, 0.93, stage=2),
             "source_sha256": source, "precision": "tf32", "gpu_spec": "h200"}]
    held = evidence.held_pairs(kept)
    space = {name: [staged[name]] if name != "c_staged" else [1, 0] for name in staged}
    space["stages"] = [4, 5]
    sweep, _ = plan_mod._sweep("best_tf32", "tf32", "gemm_tf32", space, [shape], limits,
                               plan_mod.load_settings(), stage=2, candidates=[staged, plain, other],
                               tag="_stage2", held=held)
    # one job (the 5-stage launch), the staged launch held by its twin's row
    assert sweep.jobs_at == {shape.label: 1} and sweep.held == {shape.label: [tune.params_key(staged)]}
    new = evidence.sweep_rows(sweep, tmp_path, "h200", plan_mod.load_settings(), kept)
    assert [(r["params"], r["same_as"], r["ratio_best"]) for r in new] == [
        (tune.params_key(staged), tune.params_key(plain), 0.93)]
    evidence.write(kept + new, tmp_path / "e.csv")   # accepted: the new row names a written row
    back = {r["params"]: r for r in read_evidence(tmp_path / "e.csv")}
    assert back[tune.params_key(staged)]["same_as"] == tune.params_key(plain)
    # without the kept row the launch is a job again and no row is made up
    sweep, _ = plan_mod._sweep("best_tf32", "tf32", "gemm_tf32", space, [shape], limits,
                               plan_mod.load_settings(), stage=2, candidates=[staged, plain, other],
                               tag="_stage2", held={})
    assert sweep.jobs_at == {shape.label: 2} and sweep.held == {}
    assert evidence.sweep_rows(sweep, tmp_path, "h200", plan_mod.load_settings(), []) == []


def test_a_long_sweep_runs_in_parts_and_a_cut_loses_one_part_at_most(tmp_path, monkeypatch):
    """`sweep_max_jobs`: a sweep of more jobs runs as parts of whole shapes, none over the cap
    unless one shape alone is, together its shapes, jobs and held pairs exactly; a tune cut in a
    sweep's second part keeps its first part's rows in the evidence, and `--missing` measures the
    rest only, ending with the uninterrupted run's evidence and fit byte for byte."""
    from src.tune.sweeps import parts

    settings = plan_mod.load_settings()
    count = settings["screen"]["shapes"]
    planned = plan_mod.build("h100_sxm", distribution.stratified(distribution.training(), count), settings)
    big = max(planned.sweeps, key=lambda s: s.jobs)
    cap = big.jobs // 3
    cut = parts([big], cap)
    assert len(cut) >= 3 and [p.name for p in cut] == [f"{big.dispatcher}_{big.kernel}_part{i}"
                                                         for i in range(1, len(cut) + 1)]
    assert all(p.jobs <= cap or len(p.shapes) == 1 for p in cut)
    assert [s for p in cut for s in p.shapes] == big.shapes and sum(p.jobs for p in cut) == big.jobs
    assert sorted(s.label for p in cut for s in p.covered) == sorted(s.label for s in big.covered)
    assert {k: v for p in cut for k, v in p.held.items()} == big.held
    assert parts([big], None) == [big] and parts([big], big.jobs) == [big]

    common = ["tune", "--gpu", "h100_sxm", "--shapes", str(count + 4), "--csv", str(tmp_path / "e.csv"),
              "--tuned", str(tmp_path / "t.yaml")]
    capped = {**settings, "sweep_max_jobs": cap}
    monkeypatch.setattr(plan_mod, "load_settings", lambda *a, **k: dict(capped))
    whole, tuned, whole_measured = _uninterrupted(common, tmp_path, monkeypatch)

    # the big sweep's second part never finishes
    saved, before = _cut_short(common, tmp_path, monkeypatch,
                               lambda sweeps: any(s.name == f"{big.name}_part2" for s in sweeps))
    first_part = {s.label for s in cut[0].shapes}
    assert {r["shape"] for r in saved if (r["dispatcher"], r["kernel"]) == (big.dispatcher, big.kernel)
            } == first_part  # the first part's rows, kept
    after = _resumed(common, tmp_path, monkeypatch, whole, tuned)
    assert sorted(before + after) == sorted(whole_measured)


@pytest.mark.parametrize("args,message", [
    (["--gpu", "nonesuch"], "--gpu nonesuch: no such GPU spec in conf/gpu/"),
    (["--gpu", "h200", "--shapes", "0"], "argument --shapes: '0' is not a positive int"),
    (["--gpu", "h200", "--shapes", "-3"], "argument --shapes: '-3' is not a positive int"),
    (["--gpu", "h200", "--budget", "-5"], "argument --budget: '-5' is not a positive float"),
    (["--gpu", "h200", "--budget", "nan"], "argument --budget: 'nan' is not a positive float"),
])
def test_a_tune_refuses_an_unknown_gpu_and_a_count_or_budget_that_holds_no_shape(args, message, capsys,
                                                                                 monkeypatch):
    """Refused before anything is planned or measured, with the rule: an unknown spec (it was a
    KeyError's traceback), no shapes or a budget of no time (the plan's verdicts took 17 s first,
    then an empty plan, or the budget's own refusal)."""
    from src.cli import main as cli
    from src.tune import prefill

    monkeypatch.setattr(prefill, "for_plan", lambda *a, **k: pytest.fail("planned before the check"))
    try:
        code = cli(["tune", *args, "--dry-run"])
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code in (1, 2) and message in err and "Traceback" not in err
    if "nonesuch" in args:
        from src.job.gpu import known_specs

        assert f"known: {', '.join(sorted(known_specs()))}" in err and "h100_sxm" in known_specs()
