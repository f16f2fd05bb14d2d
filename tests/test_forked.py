"""src/tune/forked.py: the fit's pure work on every core gives what one core gives, in order."""
from __future__ import annotations

import os

import pytest

from src.tune import forked


def test_forked_work_is_the_serial_loops_in_order_run_in_other_processes(monkeypatch):
    """A closure over local data (nothing pickled on the way in) mapped over two forked workers,
    one item at a time or in stripes, returns what the loop returns, in the items' order, and ran
    outside this process; too little work, one core, or one item stays in this process."""
    table = {i: i * i for i in range(40)}
    parent = os.getpid()

    def square(i: int) -> tuple[int, int]:
        return table[i], os.getpid()

    for chunks in ("each", "stripes"):
        got = forked.mapped(square, range(40), workers=2, chunks=chunks)
        assert [v for v, _ in got] == [i * i for i in range(40)]
        assert parent not in {pid for _, pid in got}
    assert {pid for _, pid in forked.mapped(square, range(40), workers=2, cost=forked.MIN_COST - 1)} == {parent}
    assert {pid for _, pid in forked.mapped(square, range(40), workers=2, cost=forked.MIN_COST)} != {parent}
    assert {pid for _, pid in forked.mapped(square, [3], workers=2)} == {parent}
    monkeypatch.setattr(forked, "cores", lambda: 1)
    assert {pid for _, pid in forked.mapped(square, range(40))} == {parent}


def test_an_error_in_a_worker_is_raised_here_and_a_worker_does_not_fork_again():
    def breaks_at_seven(i: int) -> int:
        if i == 7:
            raise ValueError("item 7 breaks")
        return i

    with pytest.raises(ValueError, match="item 7 breaks"):
        forked.mapped(breaks_at_seven, range(10), workers=2)
    assert forked._WORK is None  # the work is not left behind for a later pool

    def nested(i: int) -> tuple[int, set[int]]:
        return os.getpid(), {pid for pid in forked.mapped(lambda _: os.getpid(), range(4), workers=2)}

    for pid, inner in forked.mapped(nested, range(4), workers=2):
        assert inner == {pid}  # serial inside the worker


def test_the_wave_fill_table_is_each_pairs_fill_and_builds_a_pair_outside_it(monkeypatch):
    """RECORDED shapes and candidates of the H200's evidence: nearest.fill_table, built on two
    workers, gives at every (candidate, shape) what src/job/dispatch.wave_fills gives (a launch
    that does not build: None), and a pair outside its table is built when asked."""
    from src.job import dispatch, training
    from src.paths import ROOT
    from src.tune import nearest

    rows = [r for r in training.read(ROOT / "results" / "tuning" / "h200.csv") if r["dispatcher"] == "best_tf32"]
    tab = training.table(rows, "best_tf32")
    candidates, shapes = tuple(tab.candidates[:60]), tuple(tab.shapes[:12])
    monkeypatch.setattr(forked, "MIN_COST", 0)
    monkeypatch.setattr(forked, "cores", lambda: 2)
    fill = nearest.fill_table("h200", "tf32", candidates, shapes)
    direct = dispatch.wave_fills("h200", "tf32")
    got = {(c, s): fill(c, s) for c in candidates for s in shapes}
    assert got == {(c, s): direct(c, s) for c in candidates for s in shapes}
    assert any(v is None for v in got.values()) and any(v is not None for v in got.values())
    assert any(getattr(v, "split_tail", False) for v in got.values()) == any(
        getattr(direct(c, s), "split_tail", False) for c in candidates for s in shapes)
    outside = tab.shapes[-1]
    assert fill(candidates[0], outside) == direct(candidates[0], outside)


def test_the_judges_leave_one_out_on_every_core_is_the_one_core_figure(monkeypatch):
    """RECORDED: the nearest model left one shape out at a time over part of the H200's TF32
    evidence, wave fills and all, reads the same figures split over two workers as on one core."""
    from src.job import training
    from src.paths import ROOT
    from src.tune import judge
    from src.tune.refit import guards
    from src.tune.plan import load_settings

    every = training.read(ROOT / "results" / "tuning" / "h200.csv")
    shapes = sorted({(r["m"], r["n"], r["k"]) for r in every})[:36]
    rows = [r for r in every if (r["m"], r["n"], r["k"]) in shapes and r["dispatcher"] == "best_tf32"]
    settings = load_settings()

    def figures():
        return judge.nearest_cross_validated(rows, guards(settings), settings["fit"], folds=None,
                                             weights="equal", gpu_spec="h200", power=0.5, side=0.0,
                                             share=0.0, regions=())

    monkeypatch.setattr(forked, "cores", lambda: 1)
    one = figures()
    monkeypatch.setattr(forked, "cores", lambda: 2)
    monkeypatch.setattr(forked, "MIN_COST", 0)
    assert figures() == one and one["best_tf32"]["waves"] == 0.5
