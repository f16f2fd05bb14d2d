"""src/tune/autotune_judge.py on the committed H200 evidence (recorded real results): each draw's
figure comes from a ranking that never saw the draw's own rows, K launches never find less than
fewer, none beats what was measured at the draw, and the command line refuses bad counts and a
GPU with no evidence with the rule each broke."""

from __future__ import annotations

import pytest

from src.job import dispatch, training
from src.job import gpu as gpu_mod
from src.job.problem import Problem
from src.tune import autotune_judge
from src.tune.refit import drawn_shapes

GPU, NAME, DRAWS = "h200", "best_tf32", 3


@pytest.fixture(scope="module")
def rows():
    return training.read(training.evidence_path(GPU))


def test_each_draw_is_judged_on_a_ranking_without_its_own_rows(rows):
    drawn = drawn_shapes(rows)
    got = autotune_judge.left_out(rows, GPU, NAME, [1, 2, 4], drawn, limit=DRAWS)
    assert got[1]["shapes"] == got[4]["shapes"] == got["ceiling"]["shapes"] > 0
    mine = [r for r in rows if r["dispatcher"] == NAME]
    whole, limits = training.table(mine, NAME), gpu_mod.limits_from_spec(GPU)
    for (value, shape), (best, same) in zip(got[1]["figures"], got["ceiling"]["figures"]):
        assert shape == same and shape in drawn
        without = training.table([r for r in mine if (r["m"], r["n"], r["k"]) != shape], NAME)
        problem = Problem(*shape, 1.0, 0.0)
        first = dispatch.ranked(GPU, NAME, problem, without)[0][0]
        # K = 1: the left-out ranking's first choice, at the best of the candidates of its launch
        launch = dispatch.launch(first, "tf32", problem, limits)
        alike = [v for (s, c), v in whole.ratio.items()
                 if s == shape and dispatch.launch(c, "tf32", problem, limits) == launch]
        assert value == pytest.approx(max(alike))
        assert best == pytest.approx(max(v for (s, _), v in whole.ratio.items() if s == shape))
        with_it = dispatch.ranked(GPU, NAME, problem, whole)[0][0]
        # with its own rows in, a training shape is its own only neighbour: its best measured launch
        assert whole.ratio[(shape, with_it)] == pytest.approx(best)
    for k_less, k_more in ((1, 2), (2, 4)):
        for (low, s1), (high, s2) in zip(got[k_less]["figures"], got[k_more]["figures"]):
            assert s1 == s2 and low <= high <= dict((s, v) for v, s in got["ceiling"]["figures"])[s1]


def test_bad_counts_and_a_gpu_without_evidence_are_refused_with_the_rule(capsys):
    with pytest.raises(SystemExit) as stopped:
        autotune_judge.main(["--gpu", GPU, "--candidates", "0,4"])
    assert stopped.value.code == 2
    assert "counts >= 1" in capsys.readouterr().err
    assert autotune_judge.main(["--gpu", "a100", "--candidates", "4"]) == 1
    err = capsys.readouterr().err
    assert "no evidence file" in err and "sgemm-lab tune --gpu a100" in err
