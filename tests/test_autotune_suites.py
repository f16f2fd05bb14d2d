"""With autotune on by default (conf/dispatch/default.yaml), the published suites must still
measure the dispatch rules' own choices: every suite shape is a training shape, so autotune finds
it covered well on each GPU whose evidence file is committed, and nothing is measured there
(the suite tables stay what the rules run; the held-out set is where autotune acts)."""

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
    uncovered = []
    for shape in shapes:
        choice = dispatch.choose(cfg, gpu, Problem(*shape, 0.5, 3.0))
        covered = autotune.coverage(choice, dispatcher, shape, rows, settings.max_distance, str(path))
        if not covered.well:
            uncovered.append(f"{'x'.join(map(str, shape))}: {covered.why}")
    assert uncovered == []
