"""Screening: stage 1's evidence (every candidate at the screening shapes) -> the survivors that
stage 2 of `sgemm-lab tune` measures at the other training shapes (src/tune/plan.py). Per
dispatching kernel, a candidate survives when its ratio to the stronger cuBLAS came within
`screen.margin` of the best candidate's at some screening shape; so does the catch-all the fit
would choose from the screen (the best geomean among unguarded candidates that ran at every
screening shape), so that the fit keeps a candidate measured at every training shape. Where
`screen.max_survivors` names a kernel, at most that many of its near-misses go on: every
candidate that was the best at some screening shape survives, then the closest to the best
(their best ratio to a screening shape's best, then their geomean of it over the screen), so a
grid of many near-equal variants (small FFMA tiles at tiny shapes) does not multiply stage 2.
Where `screen.own_best` names a kernel, its own N best candidates at each screening shape go on
as well, however far another kernel was ahead there: a kernel measured only where it might win
(`measured_where`) is judged at few screening shapes, none perhaps of the class it was made for
(gemm_mma_tf32: narrow, long-K, unaligned products), so its tiles reach stage 2 to be measured
there. Pure, deterministic: the same rows give the same survivors in any order.

The second screen (`rescreened`) picks stage 3's candidates, measured at `training.added`'s draws:
of stage 2's, those that came within `screen.rescreen_margin` of the best at some shape of stages 1
and 2, or that the nearest model would choose at one of those shapes were it left out (a steady
second best over a neighbourhood, never close at one shape; under `fit.weighting: auto`, either
weighting's choice, and under `fit.reserved_sides: auto` the choice with the reserved regions'
sides kept apart and without), or the catch-all. Closeness counts
where the candidate's own launch was measured, not as the twin (`same_as`) of another's: there
the measured one stands for both. The others ran at every training shape so far and added nothing.
"""

from __future__ import annotations

import statistics

from src.job import training
from src.job.training import NearestModel, score
from src.tune import fit


def _capped(close: dict[str, list[float]], cap: int | None) -> set[str]:
    """The params keys that go on: all of `close` ({params: its ratios to each screening shape's
    best}) without a cap, else the winners and the closest others up to `cap` in all."""
    if cap is None or len(close) <= cap:
        return set(close)
    winners = {p for p, rel in close.items() if max(rel) >= 1.0}

    def closeness(p: str) -> tuple:
        rel = close[p]
        return (-max(rel), -statistics.geometric_mean(rel), p)

    others = sorted((p for p in close if p not in winners), key=closeness)
    return winners | set(others[:max(0, cap - len(winners))])


def _own_best(scored: list[tuple[dict, float]], count: int) -> set[str]:
    """The params keys of the `count` best of one kernel's candidates at each screening shape
    (ties by the params key)."""
    by_shape: dict[str, list[tuple[float, str]]] = {}
    for r, value in scored:
        by_shape.setdefault(r["shape"], []).append((-value, r["params"]))
    return {p for ranked in by_shape.values() for _, p in sorted(ranked)[:count]}


def _launches(rows: list[dict]) -> dict[str, tuple]:
    """{params key: its launch at each shape of one kernel's `rows`}: its own params, or those its
    `same_as` names (twins share one)."""
    at: dict[str, dict[str, str]] = {}
    for r in rows:
        at.setdefault(r["params"], {})[r["shape"]] = r.get("same_as") or r["params"]
    return {p: tuple(sorted(shapes.items())) for p, shapes in at.items()}


def _firsts(launches: dict[str, tuple]) -> set[str]:
    """One params key of each group of twins (the first by key): the screen ranks it alone, so
    that twins, tied by construction, take one of a cap's places, not several."""
    first: dict[tuple, str] = {}
    for p in sorted(launches):
        first.setdefault(launches[p], p)
    return set(first.values())


def _with_twins(kept: set[str], launches: dict[str, tuple]) -> set[str]:
    """`kept` and every twin of a kept params key (the same launch at every shape)."""
    seen = {launches[p] for p in kept if p in launches}
    return kept | {p for p, at in launches.items() if at in seen}


