"""The nearest-neighbour model's settings (`fit:` of conf/tuning/dispatch.yaml) and the tuned
file's `nearest:` section written from them (src/job/dispatch.py reads it at run time): whether
the fit writes the model, how many neighbours it counts, how it weighs them, how far it scales
each neighbour's ratio by the candidate's wave fill there (and how much of that ratio counts at
most), how far its distance counts the
smaller of m and n again, how much of a candidate's score its worst neighbour takes, and which
regions' sides it keeps apart; what a tuned file holds now (`incumbent`). src/tune/fit.py writes
the section; src/tune/judge.py resolves `auto` from the evidence."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from src.errors import ConfigError
from src.job import training
from src.job.training import CAUTION_RULE, SMALL_SIDE_RULE, WAVES_CAP_RULE, WAVES_RULE


AUTO = "auto"  # a fit setting chosen per dispatcher from its leave-one-out figures (src/tune/judge.py)
_MISSING = object()


def fill_of(rows: list[dict], dispatcher: str, whole: training.Table, gpu_spec: str | None,
            power: float):
    """The wave fill the judge's nearest model scales by: `fill_table` of `whole`'s candidates at
    its shapes (training.table of `dispatcher`'s `rows`, in the precision they name) on
    `gpu_spec`, or None where no power is asked or no GPU named."""
    if not power or gpu_spec is None:
        return None
    precision = next(str(r["precision"]) for r in rows if r["dispatcher"] == dispatcher)
    return fill_table(gpu_spec, precision, tuple(whole.candidates), tuple(whole.shapes))


def fill_table(gpu_spec: str, precision: str, candidates: tuple, shapes: tuple):
    """fill(candidate, shape) as src/job/dispatch.wave_fills gives it, every pair of `candidates`
    and `shapes` built once on every core (src/tune/forked.py) and looked up after: the fit's
    leave-one-outs weigh each candidate at thousands of (query, neighbour) pairs, a spec build
    each otherwise (the H200's evidence: about 160,000 builds). A pair outside the
    table is built when asked. None for a spec without a datasheet (no scaling)."""
    from src.job import dispatch

    return _fill_table(dispatch.wave_fills, gpu_spec, precision, candidates, shapes)


@lru_cache(maxsize=8)  # the fit weighs the same table under every option it tries
def _fill_table(wave_fills, gpu_spec: str, precision: str, candidates: tuple, shapes: tuple):
    from src.tune import forked

    fill = wave_fills(gpu_spec, precision)
    if fill is None:
        return None
    built = forked.mapped(lambda c: [fill(c, s) for s in shapes], candidates, chunks="stripes",
                          cost=len(candidates) * len(shapes))
    known = {(c, s): f for c, row in zip(candidates, built) for s, f in zip(shapes, row)}

    def looked_up(candidate: training.Candidate, shape: tuple) -> float | None:
        got = known.get((candidate, tuple(shape)), _MISSING)
        return fill(candidate, shape) if got is _MISSING else got

    return looked_up


def uses_nearest(settings: dict) -> bool:
    """Whether the fit writes the nearest-neighbour model (`fit.model: nearest`) before the tree."""
    return str(settings.get("model", "tree")) == "nearest"


def regions(settings: dict, dispatcher: str | None = None) -> tuple[str, ...]:
    """The shape regions whose sides the nearest model keeps apart for `dispatcher` (`regions`:
    one list for every dispatcher or a mapping from dispatcher to list, which refit.resolved_fit
    sets from conf/tuning/dispatch.yaml's `reserved` where `fit.reserved_sides` holds or auto chose
    it); () for none."""
    value = settings.get("regions") or ()
    if isinstance(value, dict):
        value = value.get(dispatcher) or ()
    return tuple(str(r) for r in value)


def reserved_sides(settings: dict) -> bool | dict | str:
    """`fit.reserved_sides`: true or false for every dispatcher, a mapping from dispatcher to
    either, or `auto` (per dispatcher, the better left one shape out at a time: judge.resolved);
    anything else is a ConfigError naming the rule."""
    value = settings.get("reserved_sides", False)
    mapping = value if isinstance(value, dict) else {"": value}
    if value != AUTO and not all(isinstance(v, bool) for v in mapping.values()):
        raise ConfigError(f"conf/tuning/dispatch.yaml: fit.reserved_sides {value!r} is not true, "
                          f"false, auto or a mapping from dispatcher to true or false (rule: the "
                          f"nearest model keeps each reserved region's sides apart where it holds).")
    return value


def neighbours(settings: dict) -> int:
    """The training shapes the nearest-neighbour model counts (`fit.neighbours`, default 4)."""
    return int(settings.get("neighbours", 4))


def weighting(settings: dict, dispatcher: str | None = None) -> str:
    """How the nearest-neighbour model weighs `dispatcher`'s neighbours (`fit.weighting`, default
    `equal`; src/job/training.WEIGHTINGS): one name for every dispatcher, or a mapping from
    dispatcher to name (what `auto` resolves to: src/tune/judge.chosen_weightings); an unknown
    name, or `auto` left unresolved, is a ConfigError naming the rule."""
    where = "conf/tuning/dispatch.yaml: fit.weighting"
    value = settings.get("weighting", "equal")
    if isinstance(value, dict):
        where, value = f"{where}.{dispatcher}", value.get(dispatcher, "equal")
    name = str(value)
    if name == AUTO:
        raise ConfigError(f"{where}: `auto` is resolved per dispatcher from the evidence before "
                          f"the fit uses it (rule: src/tune/judge.chosen_weightings runs first).")
    training.weighting_of(name, where)
    return name


def _number(settings: dict, key: str, dispatcher: str | None, rule: str,
            most: float = float("inf")) -> float:
    """`fit.<key>`: one number >= 0 for every dispatcher, or a mapping from dispatcher to number
    (what `auto` resolves to: src/tune/judge.resolved; a dispatcher not named: 0); anything else,
    or `auto` left unresolved, is a ConfigError naming `rule`."""
    where = f"conf/tuning/dispatch.yaml: fit.{key}"
    value = settings.get(key, 0)
    if isinstance(value, dict):
        where, value = f"{where}.{dispatcher}", value.get(dispatcher, 0)
    if value == AUTO:
        raise ConfigError(f"{where}: `auto` is resolved per dispatcher from the evidence before "
                          f"the fit uses it (rule: src/tune/judge.resolved runs first).")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
        bound = "" if most == float("inf") else f" and <= {most:g}"
        raise ConfigError(f"{where}: {value!r} is not a number >= 0{bound} or auto (rule: {rule}).")
    return float(value)


def _auto(settings: dict, key: str) -> bool:
    value = settings.get(key, 0)
    return value == AUTO or isinstance(value, dict) and AUTO in value.values()


def _options(settings: dict, key: str, rule: str, most: float = float("inf")) -> list[float]:
    options = settings.get(f"{key}_options", [0])
    if not isinstance(options, list) or not options or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= most for v in options):
        bound = "" if most == float("inf") else f" and <= {most:g}"
        raise ConfigError(f"conf/tuning/dispatch.yaml: fit.{key}_options {options!r} is not a list "
                          f"of numbers >= 0{bound} (rule: {rule}).")
    return [float(v) for v in options]


def waves(settings: dict, dispatcher: str | None = None) -> float:
    """The power of the wave-fill ratio the nearest model scales each neighbour's ratio by
    (`fit.waves`, default 0: none; src/job/training.nearest_ranked): one number for every
    dispatcher, or a mapping from dispatcher to number (what `auto` resolves to:
    src/tune/judge.resolved); anything else, or `auto` left unresolved, is a ConfigError naming
    the rule."""
    return _number(settings, "waves", dispatcher, WAVES_RULE)


def waves_cap(settings: dict, dispatcher: str | None = None) -> float:
    """The most the wave-fill ratio counts before its power (`fit.waves_cap`, default 0: no cap;
    src/job/training._corrected): one number, 0 or at least 1, for every dispatcher or a mapping,
    as `waves`; anything else is a ConfigError naming the rule."""
    return training.waves_cap_checked(_number(settings, "waves_cap", dispatcher, WAVES_CAP_RULE),
                                      "conf/tuning/dispatch.yaml: fit.waves_cap")


def waves_auto(settings: dict) -> bool:
    """Whether `fit.waves` leaves any dispatcher's power to `auto` (all of them, or those a
    mapping names `auto`): then src/tune/judge.resolved chooses it from the evidence."""
    return _auto(settings, "waves")


def waves_options(settings: dict) -> list[float]:
    """What `fit.waves: auto` chooses among (`fit.waves_options`, default [0])."""
    return _options(settings, "waves", "the powers `fit.waves: auto` chooses among")


def small_side(settings: dict, dispatcher: str | None = None) -> float:
    """The weight the nearest model's log2 distance gives the smaller of m and n again
    (`fit.small_side`, default 0: the plain distance; src/job/training.distance): one number for
    every dispatcher or a mapping, as `waves`."""
    return _number(settings, "small_side", dispatcher, SMALL_SIDE_RULE)


def small_side_auto(settings: dict) -> bool:
    """Whether `fit.small_side` leaves any dispatcher's weight to `auto`."""
    return _auto(settings, "small_side")


