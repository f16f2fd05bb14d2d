"""The tuner's evidence as a job reads it (the run-time autotune, src/job/autotune.py, and the
nearest-neighbour dispatch, src/job/dispatch.py): where a GPU's evidence file is
(results/tuning/<gpu>.csv, written by `sgemm-lab tune`), its rows, one dispatcher's table of
ratios, the training shapes nearest to a shape in log2(m, n, k), and the candidate those
neighbours favour. Here, below src/tune/, so that a job may read them; src/tune/ (which writes the
file, fits and judges) uses these same ones.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from src.errors import ConfigError
from src.paths import ROOT

EVIDENCE_DIR = ROOT / "results" / "tuning"


def evidence_path(gpu_spec: str) -> Path:
    return EVIDENCE_DIR / f"{gpu_spec}.csv"


def evidence_sha256(path: Path) -> str:
    """The sha256 of an evidence file's bytes: the tuned file's `nearest:` names the one it was
    fitted from, so that a dispatch never weighs neighbours the fit did not see."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# A `same_as` row (a candidate that builds the same kernel and launch as a measured one at that
# shape) has its source row's figures. The file holds only measured rows; each lists the
# candidates that build its launch in `same_launch`, a JSON list of the params each changes
# (`{"fit": 2}`; `{"=": {...}}` where the keys differ), written by src/tune/evidence.write.
# `read` gives every one its row back, with these cells copied from its source.
SAME_AS_COPIES = ("status", "gflops", "ratio_best", "ratio_best_ci_low", "ratio_best_ci_high",
                  "best_cublas", "ratio", "baseline", "from_cache", "timestamp", "error", "stage",
                  "source_sha256", "carried_from")


def row_order(r: dict) -> tuple:
    """The order of an evidence file's rows (and of `read`'s): by dispatcher, shape, kernel, params."""
    return (r["dispatcher"], int(r["m"]), int(r["n"]), int(r["k"]), r["kernel"], r["params"])


def twin_change(source: str, twin: str) -> dict:
    """What a same_launch entry holds: the params `twin` changes from `source` (both JSON)."""
    a, b = json.loads(source), json.loads(twin)
    if set(a) != set(b):
        return {"=": b}
    return {key: value for key, value in b.items() if a[key] != value}


def twin_params(source: str, change: dict) -> str:
    """The inverse of twin_change: the twin's params, as the file's params are written."""
    params = change["="] if set(change) == {"="} else {**json.loads(source), **change}
    return json.dumps(params, sort_keys=True)


def read(path: Path) -> list[dict]:
    """The rows of an evidence file, numbers as numbers (empty cells None), each same_as row
    with its source row's figures, in `row_order`."""
    def number(text, kind):
        return None if text in ("", None) else kind(text)

    rows = []
    twin_lists = {}  # (params, same_launch) -> the twins' params: the same pair recurs at every shape
    with path.open(newline="") as handle:
        for r in csv.DictReader(handle):
            for c in ("m", "n", "k", "aligned", "from_cache"):
                r[c] = number(r[c], int)
            r["stage"] = number(r.get("stage"), int)  # None in a file from before the two stages
            for c in ("gflops", "ratio_best", "ratio_best_ci_low", "ratio_best_ci_high", "ratio"):
                r[c] = number(r[c], float)
            for c in ("same_as", "error", "best_cublas", "baseline", "timestamp", "source_sha256",
                      "carried_from"):
                r[c] = r.get(c) or None  # source_sha256, carried_from: None in a file from before them
            twins = r.pop("same_launch", None)
            rows.append(r)
            if not twins:
                continue
            key = (r["params"], twins)
            if key not in twin_lists:
                twin_lists[key] = [twin_params(r["params"], c) for c in json.loads(twins)]
            rows.extend({**r, "params": params, "same_as": r["params"]} for params in twin_lists[key])
    rows = _sources_filled(rows, path)
    return sorted(rows, key=row_order)