def survivors(rows: list[dict], settings: dict,
              guards: dict[str, str | None]) -> dict[tuple[str, str], set[str]]:
    """{(dispatcher, candidate kernel): the params keys (JSON, sorted keys) that survive}."""
    margin = float((settings.get("screen") or {}).get("margin", 0.0))
    caps = (settings.get("screen") or {}).get("max_survivors") or {}
    own_best = (settings.get("screen") or {}).get("own_best") or {}
    out: dict[tuple[str, str], set[str]] = {}
    for dispatcher, entry in settings["dispatchers"].items():
        mine = [r for r in rows if r["dispatcher"] == dispatcher
                and r["kernel"] in entry["candidates"]]
        scored = [(r, score(r)) for r in mine if r["status"] == "ok"]
        best: dict[str, float] = {}
        for r, value in scored:
            if value is not None:
                best[r["shape"]] = max(best.get(r["shape"], 0.0), value)
        relative: dict[str, dict[str, list[float]]] = {}   # kernel -> params -> value / best
        for r, value in scored:
            if value is not None:
                relative.setdefault(r["kernel"], {}).setdefault(r["params"], []).append(
                    value / best[r["shape"]])
        launches = {kernel: _launches([r for r in mine if r["kernel"] == kernel])
                    for kernel in {r["kernel"] for r in mine}}
        firsts = {kernel: _firsts(by_params) for kernel, by_params in launches.items()}
        for kernel, by_params in relative.items():
            close = {p: rel for p, rel in by_params.items()
                     if max(rel) >= 1 - margin and p in firsts[kernel]}
            if close:
                out.setdefault((dispatcher, kernel), set()).update(_capped(close, caps.get(kernel)))
        for kernel, count in own_best.items():
            own = _own_best([(r, v) for r, v in scored if r["kernel"] == kernel and v is not None
                             and r["params"] in firsts[kernel]], int(count))
            if own:
                out.setdefault((dispatcher, kernel), set()).update(own)
        if mine:
            catch_all = fit.Fitter(fit.table(mine, dispatcher), guards,
                                   settings.get("fit") or {}).catch_all
            if catch_all is not None:
                out.setdefault((dispatcher, catch_all.kernel), set()).add(catch_all.params)
        for (owner, kernel), kept in out.items():
            if owner == dispatcher:
                out[(owner, kernel)] = _with_twins(kept, launches.get(kernel, {}))
    return out


def rescreened(rows: list[dict], settings: dict, guards: dict[str, str | None],
               survivors: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    """{(dispatcher, candidate kernel): the params keys stage 3 measures}: of `survivors` (stage
    2's), those the second screen keeps over `rows` (stages 1 and 2; see the module's doc)."""
    from src.tune import judge
    from src.tune.nearest import AUTO, reserved_sides
    from src.tune.plan import reserved

    screen = settings.get("screen") or {}
    margin = float(screen.get("rescreen_margin", screen.get("margin", 0.0)))
    fitting = settings.get("fit") or {}
    # `auto` settles the weighting on the whole evidence, stage 3's too: keep either one's choice
    weighs = list(training.WEIGHTINGS) if fitting.get("weighting") == fit.AUTO else None
    sides, whens = reserved_sides(fitting), tuple(sorted(reserved(settings).values()))
    out: dict[tuple[str, str], set[str]] = {}
    for dispatcher in settings["dispatchers"]:
        mine = [r for r in rows if r["stage"] in (1, 2) and r["dispatcher"] == dispatcher
                and r["params"] in survivors.get((dispatcher, r["kernel"]), ())]
        if not mine:
            continue
        fitter = fit.Fitter(fit.table(mine, dispatcher), guards, fitting)
        ratio = fitter.tab.ratio
        best: dict = {}
        for (shape, _), value in ratio.items():
            best[shape] = max(best.get(shape, 0.0), value)
        own = {((int(r["m"]), int(r["n"]), int(r["k"])), fit.Candidate(r["kernel"], r["params"]))
               for r in mine if not r.get("same_as")}  # measured, not a twin
        keep = {c for (shape, c), value in ratio.items()
                if (shape, c) in own and value >= (1 - margin) * best[shape]}
        on = sides.get(dispatcher, False) if isinstance(sides, dict) else sides
        apart = [(), whens] if on == AUTO else [whens if on else ()]  # auto: either one's choice
        for shape in fitter.tab.shapes:
            among = [s for s in fitter.tab.shapes if s != shape]
            for weights in weighs or [fit.weighting(fitting, dispatcher)]:
                for regions in apart:
                    found = judge.nearest_choice(fitter, shape, among,
                                                 NearestModel(fit.neighbours(fitting), weights, regions=regions))
                    if found is not None:
                        keep.add(found)
        if fitter.catch_all is not None:
            keep.add(fitter.catch_all)
        for cand in keep:
            out.setdefault((dispatcher, cand.kernel), set()).add(cand.params)
    return out
