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
Pure, deterministic: the same rows give the same survivors in any order.
"""

from __future__ import annotations

import statistics

from src.job.training import score
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


def survivors(rows: list[dict], settings: dict,
              guards: dict[str, str | None]) -> dict[tuple[str, str], set[str]]:
    """{(dispatcher, candidate kernel): the params keys (JSON, sorted keys) that survive}."""
    margin = float((settings.get("screen") or {}).get("margin", 0.0))
    caps = (settings.get("screen") or {}).get("max_survivors") or {}
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
        for kernel, by_params in relative.items():
            close = {p: rel for p, rel in by_params.items() if max(rel) >= 1 - margin}
            if close:
                out.setdefault((dispatcher, kernel), set()).update(_capped(close, caps.get(kernel)))
        if mine:
            catch_all = fit.Fitter(fit.table(mine, dispatcher), guards,
                                   settings.get("fit") or {}).catch_all
            if catch_all is not None:
                out.setdefault((dispatcher, catch_all.kernel), set()).add(catch_all.params)
    return out
