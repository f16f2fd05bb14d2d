"""Covered well? The first question of a dispatching job's autotune (src/job/autotune.py): does a
dispatch rule cover the job's shape well enough that its choice runs unmeasured, or does autotune
measure a few candidates there first. With the tuner's evidence (results/tuning/<gpu>.csv): when
the nearest training shape lies within `dispatch.autotune_max_distance` in log2(m, n, k) and the
rule's choice measured there within `dispatch.autotune_margin` of the best measured there; without
evidence, when a rule other than a catch-all (`when: True`) holds. A shape no rule holds (the
dispatcher's default) is never covered well."""

from __future__ import annotations

import json
from dataclasses import dataclass

from src.job import dispatch, training
from src.job.problem import shape_label


@dataclass(frozen=True)
class Coverage:
    well: bool
    why: str


def coverage(choice: dispatch.DispatchChoice, dispatcher: str, shape: tuple[int, int, int],
             rows: list[dict] | None, max_distance: float, evidence_name: str, *, margin: float,
             table: training.Table | None = None) -> Coverage:
    """Whether the dispatch rules cover `shape` well (the module's docstring), and why.
    `table`: training.table(rows, dispatcher), where the caller has it already."""
    if choice.when is None:
        return Coverage(False, f"no dispatch rule of {dispatcher} holds at {shape_label(shape)}: the "
                               f"dispatcher's default runs, portable, not measured on this GPU")
    if rows is not None:
        near = training.nearest(rows, dispatcher, shape, 1, shapes=table.shapes if table else None)
        if not near:
            return Coverage(False, f"{evidence_name} has no {dispatcher} rows: nothing measured "
                                   f"near {shape_label(shape)}")
        far = training.distance(near[0], shape)
        if far > max_distance:
            return Coverage(False, f"the nearest training shape {shape_label(near[0])} is {far:.2f} away "
                                   f"in log2(m, n, k) (> {max_distance:g}): the rules extrapolate here")
        # the model weighs several neighbours (and their wave fills): where the nearest one's own
        # measurements rank its choice below their best, the rules guess here (docs/tuning.md)
        tab = table or training.table(rows, dispatcher)
        rule = training.Candidate(choice.kernel, json.dumps(choice.params, sort_keys=True))
        there = tab.of(rule).get(near[0])
        best = max((v for (s, _), v in tab.ratio.items() if s == near[0]), default=None)
        if best is not None and (there is None or there < best * (1 - margin)):
            measured = "nothing" if there is None else f"{there:.3f}x"
            return Coverage(False, f"the nearest training shape {shape_label(near[0])} is {far:.2f} away, but "
                                   f"the rule's choice measured there {measured} against its best "
                                   f"{best:.3f}x (more than {margin:.0%} apart)")
        return Coverage(True, f"the nearest training shape {shape_label(near[0])} is {far:.2f} away in "
                              f"log2(m, n, k) (<= {max_distance:g}) and the rule's choice measured "
                              f"within {margin:.0%} of its best there: the rules were fitted near it")
    if choice.when.strip() == "True":
        return Coverage(False, f"only the catch-all rule holds at {shape_label(shape)} and there is no "
                               f"evidence file {evidence_name}: nothing measured says its choice suits it")
    return Coverage(True, f"the rule `{choice.when}` holds at {shape_label(shape)} (not a catch-all)")
