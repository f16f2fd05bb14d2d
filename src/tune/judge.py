"""How a fitted dispatch does, judged from the tuning evidence (results/tuning/<gpu>.csv) alone,
no GPU: on training shapes each fold's fit did not see (`cross_validated`, printed with every fit),
beside what the best measured candidate reaches at each shape (`ceiling`: the bound on any model),
and whether two tuning runs fit the same choices within the noise (`agreement`, `sgemm-lab tune
--against`). The fit itself is src/tune/fit.py; the held-out set (the `heldout` stage) is the
judge that measures."""

from __future__ import annotations

import json
import math

from src.job import training
from src.job.training import NearestModel
from src.tune import forked
from src.tune.fit import Candidate, Fitter, holds, rules_for, table
from src.tune.nearest import (AUTO, caution, caution_auto, caution_options, fill_of, neighbours,
                              small_side, small_side_auto, small_side_options, uses_nearest, waves, waves_auto,
                              waves_cap, waves_options, weighting, regions as nearest_regions)


def cross_validated(rows: list[dict], guards: dict[str, str | None], settings: dict,
                    folds: int = 5, regions: dict[str, str] | None = None) -> dict[str, dict]:
    """How the fit does on training shapes it did not see, per dispatching kernel: the shapes
    (sorted) go round-robin into `folds` folds; the rules fitted without a fold choose at each of
    its shapes (the first rule whose `when` holds, as the runner reads them), and the measured
    ratio of that choice there is the shape's figure. A choice not measured at the shape (the
    screen dropped it there) is counted apart. The held-out set is the judge; this says before
    measuring it whether the classes carry over or only remember their shapes."""
    wholes = {d: table(rows, d) for d in sorted({r["dispatcher"] for r in rows})}
    held = {d: {s: i % folds for i, s in enumerate(w.shapes)} for d, w in wholes.items()}
    fits = [(d, fold) for d, w in wholes.items() for fold in range(min(folds, len(w.shapes)))]

    def fold_rules(fit_of: tuple[str, int]) -> list[dict]:  # every dispatcher's folds on every core
        d, fold = fit_of
        train = [r for r in rows
                 if r["dispatcher"] == d and held[d][(int(r["m"]), int(r["n"]), int(r["k"]))] != fold]
        return rules_for(train, d, guards, settings, regions)

    out, rules = {}, dict(zip(fits, forked.mapped(fold_rules, fits, cost=len(rows))))
    for d, whole in wholes.items():
        figures = [(whole.ratio.get((s, choice_at(rules[d, held[d][s]], s))), s) for s in whole.shapes]
        if any(v is not None for v, _ in figures):
            out[d] = {"folds": folds, **_summary(figures, len(whole.shapes))}
    return out


def ceiling(rows: list[dict], lowest: int = 5,
            drawn: set[tuple[int, int, int]] | None = None) -> dict[str, dict]:
    """What no dispatch over these candidates can beat at the training shapes, per dispatching
    kernel: each shape's best measured candidate (among those the fit may choose, as `table`
    keeps them). Its min is the floor that only a kernel change raises, whatever the model; its
    `lowest` shapes (with the kernel that did best there) say where that work is. With `drawn`,
    `drawn` summarises the random draws alone, as `nearest_cross_validated` does."""
    out = {}
    for dispatcher in sorted({r["dispatcher"] for r in rows}):
        tab = table(rows, dispatcher)
        best = {}
        for (shape, candidate), value in tab.ratio.items():
            if shape not in best or value > best[shape][0]:
                best[shape] = (value, candidate.kernel)
        if not best:
            continue
        figures = [(best.get(s, (None,))[0], s) for s in tab.shapes]
        low = sorted((v, s, kernel) for s, (v, kernel) in best.items())[:lowest]
        out[dispatcher] = {**_summary(figures, len(tab.shapes)),
                           "below_parity": sum(v < 1.0 for v, _ in best.values()),
                           "lowest": [("x".join(map(str, s)), v, kernel) for v, s, kernel in low]}
        out[dispatcher].update(_drawn_summary(figures, drawn))
    return out


