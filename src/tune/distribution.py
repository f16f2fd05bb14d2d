"""Shape distributions: the shapes the dispatch is tuned on (TRAINING: the hand-written suites plus
seeded random draws) and judged on (HELD-OUT: drawn from the same classes with another seed,
disjoint from training and from the suites), from the data in conf/shapes/distribution.yaml.

    python -m src.tune.distribution            # what each set holds, per class
    python -m src.tune.distribution --write    # conf/suite/training.yaml and heldout.yaml
    python -m src.tune.distribution --check    # exit 1 when those files are not the generator's

Deterministic: each class draws from its own generator, seeded with "<seed>/<class>" (Python's
Mersenne Twister seeded from a string through SHA-512, the same on every machine and run), and
uses only `random()`, whose stream Python keeps stable; a class added later leaves the others'
draws as they were. The written suites run like the hand-written ones
(`python -m src.run -m +suite=heldout kernel=best_tf32`).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from src.errors import ConfigError
from src.paths import CONF_DIR

DISTRIBUTION_FILE = CONF_DIR / "shapes" / "distribution.yaml"
SUITE_DIR = CONF_DIR / "suite"
GENERATED_KEY = "generated_from"   # a suite file holding it is written here, not by hand
SETS = ("training", "heldout")
SUITE_CLASS_PREFIX = "suite:"      # a training shape from a hand-written suite: "suite:llm"
PICKED_CLASS_PREFIX = "picked:"    # one of training.picked's shapes: "picked:decode"
GROWN_CLASS_PREFIX = "grown:"      # one of training.grown's draws, by the class it was drawn from: "grown:odd"


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    cls: str = ""   # the class it was drawn from ("suite:<name>" for a hand-written suite's)
    added: bool = False  # one of `training.added`'s draws: the tuner's stage 3 measures it

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class ShapeClass:
    name: str
    why: str
    weight: float
    m: tuple[int, int]
    n: tuple[int, int] | None = None
    k: tuple[int, int] | None = None
    square: bool = False
    swap_mn: bool = False
    unaligned: bool = False
    multiple: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Distribution:
    classes: tuple[ShapeClass, ...]
    training_seed: int
    training_random: int
    heldout_seed: int
    heldout_count: int
    max_operand_elements: int
    max_flop: int
    source: str = "conf/shapes/distribution.yaml"
    training_added: int = 0
    picked: tuple[Shape, ...] = ()   # training.picked: hand-picked shapes after the draws (stage 3)
    training_grown: int = 0          # training.grown: draws chosen where the training set is sparsest
    grow_pool: int = 2048            # training.grow_pool: the draws they are chosen from
    grown_stage: int = 3             # training.grown_stage: 2 (every stage-2 survivor) or 3 (the rescreen's)


def _bad(rule: str) -> ConfigError:
    return ConfigError(f"{DISTRIBUTION_FILE.relative_to(CONF_DIR.parent)}: {rule}")


def _range(entry: dict, key: str, name: str) -> tuple[int, int] | None:
    value = entry.get(key)
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) for v in value)
            or not 1 <= value[0] <= value[1]):
        raise _bad(f"class {name}: `{key}` must be [low, high], integers with 1 <= low <= high "
                   f"(rule: each dimension is drawn between two positive bounds), got {value!r}.")
    return (value[0], value[1])


def load(path: Path = DISTRIBUTION_FILE) -> Distribution:
    """The distribution file, checked: each class's name, one-line `why`, weight > 0, bounds."""
    data = yaml.safe_load(path.read_text()) or {}
    classes = []
    for entry in data.get("classes") or []:
        name = str(entry.get("name", ""))
        why = str(entry.get("why", "")).strip()
        if not name or not why or "\n" in why:
            raise _bad(f"class {name or '?'} needs a name and a one-line `why` (rule: every "
                       f"class of shapes says what users run it for).")
        weight = entry.get("weight", 1)
        if not isinstance(weight, (int, float)) or weight <= 0:
            raise _bad(f"class {name}: weight must be a positive number, got {weight!r}.")
        square = bool(entry.get("square", False))
        ranges = {key: _range(entry, key, name) for key in ("m", "n", "k")}
        if ranges["m"] is None or (not square and (ranges["n"] is None or ranges["k"] is None)):
            raise _bad(f"class {name} needs m, n and k bounds (or m with `square: true`).")
        multiple = tuple(sorted((str(d), int(v)) for d, v in (entry.get("multiple") or {}).items()))
        classes.append(ShapeClass(name, why, float(weight), ranges["m"], ranges["n"], ranges["k"],
                                  square, bool(entry.get("swap_mn", False)),
                                  bool(entry.get("unaligned", False)), multiple))
    if not classes or len({c.name for c in classes}) != len(classes):
        raise _bad("`classes` must list at least one class, each name once.")
    limits = data.get("limits") or {}
    added = data["training"].get("added", 0)
    if not isinstance(added, int) or added < 0:
        raise _bad(f"training.added must be a whole number of draws, 0 or more, got {added!r} "
                   f"(rule: the added draws extend the training set's random ones).")
    grown, pool = data["training"].get("grown", 0), data["training"].get("grow_pool", 2048)
    stage = data["training"].get("grown_stage", 3)
    if not isinstance(grown, int) or not isinstance(pool, int) or grown < 0 or pool < grown or stage not in (2, 3):
        raise _bad(f"training.grown must be a whole number of draws, 0 or more, training.grow_pool a whole "
                   f"number at least as large and training.grown_stage 2 or 3, got {grown!r}, {pool!r} and "
                   f"{stage!r} (rule: the grown draws are chosen among the pool's, measured in stage 2 or 3).")
    return Distribution(tuple(classes), int(data["training"]["seed"]),
                        int(data["training"]["random"]), int(data["heldout"]["seed"]),
                        int(data["heldout"]["count"]), int(limits["max_operand_elements"]),
                        int(limits["max_flop"]), training_added=added,
                        picked=_picked(data["training"].get("picked") or {}),
                        training_grown=grown, grow_pool=pool, grown_stage=stage)


