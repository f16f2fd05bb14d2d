"""Dispatch fit: the tuning evidence (results/tuning/<gpu>.csv) -> per dispatching kernel, short
rules from (m, n, k, alignment) to (kernel, parameters), written as the `dispatch:` lists of
conf/tuned/<gpu>.yaml (src/job/dispatch.py reads them). Pure Python, deterministic.

The model (docs/tuning.md says why): a small decision tree over the training shapes. A node's
choice is the candidate (kernel + every parameter) with the best geometric mean of the ratio to
the stronger cuBLAS over the node's shapes, among candidates that ran (status ok) at every one
of them. A node splits at a power of two of m, n, k or m * n (or on 16-byte alignment) when that
raises the geometric mean over its shapes by at least `min_gain`, each side keeping at least
`min_shapes`, down to `max_depth`; ties go to the first split and the first candidate in a fixed
order. Sibling leaves that choose the same candidate merge. Each leaf is a rule (its path's
conditions); leaves choosing the catch-all are left out (their shapes reach it anyway); the last
rule, `True`, is the catch-all: the best candidate that ran at every training shape.

Two-stage evidence (src/tune/plan.py: every candidate at the screening shapes, then only the
survivors at the rest; a row's `stage` says which): where a dispatcher has stage-2 rows, only the
candidates measured in stage 2 can be chosen. A candidate the screen dropped ran at the screening
shapes alone, more than the margin behind each one's best; its rows stay in the evidence, but it
wins no class, not even one of screening shapes only (where a survivor missing at one of them
would otherwise hand it the class by absence).

A kernel that runs only some shapes (its size constraints over m, n, k: gemm_ffma_skinny's
min(m, n) <= 32) carries them in its rule's `when`, and a class that chooses it also names a
fallback: the best unconstrained candidate over the class's shapes outside them, in a second
rule with the class's conditions alone (left out where it is the catch-all). The fit scores a
class with its shapes where they go, so a class of three skinny shapes and forty square ones
chooses the square ones' candidate too, not whatever the catch-all is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from src.job.training import Candidate, Table, table  # noqa: F401 (the fit's vocabulary)
from src.tune.nearest import (AUTO, nearest_model, neighbours, uses_nearest,  # noqa: F401
                             caution, caution_auto, caution_options, small_side, small_side_auto,
                             small_side_options, waves, waves_auto, waves_options,
                             weighting)  # (the nearest model's settings)

ALIGNED = "n % 4 == 0 and k % 4 == 0"
UNALIGNED = "n % 4 != 0 or k % 4 != 0"


@dataclass
class Leaf:
    conditions: list[str]
    shapes: list[tuple[int, int, int]]
    choice: Candidate | None
    score: float                          # sum of log ratios over the shapes
    runner_up: tuple[Candidate, float] | None = None
    fallback: Candidate | None = None     # where `choice` has a guard: the class's shapes outside it

    def pair(self) -> tuple:
        return self.choice, self.fallback


def holds(expr: str | None, shape: tuple[int, int, int]) -> bool:
    if not expr:
        return True
    from src.job.expression import evaluate

    m, n, k = shape
    return bool(evaluate(expr, {"m": m, "n": n, "k": k}))


def feature(name: str, shape: tuple[int, int, int]) -> int:
    m, n, k = shape
    return {"m": m, "n": n, "k": k, "m * n": m * n}[name]


class Fitter:
    def __init__(self, tab: Table, guards: dict[str, str | None], settings: dict):
        self.tab = tab
        self.guards = guards
        self.max_depth = int(settings.get("max_depth", 4))
        self.min_shapes = int(settings.get("min_shapes", 4))
        self.min_gain = math.log(1 + float(settings.get("min_gain", 0.01)))
        self.features = list(settings.get("features", ["m", "n", "k", "m * n"]))
        self._holds: dict = {}
        self._logs = {c: {s: math.log(v) for s, v in tab.of(c).items()} for c in tab.candidates}
        self.catch_all = self._catch_all()

    def _catch_all(self) -> Candidate | None:
        """The best candidate (geomean) that ran at every training shape and has no guard."""
        best = self.best_plain(self.tab.shapes)
        return None if best is None else best[0]

    def inside(self, c: Candidate, shape) -> bool:
        """Whether `c`'s kernel runs `shape` (its guard holds; memoised)."""
        guard = self.guards.get(c.kernel)
        if not guard:
            return True
        key = (guard, shape)
        if key not in self._holds:
            self._holds[key] = holds(guard, shape)
        return self._holds[key]

    def total(self, c: Candidate, shapes) -> float | None:
        """Sum of `c`'s log ratios over `shapes`; None where it failed or was not measured."""
        logs = self._logs.get(c, {})
        out = 0.0
        for s in shapes:
            v = logs.get(s)
            if v is None:
                return None
            out += v
        return out

    def best_plain(self, shapes) -> tuple[Candidate, float] | None:
        """The best candidate without a guard over `shapes` (ties by the fixed order)."""
        best = None
        for c in self.tab.candidates:
            if self.guards.get(c.kernel):
                continue
            t = self.total(c, shapes)
            if t is not None and (best is None or t > best[1]):
                best = (c, t)
        return best

    def ranked(self, shapes) -> list[tuple[Candidate, Candidate | None, float]]:
        """(choice, fallback, sum of log ratios) eligible at every shape, best first (ties by the
        candidates' fixed order). A guarded choice scores its own ratios where its guard holds
        and the best unguarded candidate's over the other shapes (its fallback)."""
        out, fallbacks = [], {}
        for c in self.tab.candidates:
            guard = self.guards.get(c.kernel)
            if not guard:
                t = self.total(c, shapes)
                if t is not None:
                    out.append((c, None, t))
                continue
            inside = [s for s in shapes if self.inside(c, s)]
            t = self.total(c, inside) if inside else None
            if t is None:
                continue
            outside = [s for s in shapes if not self.inside(c, s)]
            if not outside:
                out.append((c, None, t))
                continue
            if guard not in fallbacks:
                fallbacks[guard] = self.best_plain(outside)
            fb = fallbacks[guard]
            if fb is not None:
                out.append((c, fb[0], t + fb[1]))
        out.sort(key=lambda item: -item[2])  # stable: ties keep the candidates' fixed order
        return out

    def leaf(self, conditions, shapes) -> Leaf:
        ranked = self.ranked(shapes)
        if not ranked:
            return Leaf(conditions, shapes, None, float("-inf"))
        choice, fallback, total = ranked[0]
        runner = (ranked[1][0], ranked[1][2]) if len(ranked) > 1 else None
        return Leaf(conditions, shapes, choice, total, runner, fallback)

    def value(self, leaf: Leaf, shape) -> float:
        """The log ratio `leaf`'s rules give `shape` (its choice, or its fallback outside the
        choice's guard)."""
        c = leaf.choice if self.inside(leaf.choice, shape) else leaf.fallback
        return math.log(self.tab.ratio[(shape, c)])

    def splits(self, shapes):
        """(left conditions, right conditions, left shapes, right shapes) for each allowed split."""
        for name in self.features:
            values = sorted({feature(name, s) for s in shapes})
            for power in range(0, 64):
                t = 2 ** power
                if t < values[0]:
                    continue
                if t >= values[-1]:
                    break
                left = [s for s in shapes if feature(name, s) <= t]
                right = [s for s in shapes if feature(name, s) > t]
                yield f"{name} <= {t}", f"{name} > {t}", left, right
        left = [s for s in shapes if s[1] % 4 == 0 and s[2] % 4 == 0]
        right = [s for s in shapes if not (s[1] % 4 == 0 and s[2] % 4 == 0)]
        yield ALIGNED, UNALIGNED, left, right

    def grow(self, conditions: list[str], shapes, depth: int) -> list[Leaf]:
        here = self.leaf(conditions, shapes)
        if depth >= self.max_depth or len(shapes) < 2 * self.min_shapes:
            return [here]
        best = None
        for lc, rc, left, right in self.splits(shapes):
            if len(left) < self.min_shapes or len(right) < self.min_shapes:
                continue
            a, b = self.leaf(conditions + [lc], left), self.leaf(conditions + [rc], right)
            if a.choice is None or b.choice is None:
                continue
            gain = (a.score + b.score - here.score) / len(shapes)
            if best is None or gain > best[0]:
                best = (gain, lc, rc, left, right)
        if best is None or (here.choice is not None and best[0] < self.min_gain):
            return [here]
        _, lc, rc, left, right = best
        leaves = (self.grow(conditions + [lc], left, depth + 1)
                  + self.grow(conditions + [rc], right, depth + 1))
        if here.choice is not None and all(l.pair() == here.pair() for l in leaves):
            return [here]  # the subtree agrees: one rule
        return leaves

    def fit(self) -> list[Leaf]:
        return self.grow([], list(self.tab.shapes), 0)