def _drawn_summary(figures: list[tuple[float | None, tuple]], drawn: set | None) -> dict:
    """{"drawn": the summary of the figures at the random draws alone}, or {} without any."""
    mine = [(v, s) for v, s in figures if drawn is not None and s in drawn]
    return {"drawn": _summary(mine, len(mine))} if any(v is not None for v, _ in mine) else {}


def _summary(figures: list[tuple[float | None, tuple]], shapes: int) -> dict:
    """Geomean and min of the left-out figures; a shape whose choice was not measured there (None)
    is counted apart."""
    measured = [(v, s) for v, s in figures if v is not None]
    low = min(measured)
    return {"shapes": shapes, "unmeasured": len(figures) - len(measured),
            "geomean": math.exp(sum(math.log(v) for v, _ in measured) / len(measured)),
            "min": low[0], "min_shape": "x".join(map(str, low[1]))}


def nearest_choice(fitter: Fitter, shape: tuple[int, int, int], among: list,
                   model: NearestModel) -> Candidate | None:
    """The candidate the nearest-neighbour model (src/job/training.nearest_choice, weighing its
    neighbours as `model` says) takes at `shape` from the shapes `among`, each candidate's guard
    as the fit's (`fitter.inside`)."""
    found = training.nearest_choice(fitter.tab, shape, among, fitter.inside, model)
    return None if found is None else found[0]


def nearest_cross_validated(rows: list[dict], guards: dict[str, str | None], settings: dict,
                            folds: int | None = 5, count: int = 4,
                            drawn: set[tuple[int, int, int]] | None = None,
                            weights: str | None = None, gpu_spec: str | None = None,
                            power: float | None = None, side: float | None = None,
                            share: float | None = None,
                            regions: tuple[str, ...] | None = None) -> dict[str, dict]:
    """The other model, judged on the same folds as `cross_validated`: each left-out shape runs
    `nearest_choice` over the other folds' shapes. Printed beside the tree's figures so that the
    choice of model stays a measured one (docs/tuning.md). With `drawn` (the training set's random
    draws), `drawn` in the result summarises those shapes alone: the suites' shapes are mostly big
    products where the library is far ahead, so the whole set's geomean overstates what the
    held-out set, all random draws, will read. `folds=None` leaves one shape out at a time (the
    model then sees every other shape, as at a held-out shape); `weights` overrides the
    settings' `fit.weighting`, `power` its `fit.waves` (the wave fills are `gpu_spec`'s; without
    one, no scaling), `side` its `fit.small_side`, `share` its `fit.caution`, `regions` its
    reserved regions whose sides stay apart; the fill ratio's cap is the settings' `fit.waves_cap`."""
    out = {}
    for dispatcher in sorted({r["dispatcher"] for r in rows}):
        weighs = weights or weighting(settings, dispatcher)
        scale = power if power is not None else waves(settings, dispatcher)
        weight = side if side is not None else small_side(settings, dispatcher)
        worst = share if share is not None else caution(settings, dispatcher)
        whole = table(rows, dispatcher)
        fill = fill_of(rows, dispatcher, whole, gpu_spec, scale)
        fitter = Fitter(whole, guards, settings)
        apart = nearest_regions(settings, dispatcher) if regions is None else regions
        model = NearestModel(count, weighs, fill, scale, weight, worst, apart, waves_cap(settings, dispatcher))
        held = {s: i if folds is None else i % folds for i, s in enumerate(whole.shapes)}

        def figure(shape: tuple[int, int, int]) -> tuple[float | None, tuple[int, int, int]]:
            among = [s for s in whole.shapes if held[s] != held[shape]]
            return whole.ratio.get((shape, nearest_choice(fitter, shape, among, model))), shape

        figures = forked.mapped(figure, whole.shapes, chunks="stripes",
                                 cost=len(whole.shapes) * len(whole.candidates))
        if any(v is not None for v, _ in figures):
            out[dispatcher] = {"folds": folds, "count": count, "weighting": weighs,
                               "waves": scale if fill is not None else 0.0, "waves_cap": model.waves_cap, "small_side": weight,
                               "caution": worst, "reserved_sides": bool(apart),
                               **_summary(figures, len(whole.shapes))}
            out[dispatcher].update(_drawn_summary(figures, drawn))
    return out