def small_side_options(settings: dict) -> list[float]:
    """What `fit.small_side: auto` chooses among (`fit.small_side_options`, default [0])."""
    return _options(settings, "small_side", "the weights `fit.small_side: auto` chooses among")


def caution(settings: dict, dispatcher: str | None = None) -> float:
    """The share of a candidate's score its worst neighbour takes (`fit.caution`, default 0: the
    weighted mean alone; src/job/training.nearest_ranked), between 0 and 1: one number for every
    dispatcher or a mapping, as `waves`."""
    return _number(settings, "caution", dispatcher, CAUTION_RULE, most=1.0)


def caution_auto(settings: dict) -> bool:
    """Whether `fit.caution` leaves any dispatcher's share to `auto`."""
    return _auto(settings, "caution")


def caution_options(settings: dict) -> list[float]:
    """What `fit.caution: auto` chooses among (`fit.caution_options`, default [0])."""
    return _options(settings, "caution", "the shares `fit.caution: auto` chooses among", most=1.0)


def nearest_model(evidence: str, guards: dict[str, str | None], settings: dict,
                  evidence_sha256: str | None = None) -> dict | None:
    """The tuned file's `nearest:` section (src/job/dispatch.py) where `fit.model` is `nearest`:
    the evidence file (and the sha256 of the bytes fitted, which the dispatch checks), the
    neighbours counted and how they are weighed, and each candidate kernel's guard (its size rules
    and where it was measured); None for the tree alone."""
    if not uses_nearest(settings):
        return None

    def written(key, reader):  # one value, or one per dispatcher (what `auto` resolved to)
        value = settings.get(key)
        return {d: reader(settings, d) for d in value} if isinstance(value, dict) else reader(settings)

    return {"evidence": evidence, **({"evidence_sha256": evidence_sha256} if evidence_sha256 else {}),
            "count": neighbours(settings), "weighting": written("weighting", weighting),
            "waves": written("waves", waves),
            **({"waves_cap": written("waves_cap", waves_cap)} if settings.get("waves_cap") else {}),
            "small_side": written("small_side", small_side),
            "caution": written("caution", caution),
            **_regions_written(settings),
            "guards": {k: v for k, v in sorted(guards.items()) if v}}