def _stats(fitter: Fitter, leaf: Leaf) -> tuple[float, float, tuple]:
    values = [(math.exp(fitter.value(leaf, s)), s) for s in leaf.shapes]
    geo = math.exp(sum(math.log(v) for v, _ in values) / len(values))
    low = min(values)
    return geo, low[0], low[1]


def _rule(when: str, c: Candidate, why: str) -> dict:
    return {"when": when, "kernel": c.kernel, "params": json.loads(c.params), "why": why}


def region_rules(fitter: Fitter, regions: dict[str, str]) -> list[dict]:
    """One rule per reserved region (`regions`: {owner kernel: its `when`}), first in the list:
    the owner's candidate with the best geomean over the region's training shapes (among those
    measured at all of them), where the owner's guard holds too. No rule for a region without
    training shapes or without such a candidate."""
    rules = []
    for owner, when in regions.items():
        shapes = [s for s in fitter.tab.shapes if holds(when, s)]
        if not shapes:
            continue
        best = None
        for c in (c for c in fitter.tab.candidates if c.kernel == owner):
            t = fitter.total(c, shapes)
            if t is not None and (best is None or t > best[1]):
                best = (c, t)
        if best is None:
            continue
        geo, low, where = _stats(fitter, Leaf([], shapes, best[0], best[1]))
        rules.append(_rule(conjunction([p for p in (when, fitter.guards.get(owner)) if p]), best[0],
                           f"reserved for {owner}: {len(shapes)} shapes, geomean {geo:.2f}x, "
                           f"min {low:.2f}x at {'x'.join(map(str, where))}"))
    return rules