def leave_one_out(rows: list[dict], guards: dict[str, str | None], settings: dict,
                  drawn: set[tuple[int, int, int]] | None = None) -> dict[str, dict[str, dict]]:
    """{weighting: {dispatcher: figures}}: the nearest model left one shape out at a time
    (`nearest_cross_validated`, folds=None) under each of src/job/training.WEIGHTINGS, no wave-fill
    scaling, the plain distance (what `resolved` chooses from and `report` prints; `settings`' own
    weighting, waves and small_side are not read)."""
    count = neighbours(settings)
    return {w: nearest_cross_validated(rows, guards, settings, folds=None, count=count,
                                       drawn=drawn, weights=w, power=0.0, side=0.0, share=0.0)
            for w in training.WEIGHTINGS}


def waves_apart(rows: list[dict], guards: dict[str, str | None], settings: dict,
                drawn: set[tuple[int, int, int]] | None, gpu_spec: str) -> dict[float, dict[str, dict]]:
    """{power: {dispatcher: figures}}: the nearest model left one shape out at a time under each
    of `fit.waves_options`, each dispatcher's neighbours weighed as `settings` (its weighting
    resolved) says, the plain distance; what `fit.waves: auto` chooses from."""
    return _options_apart(rows, guards, settings, drawn, gpu_spec, "power", waves_options(settings),
                          side=0.0, share=0.0)


def small_side_apart(rows: list[dict], guards: dict[str, str | None], settings: dict,
                     drawn: set[tuple[int, int, int]] | None, gpu_spec: str) -> dict[float, dict[str, dict]]:
    """{weight: {dispatcher: figures}}: the nearest model left one shape out at a time under each
    of `fit.small_side_options`, each dispatcher's weighting and waves as `settings` (resolved)
    says; what `fit.small_side: auto` chooses from."""
    return _options_apart(rows, guards, settings, drawn, gpu_spec, "side", small_side_options(settings),
                          share=0.0)


def caution_apart(rows: list[dict], guards: dict[str, str | None], settings: dict,
                  drawn: set[tuple[int, int, int]] | None, gpu_spec: str) -> dict[float, dict[str, dict]]:
    """{share: {dispatcher: figures}}: the nearest model left one shape out at a time under each
    of `fit.caution_options`, the other settings as `settings` (resolved) says; what
    `fit.caution: auto` chooses from."""
    return _options_apart(rows, guards, settings, drawn, gpu_spec, "share", caution_options(settings))


def sides_apart(rows: list[dict], guards: dict[str, str | None], settings: dict, drawn: set | None,
                gpu_spec: str, whens: list[str]) -> dict[bool, dict[str, dict]]:
    """{kept apart: {dispatcher: figures}}: left one out with the sides of the reserved regions
    `whens` kept apart or not, the rest as `settings` says; what `fit.reserved_sides: auto` weighs."""
    return {sided: nearest_cross_validated(rows, guards, settings, None, neighbours(settings), drawn,
                                           gpu_spec=gpu_spec, regions=tuple(whens) if sided else ())
            for sided in (False, True)}


def _options_apart(rows: list[dict], guards: dict[str, str | None], settings: dict,
                   drawn: set[tuple[int, int, int]] | None, gpu_spec: str, key: str,
                   options: list[float], **fixed: float) -> dict[float, dict[str, dict]]:
    """{option: {dispatcher: figures}}: `nearest_cross_validated` one shape left out at a time with
    its argument `key` at each of `options`, the arguments `fixed` as given, the rest from
    `settings`."""
    count = neighbours(settings)
    return {v: nearest_cross_validated(rows, guards, settings, folds=None, count=count, drawn=drawn,
                                       gpu_spec=gpu_spec, **{key: v}, **fixed)
            for v in options}