def _picked(groups: dict) -> tuple[Shape, ...]:
    """training.picked: {group: {why: one line, shapes: ["MxNxK", ...]}}, each shape a Shape of
    class "picked:<group>", flagged `added` (the tuner's stage 3, after the screen and the draws)."""
    from src.job.shapes import parse

    out = []
    for group, entry in groups.items():
        why = str((entry or {}).get("why", "")).strip()
        dims = [parse(str(text)) for text in (entry or {}).get("shapes") or []]
        if not why or "\n" in why or not dims or None in dims:
            raise _bad(f"training.picked.{group} needs a one-line `why` and `shapes`, a list of "
                       f"MxNxK (rule: a shape tuned on by hand says what users run it for).")
        out += [Shape(*d, cls=f"{PICKED_CLASS_PREFIX}{group}", added=True) for d in dims]
    return tuple(out)


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high], log-uniform (each factor of two about equally likely)."""
    value = math.exp(math.log(low) + rng.random() * (math.log(high + 1) - math.log(low)))
    return min(high, max(low, int(value)))


def _round_to_multiple(value: int, multiple: int, high: int) -> int:
    up = -(-value // multiple) * multiple
    return up if up <= high else max(multiple, high // multiple * multiple)


def draw_one(cls: ShapeClass, rng: random.Random) -> Shape:
    m = _log_uniform(rng, *cls.m)
    if cls.square:
        return Shape(m, m, m, cls.name)
    n, k = _log_uniform(rng, *cls.n), _log_uniform(rng, *cls.k)
    bounds = {"m": cls.m, "n": cls.n, "k": cls.k}
    dims = {"m": m, "n": n, "k": k}
    for dim, multiple in cls.multiple:
        dims[dim] = _round_to_multiple(dims[dim], multiple, bounds[dim][1])
    if cls.unaligned and dims["n"] % 4 == 0 and dims["k"] % 4 == 0:
        dim = "n" if rng.random() < 0.5 else "k"
        step = 1 + int(rng.random() * 3)
        dims[dim] = dims[dim] + step if dims[dim] + step <= bounds[dim][1] else dims[dim] - step
    if cls.swap_mn and rng.random() < 0.5:
        dims["m"], dims["n"] = dims["n"], dims["m"]
    return Shape(dims["m"], dims["n"], dims["k"], cls.name)


def within_limits(shape: Shape, dist: Distribution) -> bool:
    m, n, k = shape.dims
    return max(m * k, k * n, m * n) <= dist.max_operand_elements and 2 * m * n * k <= dist.max_flop


def allocate(classes, count: int) -> list[int]:
    """`count` shapes shared among the classes by weight (largest remainder, ties to the earlier)."""
    total = sum(c.weight for c in classes)
    exact = [count * c.weight / total for c in classes]
    counts = [int(e) for e in exact]
    order = sorted(range(len(classes)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:count - sum(counts)]:
        counts[i] += 1
    return counts


def draw(dist: Distribution, count: int, seed: int, exclude: set[tuple[int, int, int]]) -> list[Shape]:
    """`count` distinct shapes from the classes by weight, none in `exclude`, within the limits."""
    found: list[Shape] = []
    taken = set(exclude)
    for cls, wanted in zip(dist.classes, allocate(dist.classes, count)):
        rng = random.Random(f"{seed}/{cls.name}")
        mine = 0
        for _ in range(1000 * max(wanted, 1)):
            if mine == wanted:
                break
            shape = draw_one(cls, rng)
            if shape.dims in taken or not within_limits(shape, dist):
                continue
            taken.add(shape.dims)
            found.append(shape)
            mine += 1
        else:
            raise _bad(f"class {cls.name}: could not draw {wanted} distinct shapes within the "
                       f"limits (rule: a class's bounds must hold enough distinct shapes).")
    return found


def suite_shapes(suite_dir: Path = SUITE_DIR) -> list[Shape]:
    """The hand-written suites' shapes (conf/suite/*.yaml without `generated_from`), once each, in order."""
    from src.job.shapes import parse

    found: dict[tuple[int, int, int], Shape] = {}
    for path in sorted(suite_dir.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if GENERATED_KEY in data:
            continue
        for text in str(data["hydra"]["sweeper"]["params"]["shape"]).split(","):
            dims = parse(text)
            if dims is not None and dims not in found:
                found[dims] = Shape(*dims, cls=SUITE_CLASS_PREFIX + path.stem)
    return list(found.values())


def training(dist: Distribution | None = None, suite_dir: Path = SUITE_DIR) -> list[Shape]:
    """The suites' shapes, `training.random` draws with `training.seed`, none repeated, then
    `training.added` more (flagged `added`: the draws of random + added that the first random ones
    are not), `training.picked`'s and `grown`'s (flagged `added` in stage 3, else before the added).
    Each class extends its own stream: the first draws stay; picked and grown shapes change none."""
    dist = dist or load()
    suite = suite_shapes(suite_dir)
    taken = {s.dims for s in suite}
    first = draw(dist, dist.training_random, dist.training_seed, taken)
    added: list[Shape] = []
    if dist.training_added:
        both = draw(dist, dist.training_random + dist.training_added, dist.training_seed, taken)
        kept = {s.dims for s in first}
        if not kept <= {s.dims for s in both}:
            raise _bad(f"training.added {dist.training_added} redraws some of the first "
                       f"{dist.training_random} shapes (a draw of one class met another's) (rule: "
                       f"added draws extend the training set, the shapes tuned on so far stay); "
                       f"change training.added by a few.")
        added = [Shape(*s.dims, cls=s.cls, added=True) for s in both if s.dims not in kept]
    seen = taken | {s.dims for s in first + added}
    for shape in dist.picked:
        if shape.dims in seen:
            raise _bad(f"training.picked: {shape.label} is already a training shape (rule: a "
                       f"picked shape adds one the suites and the draws do not hold).")
        seen.add(shape.dims)
    more = grown(dist, so_far := suite + first + added + list(dist.picked))  # stage 2's before stage 3's
    return so_far + more if dist.grown_stage == 3 else suite + first + more + added + list(dist.picked)


GROW_SEED = "{seed}/pool"   # the pool's draws: the training seed's, a stream of their own


def grown(dist: Distribution, so_far: list[Shape]) -> list[Shape]:
    """`training.grown` draws (class `grown:<class>`, stage `grown_stage`) where the training set is sparsest for
    `training.grow_pool` draws of the distribution (their own seed): src/tune/coverage.covering."""
    if not dist.training_grown:
        return []
    from src.tune.coverage import covering

    taken = {s.dims for s in so_far}
    pool = draw(dist, dist.grow_pool, GROW_SEED.format(seed=dist.training_seed), taken)
    picks = covering([s.dims for s in pool], sorted(taken), dist.training_grown)
    return [Shape(*pool[i].dims, cls=GROWN_CLASS_PREFIX + pool[i].cls, added=dist.grown_stage == 3)
            for i in picks]


def not_drawn(dist: Distribution | None = None, suite_dir: Path = SUITE_DIR) -> set[tuple[int, int, int]]:
    """The training shapes that are no plain random draw: the suites', training.picked's and
    training.grown's (chosen for sparse regions, they would weigh the leave-one-out towards them)."""
    dist = dist or load()
    return {s.dims for s in training(dist, suite_dir)
            if s.cls.startswith((SUITE_CLASS_PREFIX, PICKED_CLASS_PREFIX, GROWN_CLASS_PREFIX))}


def heldout(dist: Distribution | None = None, suite_dir: Path = SUITE_DIR) -> list[Shape]:
    """`heldout.count` draws with `heldout.seed`, disjoint from training (and so the suites)."""
    dist = dist or load()
    if dist.heldout_seed == dist.training_seed:
        raise _bad("heldout.seed must differ from training.seed (rule: the held-out set is drawn "
                   "independently of the training set).")
    train = training(dist, suite_dir)
    shapes = draw(dist, dist.heldout_count, dist.heldout_seed, {s.dims for s in train})
    overlap = {s.dims for s in shapes} & {s.dims for s in train}
    assert not overlap, f"held-out shapes in the training set: {sorted(overlap)}"
    return shapes


def stratified(shapes: list[Shape], count: int | None) -> list[Shape]:
    """The first `count` shapes round-robin over the classes (in order of first appearance), so a
    small run covers every class; the stage-3 (`added`) and grown shapes after all the others (they
    never move the screen's shapes); all of them when count is None."""
    if count is None or count >= len(shapes):
        return list(shapes)
    late = [s.added or s.cls.startswith(GROWN_CLASS_PREFIX) for s in shapes]
    return (_round_robin([s for s, x in zip(shapes, late) if not x])
            + _round_robin([s for s, x in zip(shapes, late) if x]))[:count]


def _round_robin(shapes: list[Shape]) -> list[Shape]:
    by_class: dict[str, list[Shape]] = {}
    for shape in shapes:
        by_class.setdefault(shape.cls, []).append(shape)
    depth = max(map(len, by_class.values()), default=0)
    return [members[i] for i in range(depth) for members in by_class.values() if i < len(members)]


def suite_file_text(name: str, shapes: list[Shape], dist: Distribution) -> str:
    """A conf/suite/ file for one generated set (alpha 0.5, beta 3 as the hand-written suites)."""
    counts = Counter(shape.cls for shape in shapes)  # in the order each class first appears
    seed = dist.training_seed if name == "training" else dist.heldout_seed
    late, stage_two = (name == "training" and dist.training_grown and dist.grown_stage == s for s in (3, 2))
    what = ("the hand-written suites' shapes plus random draws: the dispatch is tuned on these"
            if name == "training" else
            "random draws never trained on (disjoint from training and the suites): the tuned "
            "dispatch is judged on these")
    header = (f"GENERATED by `python -m src.tune.distribution --write` from {dist.source} (seed "
              f"{seed}); do not edit: change the distribution and write again (a test checks "
              f"this file). Shape set `{name}`: {what}. Why: issue 39, a dispatch learned per GPU "
              f"and judged on shapes it never saw. Shapes per class: "
              + ", ".join(f"{cls} {n}" for cls, n in counts.items()) + "."
              + (f" The last {sum(s.added for s in shapes)} are `training.added`'s draws"
                 + ((", " if late else " and ") + "`training.picked`'s shapes" if dist.picked else "")
                 + (" and `training.grown`'s draws" if late else "")
                 + " (the tuner's stage 3)." if any(s.added for s in shapes) else "")
              + (" `training.grown`'s draws are measured in stage 2." if stage_two else ""))
    lines = [
        "# @package _global_",
        *textwrap.wrap(header, 98, initial_indent="# ", subsequent_indent="# "),
        f"suite: {name}",
        f"{GENERATED_KEY}: {dist.source}",
        "alpha: 0.5",
        "beta: 3.0",
        "hydra:",
        "  sweeper:",
        "    params:",
        "      shape: " + ",".join(s.label for s in shapes),
    ]
    return "\n".join(lines) + "\n"


def generated_files(dist: Distribution | None = None, suite_dir: Path = SUITE_DIR) -> dict[Path, str]:
    dist = dist or load()
    return {suite_dir / "training.yaml": suite_file_text("training", training(dist, suite_dir), dist),
            suite_dir / "heldout.yaml": suite_file_text("heldout", heldout(dist, suite_dir), dist)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write conf/suite/training.yaml and heldout.yaml")
    parser.add_argument("--check", action="store_true", help="exit 1 if those files differ from the generator's")
    args = parser.parse_args(argv)
    try:
        files = generated_files()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stale = [path for path, text in files.items()
             if not path.is_file() or path.read_text() != text]
    if args.write:
        for path, text in files.items():
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    if args.check:
        for path in stale:
            print(f"{path} is not what the generator writes: python -m src.tune.distribution --write",
                  file=sys.stderr)
        return 1 if stale else 0
    for name, shapes in (("training", training()), ("heldout", heldout())):
        counts = Counter(shape.cls for shape in shapes)
        print(f"{name}: {len(shapes)} shapes: " + ", ".join(f"{c} {n}" for c, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
