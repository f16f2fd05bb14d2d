"""Autotune (on by default, conf/dispatch/default.yaml) against the committed GPUs' evidence: the
published suites still measure the dispatch rules' own choices (every suite shape is a training
shape, covered well, so nothing is measured there; the held-out set is where autotune acts), and
`sgemm-lab explain` lists the candidates a GPU run measured."""

from __future__ import annotations

import pytest
import yaml

from src.job import autotune, dispatch, training
from src.job.config import kernel_config
from src.job.problem import Problem
from src.paths import CONF_DIR

SUITES = ("square", "llm", "skinny", "odd")  # params.yaml `suite`: the published suite's shapes


def _shapes(suite: str) -> list[tuple[int, int, int]]:
    data = yaml.safe_load((CONF_DIR / "suite" / f"{suite}.yaml").read_text())
    return [tuple(int(d) for d in s.split("x"))
            for s in str(data["hydra"]["sweeper"]["params"]["shape"]).split(",")]


def _gpus_with_evidence() -> list[str]:
    return [p.stem for p in sorted((CONF_DIR / "gpu").glob("*.yaml"))
            if training.evidence_path(p.stem).is_file()]


@pytest.mark.parametrize("dispatcher", ["best_fp32", "best_tf32"])
@pytest.mark.parametrize("gpu", _gpus_with_evidence())
def test_every_suite_shape_is_covered_well_so_autotune_measures_nothing_there(gpu, dispatcher):
    settings = autotune.Settings(enabled=True)
    assert settings.max_distance == autotune.Settings.from_cfg(
        {"dispatch": yaml.safe_load((CONF_DIR / "dispatch" / "default.yaml").read_text())}).max_distance
    path = training.evidence_path(gpu)
    rows = training.read(path)
    cfg = kernel_config(dispatcher)
    shapes = [s for suite in SUITES for s in _shapes(suite)]
    assert len(shapes) == 48
    table = training.table(rows, dispatcher)  # as the runner's autotune passes it (built once)
    uncovered = []
    for shape in shapes:
        choice = dispatch.choose(cfg, gpu, Problem(*shape, 0.5, 3.0))
        covered = autotune.coverage(choice, dispatcher, shape, rows, settings.max_distance, str(path),
                                     margin=settings.margin, table=table)
        if not covered.well:
            uncovered.append(f"{'x'.join(map(str, shape))}: {covered.why}")
    assert uncovered == []


def test_explain_lists_the_candidates_a_gpu_run_measured_and_nothing_at_a_training_shape():
    """RECORDED: the H200's held-out TF32 run with autotune and the `fit: 3` variant of
    conf/dispatch/default.yaml (results/tuning/probes/h200_heldout_tf32_fit3_variant_1205_runs.csv):
    at 11335x212x516 `explain` names the same four candidates, in the same order, as the record's
    `autotune_candidates` (the rule's choice, its variant right after it, then the model's picks
    that build other launches); at 4096^3 it measures nothing."""
    import json

    import pandas as pd

    from src.paths import ROOT
    from src.tune import explain

    path = training.evidence_path("h200")
    rows = training.read(path)
    text = explain.report((11335, 212, 516), "h200", "tf32", rows, str(path))
    listed = [line.strip().split("} (", 1)[0] + "}" for line in text.splitlines() if line.startswith("    gemm")]
    probe = pd.read_csv(ROOT / "results" / "tuning" / "probes" / "h200_heldout_tf32_fit3_variant_1205_runs.csv")
    recorded = json.loads(probe[(probe.m == 11335) & (probe.n == 212)].autotune_candidates.iloc[0])
    assert listed == [line.split("}: ", 1)[0] + "}" for line in recorded]  # "kernel {params}: ..."
    assert "autotune: measures these 4 here" in text and "1.99 away" in text
    square = explain.report((4096, 4096, 4096), "h200", "tf32", rows, str(path))
    assert "autotune: measures nothing here" in square and "0.00 away" in square


def test_a_variant_that_builds_another_launch_is_measured_second_and_older_rows_become_earlier(monkeypatch):
    """With `fit: 3` as a variant of gemm_tf32 (dispatch.autotune_variants), autotune at
    11335x212x516 on the H200 measures the rule's 256-row tiles, then the 176-row ones that fill
    one wave, and the recorded run (without the variant) is an earlier dispatch; at 4096^3 the
    variant builds the rule's own launch (its tiles already fill the SMs), so it is not listed."""
    from dataclasses import replace

    from src.job import gpu as gpu_mod
    from src.job.autotune_settings import variants
    from src.paths import ROOT
    from src.publish import dispatched
    from src.records.collect import read_runs

    settings = replace(autotune.default_settings(), enabled=True,
                       variants=variants(
                           [{"kernel": "gemm_tf32", "set": {"fit": 3}, "why": "fill one wave"}]))
    limits = gpu_mod.limits_from_spec("h200")
    rows = training.read(training.evidence_path("h200"))
    cfg = kernel_config("best_tf32")
    problem = Problem(11335, 212, 516, 0.5, 3.0)
    choice = dispatch.choose(cfg, "h200", problem, limits)
    listed = autotune.planned(choice, cfg, "h200", problem, rows, settings, limits)
    assert [c.kernel for c, _ in listed[:2]] == ["gemm_tf32", "gemm_tf32"] and len(listed) == 4
    assert listed[1][0].params == {**choice.params, "fit": 3} and "fill one wave" in listed[1][0].source
    assert "gemm_tf32<176, 128," in listed[1][1] and "gemm_tf32<256, 128," in listed[0][1]
    square = Problem(4096, 4096, 4096, 0.5, 3.0)
    at_square = autotune.planned(dispatch.choose(cfg, "h200", square, limits), cfg, "h200", square, rows,
                                 settings, limits)
    assert not any("fill one wave" in c.source for c, _ in at_square)

    probe = read_runs(ROOT / "results" / "tuning" / "probes" / "h200_heldout_autotune_tf32_1205_runs.csv")
    row = probe[(probe.m == 11335) & (probe.n == 212)]
    key = ("best_tf32", 11335, 212, 516)
    monkeypatch.setattr(autotune, "default_settings", lambda: replace(settings, variants=()))
    assert dispatched.dispatched_today(row, "h200")[key] is None  # measured without a variant
    monkeypatch.setattr(autotune, "default_settings", lambda: settings)
    assert dispatched.dispatched_today(row, "h200")[key].startswith("autotune from gemm_tf32")