def chosen_weightings(apart: dict, tie: float, plain="equal", kept: dict | None = None) -> dict:
    """{dispatcher: weighting} that `fit.weighting: auto` takes from `leave_one_out`'s figures,
    at the random draws where there are any (the held-out set's distribution): the higher
    geomean; geomeans within `tie` (relative) of each other, the higher min; minima that close
    too, the option the tuned file holds now (`kept`, {dispatcher: option}: a tie is noise, and
    re-running the command should reproduce its choices), else `plain`, the plainer model
    (`equal`; for `waves_apart`'s powers, 0)."""
    out = {}
    for dispatcher in sorted(set.intersection(*(set(cvs) for cvs in apart.values()))):
        figures = {w: cvs[dispatcher].get("drawn") or cvs[dispatcher] for w, cvs in apart.items()}
        best = (kept or {}).get(dispatcher, plain)
        best = best if best in figures else plain
        for w, f in figures.items():
            held = figures[best]
            if f["geomean"] > held["geomean"] * (1 + tie) or (
                    f["geomean"] >= held["geomean"] * (1 - tie) and f["min"] > held["min"] * (1 + tie)):
                best = w
        out[dispatcher] = best
    return out


def resolved(settings: dict, apart: dict[str, dict[str, dict]],
             powers: dict[float, dict[str, dict]] | None = None,
             sides: dict[float, dict[str, dict]] | None = None,
             cautions: dict[float, dict[str, dict]] | None = None,
             kept: dict[str, dict] | None = None) -> dict:
    """The fit settings with `weighting: auto` resolved per dispatcher from `leave_one_out`'s
    figures (`chosen_weightings`, its `weighting_tie`, default 0.01), `waves: auto` from
    `waves_apart`'s (`powers`, the same rule, 0 the plainer) and `small_side: auto` from
    `small_side_apart`'s (`sides`, the same rule) and `caution: auto` from `caution_apart`'s
    (`cautions`); other settings as they are. `kept`: {setting: {dispatcher: value}}, what the
    tuned file holds now (`nearest.incumbent`), which a tie keeps."""
    tie, kept = float(settings.get("weighting_tie", 0.01)), kept or {}
    if settings.get("weighting") == AUTO:
        settings = {**settings, "weighting": chosen_weightings(apart, tie, kept=kept.get("weighting"))}
    for key, is_auto, figures in (("waves", waves_auto, powers), ("small_side", small_side_auto, sides),
                                  ("caution", caution_auto, cautions)):
        if is_auto(settings) and figures is not None:  # the plainer model is the lowest option
            settings = _numbers_resolved(settings, key, chosen_weightings(
                figures, tie, plain=min(figures), kept=kept.get(key)))
    return settings


def _numbers_resolved(settings: dict, key: str, chosen: dict) -> dict:
    """`settings` with `fit.<key>`'s `auto` (all of it, or a mapping's entries; one not named: 0)
    replaced by `chosen`'s, and `<key>_chosen` naming the dispatchers auto chose for."""
    given = settings[key]
    return {**settings, key: chosen if given == AUTO else
            {d: chosen.get(d, 0.0) if v == AUTO else v for d, v in given.items()},
            f"{key}_chosen": sorted(chosen if given == AUTO else
                                    (d for d, v in given.items() if v == AUTO))}


def choice_at(rules: list[dict], shape: tuple[int, int, int]) -> Candidate | None:
    """The candidate the first rule whose `when` holds names at `shape`, as the runner reads them."""
    rule = next((r for r in rules if holds(r["when"], shape)), None)
    return None if rule is None else Candidate(rule["kernel"], json.dumps(rule["params"], sort_keys=True))