def rules_for(rows: list[dict], dispatcher: str, guards: dict[str, str | None],
              settings: dict, regions: dict[str, str] | None = None) -> list[dict]:
    """The dispatch rules for one dispatching kernel, in order, each with a one-line `why`
    summing up its class's training shapes (the file's header names the evidence): the reserved
    regions' rules (`regions`, conf/tuning/dispatch.yaml `reserved`) first, then the tree's."""
    fitter = Fitter(table(rows, dispatcher), guards, settings)
    rules = region_rules(fitter, regions or {})
    for leaf in fitter.fit():
        if leaf.choice is None or (leaf.choice == fitter.catch_all and leaf.conditions):
            continue
        if not leaf.conditions and leaf.choice == fitter.catch_all:
            continue  # the whole set is one class: the catch-all below says it
        when = " and ".join(f"({c})" if " or " in c else c for c in leaf.conditions) or "True"
        guard = guards.get(leaf.choice.kernel)
        geo, low, where = _stats(fitter, leaf)
        runner = ""
        if leaf.runner_up is not None:
            runner = f"; next {math.exp(leaf.runner_up[1] / len(leaf.shapes)):.2f}x"
        why = (f"{len(leaf.shapes)} shapes, geomean {geo:.2f}x, min {low:.2f}x at "
               f"{'x'.join(map(str, where))}{runner}")
        if not guard:
            rules.append(_rule(when, leaf.choice, why))
            continue
        ran = sum(fitter.inside(leaf.choice, s) for s in leaf.shapes)
        rules.append(_rule(f"({when}) and ({guard})" if when != "True" else guard, leaf.choice,
                           f"{why}; runs at {ran}"))
        if leaf.fallback is not None and (leaf.fallback != fitter.catch_all or when == "True"):
            rules.append(_rule(when, leaf.fallback, f"the class's {len(leaf.shapes) - ran} shapes "
                                                    f"{leaf.choice.kernel} does not run"))
    if fitter.catch_all is not None and not (rules and rules[-1]["when"] == "True"):
        geo, low, where = _stats(fitter, Leaf([], list(fitter.tab.shapes), fitter.catch_all, 0.0))
        rules.append(_rule("True", fitter.catch_all,
                           f"ran at all {len(fitter.tab.shapes)} shapes, geomean {geo:.2f}x, "
                           f"min {low:.2f}x at {'x'.join(map(str, where))}"))
    return rules


def fit(rows: list[dict], guards: dict[str, str | None], settings: dict,
        regions: dict[str, str] | None = None) -> dict:
    """{dispatcher: rules} for every dispatching kernel in the evidence, in name order, each
    dispatcher's tree on a core of its own (src/tune/forked.py)."""
    from src.tune import forked

    names = sorted({r["dispatcher"] for r in rows})
    return dict(zip(names, forked.mapped(lambda d: rules_for(rows, d, guards, settings, regions), names,
                                            cost=len(rows))))