def _regions_written(settings: dict) -> dict:
    """The `regions` entry of the tuned file's section: one list for every dispatcher, or a
    mapping naming the dispatchers that keep the sides apart; none where no dispatcher does."""
    value = settings.get("regions") or ()
    if isinstance(value, dict):
        kept = {d: list(whens) for d in sorted(value) if (whens := regions(settings, d))}
        return {"regions": kept} if kept else {}
    return {"regions": list(regions(settings))} if regions(settings) else {}


def incumbent(tuned_path: Path) -> dict[str, dict]:
    """{setting: {dispatcher: value}}: the nearest model's weighting, waves, small_side, caution
    and reserved_sides (whether it names regions) the tuned file at `tuned_path` holds now, read
    as the fit's settings are (its `nearest:` has their shape; {} where there is no file or no
    section), for judge.resolved's ties."""
    data = (yaml.safe_load(tuned_path.read_text()) or {}) if tuned_path.is_file() else {}
    model, dispatchers = data.get("nearest"), sorted(data.get("dispatch") or {})
    if not model:
        return {}
    return {key: {d: reader(model, d) for d in dispatchers}
            for key, reader in (("weighting", weighting), ("waves", waves),
                                ("small_side", small_side), ("caution", caution),
                                ("reserved_sides", lambda m, d: bool(regions(m, d))))}
