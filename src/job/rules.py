"""`when` lists: the rules of a GPU's tuned file (conf/tuned/<gpu>.yaml), tried in order, the first
whose `when` expression (over m, n, k; no `when`: always) holds wins. Both the size classes of
tuned parameters (src/job/tuned.py) and the per-shape dispatch tables (src/job/dispatch.py) are
such lists, read here the one way.
"""

from __future__ import annotations

from typing import Callable

from src.errors import ConfigError
from src.job.expression import evaluate


def when_text(rule: dict) -> str:
    """The rule's `when` expression as written ("True" when it has none)."""
    return str(rule.get("when", "True"))


def first_rule(rules: list[dict], names: dict, where: str,
               check: Callable[[int, dict], None] | None = None) -> tuple[int, dict] | None:
    """(index, rule) of the first rule whose `when` holds over `names`, or None. `where` names the
    list in an error (e.g. "h100_sxm.yaml: size class 17_flagship"); `check(index, rule)`, if
    given, vets each rule before its `when` is evaluated (the rules after the winner are not read,
    as a `when` list is read at run time)."""
    for index, rule in enumerate(rules):
        if check is not None:
            check(index, rule)
        when = when_text(rule)
        try:
            holds = evaluate(when, names)
        except Exception as exc:
            raise ConfigError(f"{where}[{index}] has a bad `when` expression {when!r}: {exc}") from exc
        if holds:
            return index, rule
    return None