def agreement(rows_a: list[dict], rows_b: list[dict], guards: dict[str, str | None], settings: dict,
              tolerance: float, tree_guards: dict[str, str | None] | None = None,
              regions: dict[str, str] | None = None) -> dict[str, dict]:
    """Whether two tuning runs (their evidence) fit the same dispatch, per dispatching kernel, at
    the training shapes both measured, for the model the fit writes (`fit.model`): the tree's
    rules, or the nearest-neighbour model, which at a training shape runs that run's own best
    measured candidate. A shape `agrees` where both runs choose the same candidate, is
    `within_noise` where they differ but each run measured the other's choice within `tolerance`
    (relative) of its own, and `differs` otherwise (with the shape, both choices and the two
    runs' figures); `unmeasured` where a run has no figure for a choice. The tree's rules use
    `tree_guards` and the reserved `regions` where given, as the fit writes them."""
    nearest, count = uses_nearest(settings), neighbours(settings)
    out = {}
    for dispatcher in sorted({r["dispatcher"] for r in rows_a} & {r["dispatcher"] for r in rows_b}):
        weigh = weighting(settings, dispatcher) if nearest else None
        side = small_side(settings, dispatcher) if nearest else 0.0
        share = caution(settings, dispatcher) if nearest else 0.0
        tabs = [table(rows, dispatcher) for rows in (rows_a, rows_b)]
        if nearest:
            fitters = [Fitter(tab, guards, settings) for tab in tabs]
            model = NearestModel(count, weigh, small_side=side, caution=share,
                                 regions=nearest_regions(settings, dispatcher))
            choosers = [lambda shape, f=f: nearest_choice(f, shape, f.tab.shapes, model)
                        for f in fitters]
        else:
            choosers = [lambda shape, r=rules_for(rows, dispatcher, tree_guards or guards, settings,
                                                  regions): choice_at(r, shape)
                        for rows in (rows_a, rows_b)]
        report = {"agrees": 0, "within_noise": 0, "differs": [], "unmeasured": 0}
        for shape in sorted(set(tabs[0].shapes) & set(tabs[1].shapes)):
            a, b = (choose(shape) for choose in choosers)
            if a == b:
                report["agrees"] += 1
                continue
            figures = [(tab.ratio.get((shape, a)), tab.ratio.get((shape, b))) for tab in tabs]
            if any(v is None for pair in figures for v in pair):
                report["unmeasured"] += 1
            elif (figures[0][1] >= figures[0][0] * (1 - tolerance)
                  and figures[1][0] >= figures[1][1] * (1 - tolerance)):
                report["within_noise"] += 1
            else:
                report["differs"].append({"shape": "x".join(map(str, shape)), "a": a.label(),
                                          "b": b.label(), "run_a": figures[0], "run_b": figures[1]})
        out[dispatcher] = report
    return out