def _sources_filled(rows: list[dict], path: Path) -> list[dict]:
    """A file written before `same_launch` holds a row for each same_as candidate, its figures
    left empty (an empty status): each takes its source's, the row of the same dispatcher, shape
    and kernel whose params it names. A file older still (figures in each row) reads as it is."""
    def key(r, params):
        return (r["dispatcher"], r["shape"], r["kernel"], params)

    sources = {key(r, r["params"]): r for r in rows if not r.get("same_as")}
    for r in rows:
        if r.get("same_as") and not r.get("status"):
            source = sources.get(key(r, r["same_as"]))
            if source is None:
                raise ConfigError(
                    f"{path}: the row of {r['kernel']} {r['params']} at {r['shape']} "
                    f"({r['dispatcher']}) is the same kernel as {r['same_as']}, which has no row "
                    f"of its own there (rule: a same_as row's figures are its source row's, "
                    f"written once); the file is damaged: restore it from git or run the tune "
                    f"again.")
            r.update({c: source[c] for c in SAME_AS_COPIES})
    return rows


def score(row: dict) -> float | None:
    """A row's ratio: to the stronger cuBLAS where it was measured, else to cuBLAS's default
    (None where neither is a positive number)."""
    value = row.get("ratio_best")
    if value is None:
        value = row.get("ratio")
    return None if value is None or value <= 0 else float(value)


def distance(a: tuple[int, int, int], b: tuple[int, int, int], small_side: float = 0.0) -> float:
    """Euclidean distance of log2 dimensions: 2x in one side is 1. With `small_side` > 0 the log2
    difference of the smaller of m and n counts again, its square weighted so: below a tile that
    side decides which kernels fit (a matrix-vector kernel, a swapped or a tensor-core tile), so
    3 against 13 columns is a farther shape than 600 against 2,600 rows."""
    squares = sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b))
    if small_side:
        squares += small_side * (math.log2(min(a[0], a[1])) - math.log2(min(b[0], b[1]))) ** 2
    return math.sqrt(squares)


def nearest(rows, dispatcher: str, shape, count: int = 3, small_side: float = 0.0,
            shapes=None) -> list[tuple]:
    """The `count` measured training shapes nearest to `shape` (`distance` under `small_side`;
    ties by the shape); `shapes`: the dispatcher's `table(...).shapes`, where the caller has it."""
    if shapes is None:
        shapes = {(r["m"], r["n"], r["k"]) for r in rows if r["dispatcher"] == dispatcher}
    return sorted(shapes, key=lambda s: (distance(s, shape, small_side), s))[:count]


@dataclass(frozen=True)
class Candidate:
    kernel: str
    params: str   # JSON, sorted keys

    def label(self) -> str:
        return f"{self.kernel} {self.params}"


@dataclass
class Table:
    """What one dispatching kernel's evidence holds: ratio[(shape, candidate)] for ok runs."""

    shapes: list[tuple[int, int, int]]
    candidates: list[Candidate]
    ratio: dict = field(default_factory=dict)
    failed: set = field(default_factory=set)
    _by_candidate: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def of(self, candidate: Candidate) -> dict:
        """{shape: ratio} of `candidate`'s ok runs (`ratio` regrouped once, on the first call):
        the nearest model reads a candidate at a few shapes, thousands of candidates a query."""
        if not self._by_candidate:
            for (shape, c), value in self.ratio.items():
                self._by_candidate.setdefault(c, {})[shape] = value
        return self._by_candidate.get(candidate, {})


def table(rows: list[dict], dispatcher: str) -> Table:
    """One dispatcher's table. Two-stage evidence (a row's `stage`): where stage 2 measured any
    candidate, only those candidates are in it (one the screen dropped ran at the screening
    shapes alone)."""
    mine = [r for r in rows if r["dispatcher"] == dispatcher]
    shapes = sorted({(int(r["m"]), int(r["n"]), int(r["k"])) for r in mine})
    survivors = {(r["kernel"], r["params"]) for r in mine if r.get("stage") == 2}
    if survivors:  # two stages: a candidate the screen dropped is not a choice
        mine = [r for r in mine if (r["kernel"], r["params"]) in survivors]
    # one Candidate object per candidate, the keys' too: a lookup then matches by identity, not
    # by the dataclass's __eq__ (the fit and the nearest model make hundreds of millions)
    one = {key: Candidate(*key) for key in sorted({(r["kernel"], r["params"]) for r in mine})}
    out = Table(shapes, list(one.values()))
    for r in mine:
        key = ((int(r["m"]), int(r["n"]), int(r["k"])), one[(r["kernel"], r["params"])])
        value = score(r) if r["status"] == "ok" else None
        if value is None:
            out.failed.add(key)
        else:
            out.ratio[key] = value
    return out


