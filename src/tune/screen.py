"""Screening: stage 1's evidence (every candidate at the screening shapes) -> the survivors that
stage 2 of `sgemm-lab tune` measures at the other training shapes (src/tune/plan.py). Per
dispatching kernel, a candidate survives when its ratio to the stronger cuBLAS came within
`screen.margin` of the best candidate's at some screening shape; so does the catch-all the fit
would choose from the screen (the best geomean among unguarded candidates that ran at every
screening shape), so that the fit keeps a candidate measured at every training shape. Pure,
deterministic: the same rows give the same survivors in any order.
"""

from __future__ import annotations

from src.job.training import score
from src.tune import fit


def survivors(rows: list[dict], settings: dict,
              guards: dict[str, str | None]) -> dict[tuple[str, str], set[str]]:
    """{(dispatcher, candidate kernel): the params keys (JSON, sorted keys) that survive}."""
    margin = float((settings.get("screen") or {}).get("margin", 0.0))
    out: dict[tuple[str, str], set[str]] = {}
    for dispatcher, entry in settings["dispatchers"].items():
        mine = [r for r in rows if r["dispatcher"] == dispatcher
                and r["kernel"] in entry["candidates"]]
        scored = [(r, score(r)) for r in mine if r["status"] == "ok"]
        best: dict[str, float] = {}
        for r, value in scored:
            if value is not None:
                best[r["shape"]] = max(best.get(r["shape"], 0.0), value)
        for r, value in scored:
            if value is not None and value >= best[r["shape"]] * (1 - margin):
                out.setdefault((dispatcher, r["kernel"]), set()).add(r["params"])
        if mine:
            catch_all = fit.Fitter(fit.table(mine, dispatcher), guards,
                                   settings.get("fit") or {}).catch_all
            if catch_all is not None:
                out.setdefault((dispatcher, catch_all.kernel), set()).add(catch_all.params)
    return out