def report(rows: list[dict], kernel_guards: dict[str, str | None],
           tree_guards: dict[str, str | None], regions: dict[str, str], fit_settings: dict,
           drawn: set[tuple[int, int, int]], apart: dict[str, dict[str, dict]],
           auto: bool = False, gpu_spec: str | None = None) -> list[str]:
    """What `sgemm-lab tune` prints after a fit: the tree's and the nearest model's
    cross-validation (the random draws `drawn` alone too), the nearest model left one shape out
    under each weighting (`apart`: `leave_one_out`'s) and the ceiling of the candidates.
    `fit_settings` as the fit used them (`resolved`); `auto`: its weighting was chosen so;
    `gpu_spec`: whose wave fills the nearest model's `waves` scales by (none: no scaling)."""
    lines = []
    for dispatcher, cv in cross_validated(rows, tree_guards, fit_settings, regions=regions).items():
        lines.append(f"{dispatcher}: on training shapes left out of the fit ({cv['folds']} folds), "
                     f"geomean {cv['geomean']:.3f}x, min {cv['min']:.3f}x at {cv['min_shape']} of "
                     f"the stronger cuBLAS; {cv['unmeasured']} of {cv['shapes']} shapes chose a "
                     f"candidate not measured there")
    for dispatcher, cv in nearest_cross_validated(
            rows, kernel_guards, fit_settings, count=neighbours(fit_settings), drawn=drawn,
            gpu_spec=gpu_spec).items():
        lines.append(f"{dispatcher}: the {cv['count']} nearest training shapes' best instead "
                     f"({cv['weighting']} weights" + (f", wave fill to the power {cv['waves']:g}" + (
                         f" (its ratio at most {cv['waves_cap']:g})" if cv["waves_cap"] else "") if cv["waves"] else "")
                     + (f", the smaller of m and n again at {cv['small_side']:g}"
                        if cv["small_side"] else "")
                     + (f", {cv['caution']:g} of each score the worst neighbour's" if cv["caution"] else "")
                     + f", the same folds), geomean {cv['geomean']:.3f}x, "
                     f"min {cv['min']:.3f}x at {cv['min_shape']}; {cv['unmeasured']} of "
                     f"{cv['shapes']} shapes without a choice measured there")
        if "drawn" in cv:  # what the held-out set (random draws, no suite shapes) is comparable to
            d = cv["drawn"]
            lines.append(f"{dispatcher}: the same, at the {d['shapes']} random draws alone (as the "
                         f"held-out set): geomean {d['geomean']:.3f}x, min {d['min']:.3f}x at "
                         f"{d['min_shape']}")
    count = neighbours(fit_settings)
    powers = apart.get("waves") or {}
    sides = apart.get("small_side") or {}
    shares, sided = apart.get("caution") or {}, apart.get("reserved_sides") or {}
    apart = {w: cvs for w, cvs in apart.items() if w not in ("waves", "small_side", "caution", "reserved_sides")}
    for dispatcher in sorted(set.intersection(*(set(cvs) for cvs in apart.values()))):
        figures = [_figures(w, cvs[dispatcher]) for w, cvs in apart.items()]
        lines.append(f"{dispatcher}: leave-one-out, the {count} nearest shapes' best by each "
                     f"weighting (geomean / min): " + ", ".join(figures)
                     + f"; the fit's is {weighting(fit_settings, dispatcher)}"
                     + (" (auto: the better at the random draws, geomean first; a tie keeps the tuned file's)"
                        if auto else ""))
    lines += _option_lines(powers, fit_settings, "waves", waves, "each neighbour's ratio scaled by "
                           "the wave fill here against there to a power")
    lines += _option_lines(sides, fit_settings, "small_side", small_side, "the smaller of m and n "
                           "counted again in the distance at a weight")
    lines += _option_lines(shares, fit_settings, "caution", caution, "each candidate's score taking a "
                           "share from its worst neighbour")
    lines += _option_lines(sided, fit_settings, "reserved_sides", lambda f, d: bool(nearest_regions(f, d)),
                           "the neighbours on the query's side of each reserved region")
    for dispatcher, top in ceiling(rows, drawn=drawn).items():
        lines.append(f"{dispatcher}: the best measured candidate at each training shape (no "
                     f"dispatch over these candidates does better there), geomean "
                     f"{top['geomean']:.3f}x, min {top['min']:.3f}x at {top['min_shape']}; "
                     f"{top['below_parity']} of {top['shapes']} shapes below 1.0x, the lowest: "
                     + ", ".join(f"{s} {v:.2f}x ({k})" for s, v, k in top["lowest"])
                     + (f"; at the {top['drawn']['shapes']} random draws alone, geomean "
                        f"{top['drawn']['geomean']:.3f}x" if "drawn" in top else ""))
    return lines


def _figures(label: str, cv: dict) -> str:
    """'LABEL geomean / min' of one leave-one-out run, the random draws' in parentheses."""
    d = cv.get("drawn")
    return f"{label} {cv['geomean']:.3f}x / {cv['min']:.3f}x" + (
        f" (draws {d['geomean']:.3f}x / {d['min']:.3f}x)" if d else "")


def _option_lines(options: dict, fit_settings: dict, key: str, value_of, what: str) -> list[str]:
    """Per dispatcher, the leave-one-out figures under each value of `fit.<key>` (`options`:
    {value: {dispatcher: figures}}) and the value the fit used (`value_of(settings, dispatcher)`),
    chosen by auto or given."""
    lines = []
    for dispatcher in sorted(set.intersection(*(set(cvs) for cvs in options.values())) if options else ()):
        figures = [_figures(_shown(value), cvs[dispatcher]) for value, cvs in options.items()]
        lines.append(f"{dispatcher}: leave-one-out, {what} (geomean / min): " + ", ".join(figures)
                     + f"; the fit's is {_shown(value_of(fit_settings, dispatcher))} " + (
                         "(auto: the better at the random draws, geomean first; a tie keeps the tuned file's)"
                         if dispatcher in fit_settings.get(f"{key}_chosen", [dispatcher])
                         else f"(given: conf/tuning/dispatch.yaml fit.{key})"))
    return lines


def _shown(value: float | bool) -> str:  # an option as the report prints it
    return ("on" if value else "off") if isinstance(value, bool) else f"{value:g}"