WEIGHTINGS = {  # how much each of the nearest training shapes counts: a function of its log2 distance
    "equal": lambda d: 1.0,
    "inverse_distance": lambda d: 1.0 / d,  # d > 0: a shape at distance 0 is its own only neighbour
}


def weighting_of(name: str, where: str) -> Callable[[float], float]:
    """The weight function `name` (a key of WEIGHTINGS); anything else is a ConfigError naming
    the rule and `where` it was read."""
    if name not in WEIGHTINGS:
        raise ConfigError(f"{where}: weighting {name!r} is not one of {', '.join(WEIGHTINGS)} (rule: "
                          f"the nearest-neighbour model weighs its neighbours' log ratios equally "
                          f"or by the inverse of their log2 distance).")
    return WEIGHTINGS[name]


def aligned(shape: tuple[int, int, int]) -> bool:
    """Whether B's and A's rows are 16-byte aligned (n and k multiples of 4 floats): where they
    are not, the library's kernels pad or stream them (`unaligned_rows`)."""
    return shape[1] % 4 == 0 and shape[2] % 4 == 0


def _mean_log(values: list, weights: list[float]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(w * math.log(v) for w, v in zip(weights, values)) / sum(weights)


def _cautious_log(values: list, weights: list[float], caution: float) -> float | None:
    """The weighted mean of log ratios with the share `caution` of it taken by the lowest log
    ratio instead: (1 - caution) * mean + caution * min. A candidate far ahead at three neighbours
    and behind at the fourth is a gamble at a shape between them; one level at all four is not."""
    mean = _mean_log(values, weights)
    if mean is None or not caution or len(values) < 2:
        return mean
    return (1.0 - caution) * mean + caution * min(math.log(v) for v in values)


class WaveFill(float):
    """A launch's wave fill (`wave_fill`) that also says whether the launch splits its tail into a
    second launch (`split_tail`); a plain float is a fill of one launch."""

    def __new__(cls, share: float, split_tail: bool = False):
        fill = super().__new__(cls, share)
        fill.split_tail = split_tail
        return fill


def wave_fill(ctas: int, resident_ctas: int, sms: int, tail_ctas: int = 0, tail_slices: int = 1,
              slots: int | None = None, tail_slots: int | None = None) -> WaveFill:
    """The share of the rounds of waves a launch of `ctas` blocks keeps busy on `sms` SMs that hold
    `resident_ctas` each: 1.0 when the last round is full, 0.51 for one block past a round. With
    a split tail (`tail_ctas` blocks after it, `tail_slices` a tile), a tail block's round counts
    1 / tail_slices of a whole tile's: the tiles' work over the rounds both launches take.
    `slots` / `tail_slots`: the blocks a round holds where fewer than the SMs' (clusters:
    src/job/gpu.cluster_blocks)."""
    slots = slots or sms * max(1, resident_ctas)
    tail_slots = tail_slots or sms * max(1, resident_ctas)
    rounds = -(-ctas // slots) + (-(-tail_ctas // tail_slots)) / tail_slices
    return WaveFill((ctas + tail_ctas / tail_slices) / (rounds * slots), tail_ctas > 0)


def _splits_tail(fill: float) -> bool:
    return bool(getattr(fill, "split_tail", False))


def _corrected(values: list, fills: list, here: float | None, waves: float, cap: float = 0.0) -> list:
    """Each neighbour's ratio scaled by (the candidate's wave fill here / there) ** `waves`: a
    neighbour whose last round was part-empty undersells a shape where the same tile fills it.
    With `cap` > 0 the fill ratio counts at most `cap`: a neighbour whose launch kept a fraction of
    one round busy ran at its tiles' latency, not at a rate the fill scales (H200, cap 2: leave one
    out at the 120 draws, TF32 1.272 -> 1.276 with 5 draws better and none worse, yet the held-out
    set measured 11335x212x516 0.924 -> 0.627, so the fit's is 0; docs/heldout.md).
    Only between launches that both split their tail or both do not: across them a neighbour's
    ratio is kept as measured, since the tail's own launch and its slices' add-up cost what the
    fill does not count (H200, leave-one-out at the 120 draws with the split tail measured: TF32
    1.254 -> 1.262; docs/tuning.md)."""
    if not waves or here is None or any(f is None for f in fills) or any(v is None for v in values):
        return values
    return [v * (min(cap, here / f) if cap else here / f) ** waves
            if _splits_tail(f) == _splits_tail(here) else v for v, f in zip(values, fills)]


# what each number of the nearest model means, for the errors of the fit's settings
# (src/tune/nearest.py) and of a tuned file's `nearest:` (src/job/dispatch.py)
WAVES_RULE = ("the power of the wave-fill ratio, here against there, each neighbour's ratio is "
              "scaled by; 0: none")
WAVES_CAP_RULE = ("the most the wave-fill ratio, here against there, counts before its power; 0: "
                  "no cap, else 1 or more")


def waves_cap_checked(cap: float, where: str) -> float:
    """`cap` where it is 0 or at least 1 (WAVES_CAP_RULE), for the fit's settings and the tuned
    file alike; else a ConfigError naming the rule at `where`."""
    if 0 < cap < 1:
        raise ConfigError(f"{where} {cap:g} is below 1 (rule: {WAVES_CAP_RULE}).")
    return cap
SMALL_SIDE_RULE = ("the weight the log2 distance gives the smaller of m and n again, squared; 0: "
                   "the plain distance")
REGIONS_RULE = ("a list of shape regions (`when` expressions over m, n and k, the reserved regions "
                "of conf/tuning/dispatch.yaml), or a mapping from dispatcher to such a list: a "
                "neighbour counts only on the query's side of each")
CAUTION_RULE = ("the share of each candidate's score its worst neighbour's log ratio takes, the "
                "rest its weighted mean; 0: the mean alone")


@dataclass(frozen=True)
class NearestModel:
    """How the nearest-neighbour model weighs a shape's neighbours: one dispatcher's settings, as a
    tuned file's `nearest:` names them (src/job/dispatch.py) or the tuner judges them
    (src/tune/judge.py)."""
    count: int = 4                # the training shapes counted
    weighting: str = "equal"      # how they are weighed: a key of WEIGHTINGS
    fill: Callable[[Candidate, tuple], float | None] | None = None  # a candidate's wave_fill at a shape
    waves: float = 0.0            # the power of the fill ratio, here / there, each neighbour's ratio is scaled by
    small_side: float = 0.0       # the weight `distance` gives the smaller of m and n again
    caution: float = 0.0          # the share of a candidate's score its worst neighbour's log ratio takes
    regions: tuple[str, ...] = ()  # shape regions (`when`s): a neighbour counts only on the query's side of each
    waves_cap: float = 0.0        # the most the fill ratio counts (0: no cap)

    def side(self, shape: tuple[int, int, int]) -> tuple[bool, ...]:
        """Which of `regions` hold at `shape`."""
        from src.job.expression import evaluate

        names = {"m": shape[0], "n": shape[1], "k": shape[2]}
        return tuple(bool(evaluate(when, names)) for when in self.regions)


def nearest_ranked(tab: Table, shape: tuple[int, int, int], among: list,
                   runs: Callable[[Candidate, tuple], bool],
                   model: NearestModel = NearestModel()) -> tuple[list[tuple[Candidate, float]], list]:
    """([(candidate, its weighted geomean ratio there)], the neighbours): every candidate
    measured at all of the `model.count` shapes of `among` nearest to `shape` (log2 distance, ties
    by the shape) for which `runs(candidate, shape)` holds (its size rules and where it was
    measured), best weighted mean of log ratios first (`model.weighting`, a key of WEIGHTINGS). A
    shape of `among` itself is its own only neighbour: what was measured there is the evidence (the
    suites' shapes are training shapes). With `model.fill` (a candidate's `wave_fill` at a shape)
    and `model.waves` > 0, each neighbour's ratio is first scaled by the fill here against there to
    that power (`_corrected`, the ratio at most `model.waves_cap` where that is > 0): the
    neighbours' tile counts fill their waves otherwise than the query's. `model.small_side`: the weight `distance` gives the smaller of m and n again;
    `model.caution`: the share of each candidate's score its worst neighbour takes (`_cautious_log`);
    `model.regions`: the neighbours are the shapes on the query's side of each region (a reserved
    region measures its owner alone, so a neighbour inside it has no figure for the kernels that
    run outside: H200, leave one out at the random draws, TF32 min 0.41 -> 0.72, FP32 0.65 ->
    0.88; docs/tuning.md).

    Ties (candidates that build one launch at every neighbour, e.g. `unaligned_rows` 1 and 2
    where the rows are aligned) go to the better at the `count` nearest shapes of the query's
    alignment (`aligned`), where such a parameter changes the launch (H200, cross-validated at the
    96 random draws: FP32 min 0.60 -> 0.80, TF32 0.62 -> 0.73; docs/tuning.md); then to the
    candidates' order."""
    count = model.count

    def far(s: tuple[int, int, int]) -> float:
        return distance(s, shape, model.small_side)

    if model.regions and shape not in among:
        here = model.side(shape)
        among = [s for s in among if model.side(s) == here]
    near = [shape] if shape in among else sorted(among, key=lambda s: (far(s), s))[:count]
    weigh = weighting_of(model.weighting, "nearest_choice")
    weights = [1.0] if near == [shape] else [weigh(far(s)) for s in near]
    alike = [] if near == [shape] else sorted(
        (s for s in among if aligned(s) == aligned(shape)), key=lambda s: (far(s), s))[:count]
    scored = []
    for order, c in enumerate(tab.candidates):
        if not near or not runs(c, shape):
            continue
        got = tab.of(c)
        values = _weighed([got.get(s) for s in near], c, shape, near, model)
        there = _cautious_log(values, weights, model.caution)
        if there is None:
            continue
        alike_there = _mean_log([got.get(s) for s in alike], [1.0] * len(alike))
        scored.append((-there, math.inf if alike_there is None else -alike_there, order, c))
    return [(c, math.exp(-total)) for total, _, _, c in sorted(scored)], near


def _weighed(values: list, c: Candidate, shape: tuple, near: list, model: NearestModel) -> list:
    if model.waves and model.fill is not None and near != [shape] and None not in values:
        return _corrected(values, [model.fill(c, s) for s in near], model.fill(c, shape),
                          model.waves, model.waves_cap)
    return values


def weighed(tab: Table, candidate: Candidate, shape: tuple[int, int, int], near: list,
            model: NearestModel) -> list[tuple[float | None, float | None]]:
    """(its measured ratio, that ratio as nearest_ranked weighs it: scaled by the wave fill here
    against there where `model.waves`) at each of `near`, for `candidate` at `shape`."""
    measured = [tab.of(candidate).get(s) for s in near]
    return list(zip(measured, _weighed(measured, candidate, shape, near, model)))


def nearest_choice(tab: Table, shape: tuple[int, int, int], among: list,
                   runs: Callable[[Candidate, tuple], bool],
                   model: NearestModel = NearestModel()) -> tuple[Candidate, list, float] | None:
    """(candidate, its neighbours, its weighted geomean ratio there): the first of
    `nearest_ranked`, the candidate the nearest-neighbour model chooses; None if no candidate
    is measured at all the neighbours and runs at the shape."""
    ranked, near = nearest_ranked(tab, shape, among, runs, model)
    return (ranked[0][0], near, ranked[0][1]) if ranked else None