def guard_of(kernel_cfg: dict) -> str | None:
    """A kernel's size constraints that read only m, n and k, joined: the shapes it runs."""
    import ast

    def names(expr: str) -> set[str]:
        return {node.id for node in ast.walk(ast.parse(expr, mode="eval"))
                if isinstance(node, ast.Name)}

    return conjunction([str(c["rule"]) for c in kernel_cfg.get("size_constraints") or []
                        if names(str(c["rule"])) <= {"m", "n", "k", "min", "max", "ceil_div"}])


def conjunction(parts: list[str]) -> str | None:
    """`parts` joined by `and` (each in parentheses when there are several); None for none."""
    return " and ".join(f"({p})" if len(parts) > 1 else p for p in parts) or None


HEADER = ("Per-shape dispatch written by `sgemm-lab tune` (src/tune/fit.py) from {evidence}:\n"
          "rules in order, the first whose `when` holds names the kernel and all its parameters;\n"
          "each `why` sums up its class's training shapes there (speed / the stronger cuBLAS;\n"
          "`next`: the runner-up). With a `nearest:` section, the runner first takes the\n"
          "candidate best over the `count` nearest training shapes; the rules serve where none\n"
          "qualifies. Re-fit: sgemm-lab tune --fit-only.")


def write(path, dispatch: dict, evidence: str, nearest: dict | None = None) -> None:
    """Replace the file's `dispatch:` lists with `dispatch`, and its `nearest:` section with
    `nearest` (removed where None); the rest, comments included, stays; a new file gets a
    header."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    yaml = YAML()
    yaml.width = 400
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    data = yaml.load(path.read_text()) if path.is_file() else None
    new = data is None
    if new:
        data = CommentedMap()
        data.yaml_set_start_comment(HEADER.format(evidence=evidence))
    table_node = CommentedMap()
    for dispatcher, rules in dispatch.items():
        seq = CommentedSeq()
        for rule in rules:
            params = CommentedMap(sorted(rule["params"].items()))
            params.fa.set_flow_style()
            seq.append(CommentedMap([("when", DoubleQuotedScalarString(rule["when"])),
                                     ("kernel", rule["kernel"]), ("params", params),
                                     ("why", DoubleQuotedScalarString(rule["why"]))]))
        table_node[dispatcher] = seq
    had = "dispatch" in data
    data["dispatch"] = table_node
    if nearest is None:
        data.pop("nearest", None)
    else:
        guards = CommentedMap((k, DoubleQuotedScalarString(v)) for k, v in nearest["guards"].items())
        weighs = nearest["weighting"]
        def flow(value):  # per dispatcher (`auto`): one line
            if not isinstance(value, dict):
                return value
            value = CommentedMap(sorted(value.items()))
            value.fa.set_flow_style()
            return value

        sha = [("evidence_sha256", nearest["evidence_sha256"])] if nearest.get("evidence_sha256") else []
        def quoted(whens):  # one line: the `when`s quoted as the guards are
            listed = CommentedSeq(DoubleQuotedScalarString(r) for r in whens)
            listed.fa.set_flow_style()
            return listed

        found = nearest.get("regions")  # one list, or one per dispatcher (fit.reserved_sides: auto)
        regions = [] if not found else [("regions", CommentedMap(
            (d, quoted(w)) for d, w in sorted(found.items())) if isinstance(found, dict) else quoted(found))]
        data["nearest"] = CommentedMap([("evidence", nearest["evidence"]), *sha, ("count", nearest["count"]),
                                        ("weighting", flow(weighs)), ("waves", flow(nearest.get("waves", 0))),
                                        *([("waves_cap", flow(nearest["waves_cap"]))] if nearest.get("waves_cap") else []),
                                        ("small_side", flow(nearest.get("small_side", 0))),
                                        ("caution", flow(nearest.get("caution", 0))),
                                        *regions, ("guards", guards)])
    if not had and not new:  # once: a re-fit replaces the lists and leaves the comment as it is
        data.yaml_set_comment_before_after_key("dispatch", before=HEADER.format(evidence=evidence))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    with tmp.open("w") as handle:
        yaml.dump(data, handle)
    tmp.replace(path)
