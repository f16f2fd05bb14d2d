"""A screen from another GPU's evidence (`sgemm-lab tune --screen-from GPU`, src/tune/prior.py):
which candidates another GPU's tune finds close to its best at a shape and its nearest shapes,
the one-stage plan that measures only those launches, its refusals, and a whole run with the
tuning sweeps stood in for (tests/test_tune_stages.py's stand-in). The figures are SYNTHETIC (a
hash of candidate and shape, the same on both "GPUs"): the tests check what is planned and
measured, never a GPU figure."""

from __future__ import annotations

import pytest

from src.errors import ConfigError
from src.job.training import read as read_evidence
from src.tune import command, distribution, evidence, prior
from src.tune import plan as plan_mod
from tests.test_tune_stages import stand_in_sweeps


def _row(shape, kernel, params, ratio, status="ok", dispatcher="best_tf32"):
    m, n, k = shape
    return {"dispatcher": dispatcher, "shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "kernel": kernel,
            "params": params, "status": status, "ratio_best": ratio, "ratio": ratio, "gpu_spec": "h200"}


A, B, C = (1024, 1024, 1024), (1024, 1024, 2048), (64, 8192, 8192)  # B is A's nearest; C far


def test_close_to_best_keeps_what_is_within_the_fraction_of_the_best_at_each_shape():
    rows = [_row(A, "k1", "p1", 1.00), _row(A, "k1", "p2", 0.91), _row(A, "k2", "p3", 0.89),
            _row(A, "k2", "p4", 2.0, status="failed_verification"), _row(B, "k2", "p3", 0.5)]
    close = prior.close_to_best(rows, 0.9)
    assert close[("best_tf32", A)] == {("k1", "p1"), ("k1", "p2")}   # 0.89 < 0.9; a failure never counts
    assert close[("best_tf32", B)] == {("k2", "p3")}                 # alone, it is the best there


def test_a_shapes_list_joins_its_nearest_training_shapes_lists():
    rows = [_row(A, "k1", "p1", 1.0), _row(A, "k1", "p2", 0.5), _row(B, "k1", "p2", 1.0),
            _row(C, "k2", "p9", 1.0)]
    alone = prior.wanted(rows, [A, B], 0.9, 0)
    assert alone[("best_tf32", "k1")] == {"1024x1024x1024": {"p1"}, "1024x1024x2048": {"p2"}}
    joined = prior.wanted(rows, [A, B], 0.9, 1)
    assert joined[("best_tf32", "k1")]["1024x1024x1024"] == {"p1", "p2"}  # B is A's nearest
    assert "1024x1024x1024" not in joined.get(("best_tf32", "k2"), {})   # C is not
    # a shape the prior never measured takes its nearest shapes' lists
    elsewhere = prior.wanted(rows, [(1024, 1024, 1500)], 0.9, 0)
    assert set(elsewhere[("best_tf32", "k1")]["1024x1024x1500"]) <= {"p1", "p2"}


@pytest.mark.parametrize("block,rule", [({"within": 0, "neighbours": 4}, "above 0 and at most 1"),
                                        ({"within": 1.5, "neighbours": 4}, "above 0 and at most 1"),
                                        ({"within": 0.9, "neighbours": -1}, "an integer >= 0"),
                                        ({"within": 0.9}, "an integer >= 0")])
def test_bad_prior_settings_are_refused_naming_the_rule(block, rule):
    with pytest.raises(ConfigError, match=rule):
        prior.settings_of({"prior": block})
    assert prior.settings_of(plan_mod.load_settings()) == (0.85, 4)  # the committed ones


def _prior_run(tmp_path, monkeypatch, count: int):
    """A synthetic h200 tune of the first `count` training shapes: its evidence file."""
    from src.cli import main as cli

    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, []))
    path = tmp_path / "h200.csv"
    assert cli(["tune", "--gpu", "h200", "--shapes", str(count), "--sweep-dir", str(tmp_path / "p"),
                "--csv", str(path), "--tuned", str(tmp_path / "h200.yaml")]) == 0
    return path


def test_another_gpus_evidence_screens_one_stage_of_only_the_launches_it_wants(tmp_path, monkeypatch, capsys):
    from src.cli import main as cli

    count = plan_mod.load_settings()["screen"]["shapes"] + 4
    source = _prior_run(tmp_path, monkeypatch, count)
    measured: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, measured))
    capsys.readouterr()
    args = ["tune", "--gpu", "h100_sxm", "--shapes", str(count), "--screen-from", str(source),
            "--sweep-dir", str(tmp_path / "t"), "--csv", str(tmp_path / "e.csv"),
            "--tuned", str(tmp_path / "t.yaml")]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert "screened by h200's evidence" in out and "after the screen" not in out
    rows = read_evidence(tmp_path / "e.csv")
    assert rows and {r["stage"] for r in rows} == {2}  # survivors of that screen: choices of the fit
    shapes = distribution.stratified(distribution.training(), count)
    wanted = prior.wanted(read_evidence(source), [s.dims for s in shapes], *prior.settings_of(plan_mod.load_settings()))
    # each measured launch is one a shape wants: it, or a twin that builds it (a same_as row), listed
    launch = {}
    for r in rows:
        launch.setdefault((r["dispatcher"], r["kernel"], r["shape"], r.get("same_as") or r["params"]),
                          set()).add(r["params"])
    assert measured and all(launch[key] & wanted[key[:2]][key[2]] for key in measured)
    # what each shape wants was measured, once a launch (or written as a twin of a measured one)
    have = {(r["dispatcher"], r["kernel"], r["shape"], r["params"]) for r in rows}
    planned = plan_mod.build("h100_sxm", shapes, plan_mod.load_settings(), prior=("h200", wanted))
    assert len(measured) == planned.jobs
    for (d, kernel), by_shape in wanted.items():
        for shape, keys in by_shape.items():
            built = {(d, kernel, shape, p) for p in keys} & have
            assert built or not any(s.kernel == kernel and shape in s.jobs_at for s in planned.sweeps)
    unscreened = plan_mod.build("h100_sxm", shapes, plan_mod.load_settings())
    assert planned.jobs < unscreened.jobs  # (the synthetic figures spread evenly: many are close)
    # resumed with --missing: nothing more to measure, the same evidence
    text = (tmp_path / "e.csv").read_text()
    again: list = []
    monkeypatch.setattr(command, "run_sweeps", stand_in_sweeps({}, again))
    assert cli(args + ["--missing"]) == 0
    assert again == [] and (tmp_path / "e.csv").read_text() == text


def test_a_screen_from_a_missing_own_or_other_architecture_evidence_is_refused(tmp_path, monkeypatch, capsys):
    count = plan_mod.load_settings()["screen"]["shapes"]
    source = _prior_run(tmp_path, monkeypatch, count)
    common = ["--gpu", "h100_sxm", "--shapes", str(count), "--dry-run", "--csv", str(tmp_path / "e.csv")]
    assert command.main(common + ["--screen-from", str(tmp_path / "none.csv")]) == 1
    assert "no evidence file" in capsys.readouterr().err
    assert command.main(["--gpu", "h200", "--shapes", str(count), "--dry-run",
                         "--screen-from", str(source)]) == 1
    assert "the evidence is h200's own" in capsys.readouterr().err
    rows = read_evidence(source)
    other = evidence.write([{**r, "gpu_spec": "a100"} for r in rows], tmp_path / "a100.csv")
    assert command.main(common + ["--screen-from", str(other)]) == 1
    err = capsys.readouterr().err
    assert "a100 is compute capability 80, h100_sxm 90" in err and "same compute capability" in err
    assert command.main(common + ["--screen-from", str(source)]) == 0
    assert "screened by h200's evidence" in capsys.readouterr().out


def test_the_transfer_check_says_whether_the_targets_best_stays_among_the_priors_close_ones():
    """`python -m src.tune.prior`'s first table: at each shape both measured (5 candidates or
    more), the target's best among the prior's close candidates over the target's best."""
    names = [f"p{i}" for i in range(5)]
    theirs = [_row(A, "k", p, r) for p, r in zip(names, (1.0, 0.95, 0.8, 0.7, 0.6))]
    ours = [_row(A, "k", p, r) for p, r in zip(names, (0.9, 1.0, 1.2, 0.5, 0.5))]
    assert prior.transfer(theirs, ours, 0.9) == pytest.approx(
        {"pairs": 1, "geomean": 1.0 / 1.2, "min": 1.0 / 1.2, "under_098": 1, "kept": 0.4})
    assert prior.transfer(theirs, ours, 0.8)["min"] == 1.0   # p2, the target's best, kept
    with pytest.raises(ConfigError, match="where both GPUs measured"):
        prior.transfer(theirs[:4], ours[:4], 0.8)  # 4 candidates: nothing to judge
