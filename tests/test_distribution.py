"""Shape distributions (conf/shapes/distribution.yaml, src/tune/distribution.py): the training
and held-out sets are deterministic, disjoint, drawn from the classes' bounds, and written as
suites that run like the hand-written ones."""

from __future__ import annotations

import dataclasses
import re

import pytest

from src.errors import ConfigError
from src.publish.suite import suites
from src.tune import distribution as dist_mod
from tests.conftest import CONF_DIR


@pytest.fixture(scope="module")
def dist():
    return dist_mod.load()


@pytest.fixture(scope="module")
def sets(dist):
    return dist_mod.training(dist), dist_mod.heldout(dist)


def test_same_seed_same_shapes_other_seed_other_shapes(dist, sets):
    train, held = sets
    assert dist_mod.training(dist) == train and dist_mod.heldout(dist) == held
    other = dataclasses.replace(dist, heldout_seed=dist.heldout_seed + 100)
    assert dist_mod.heldout(other) != held
    assert len(dist_mod.heldout(other)) == len(held)


def test_heldout_is_disjoint_from_training_and_the_suites(dist, sets):
    train, held = sets
    suite = {tuple(map(int, s.split("x"))) for s in suites()}
    assert len(held) >= 64 and len(held) == dist.heldout_count
    assert len({s.dims for s in held}) == len(held)          # no shape twice
    assert not {s.dims for s in held} & {s.dims for s in train}
    assert not {s.dims for s in held} & suite
    # training: every suite shape, then the random draws, none repeated
    assert {s.dims for s in train if s.cls.startswith("suite:")} == suite
    assert len(train) == (len(suite) + dist.training_random + dist.training_added + len(dist.picked)
                          + dist.training_grown) == len({s.dims for s in train})


def test_added_draws_extend_the_training_set_and_leave_the_first_draws_and_heldout_alone(dist, sets):
    """training.added: the shapes tuned on so far stay, in order; the added ones come last, flagged
    for the tuner's stage 3, from the same classes; the held-out set does not move."""
    _, held = sets
    dist = dataclasses.replace(dist, training_added=48, picked=(), training_grown=0)  # the picked and grown come after
    train = dist_mod.training(dist)
    without = dist_mod.training(dataclasses.replace(dist, training_added=0))
    assert train[:len(without)] == without and not any(s.added for s in without)
    added = train[len(without):]
    assert len(added) == dist.training_added and all(s.added for s in added)
    assert not {s.dims for s in added} & {s.dims for s in without}
    assert {s.cls for s in added} <= {c.name for c in dist.classes}
    fewer = dist_mod.training(dataclasses.replace(dist, training_added=dist.training_added // 2))
    assert fewer[:len(without)] == without
    assert {s.dims for s in fewer[len(without):]} < {s.dims for s in added}  # each class extends its stream
    assert dist_mod.heldout(dataclasses.replace(dist, training_added=0)) == held


def test_picked_shapes_come_last_for_stage_three_and_move_no_draw(dist, sets):
    """training.picked (the decode products): after the suites, the draws and the added draws,
    flagged for stage 3 under their group's class, none a shape training holds otherwise; without
    them the training set is the same shapes in the same order before them, and the held-out set
    does not move. The screen's shapes are not among them, and they are no random draw
    (the leave-one-out figures "at the draws" leave them out)."""
    from src.tune import plan as plan_mod

    _, held = sets
    dist = dataclasses.replace(dist, training_grown=0)   # the grown draws come after them
    train = dist_mod.training(dist)
    assert dist.picked and all(s.added and s.cls == "picked:decode" for s in dist.picked)
    assert train[-len(dist.picked):] == list(dist.picked)
    without = dataclasses.replace(dist, picked=())
    assert dist_mod.training(without) == train[:-len(dist.picked)]
    assert dist_mod.heldout(without) == held
    assert any(min(s.m, s.n) <= 2 and s.n * s.k * 4 > 300e6 for s in dist.picked)
    screen, _ = plan_mod.screening([s for s in train if not s.added], plan_mod.load_settings())
    assert not {s.dims for s in screen} & {s.dims for s in dist.picked}
    assert {s.dims for s in dist.picked} <= dist_mod.not_drawn(dist)


def test_grown_draws_are_the_pools_that_shorten_its_distance_to_training_most(dist, sets):
    """training.grown: chosen one at a time among the pool's draws, each the one that most shortens
    the pool's summed log2 distance to its nearest training shape (checked here against a plain
    recomputation over a small pool), under `grown:<class>`; with `grown_stage: 3` they come last,
    flagged for stage 3, with 2 before the added draws, unflagged (every stage-2 survivor measured
    there). Either way they are no plain draw for the leave-one-out, move neither the screen's
    shapes, the training set's others nor the held-out set."""
    from src.job.training import distance
    from src.tune.plan import load_settings, screening

    train, held = sets
    small = dataclasses.replace(dist, training_grown=3, grow_pool=96, grown_stage=3)
    without = dist_mod.training(dataclasses.replace(dist, training_grown=0))
    grown = dist_mod.training(small)[len(without):]
    assert len(grown) == 3 and all(s.added and s.cls.startswith("grown:") for s in grown)
    second = dist_mod.training(dataclasses.replace(small, grown_stage=2))
    early = [s for s in second if s.cls.startswith("grown:")]
    assert [s.dims for s in early] == [s.dims for s in grown] and not any(s.added for s in early)
    assert second.index(early[-1]) < min(i for i, s in enumerate(second) if s.added)
    assert [s for s in second if s not in early] == without
    assert screening(second, load_settings())[0] == screening(without, load_settings())[0]
    pool = [s.dims for s in dist_mod.draw(small, 96, dist_mod.GROW_SEED.format(seed=dist.training_seed),
                                          {s.dims for s in without})]
    known = [s.dims for s in without]
    nearest = [min(distance(p, t) for t in known) for p in pool]
    for shape in grown:
        gains = [sum(max(0.0, near - distance(p, c)) for p, near in zip(pool, nearest)) for c in pool]
        assert shape.dims == pool[gains.index(max(gains))]
        before = sum(nearest)
        nearest = [min(near, distance(p, shape.dims)) for p, near in zip(pool, nearest)]
        assert sum(nearest) < before
    mine = [s for s in train if s.cls.startswith("grown:")]
    assert [s for s in train if s not in mine] == without and len(mine) == dist.training_grown
    assert dist_mod.heldout(dataclasses.replace(dist, training_grown=0)) == held
    assert not {s.dims for s in mine} & {s.dims for s in held}
    assert {s.dims for s in mine} <= dist_mod.not_drawn(dist)
    assert dist_mod.training(dataclasses.replace(dist, training_grown=0, grow_pool=0)) == without


@pytest.mark.parametrize("grown,pool,stage", [(-1, 2048, 2), (8, 4, 2), (8, 2048, 1)])
def test_a_bad_grown_count_is_refused_with_its_rule(tmp_path, grown, pool, stage):
    text = dist_mod.DISTRIBUTION_FILE.read_text()
    text = re.sub(r"(?m)^  grown: \d+", f"  grown: {grown}", text)
    text = re.sub(r"(?m)^  grown_stage: \d+", f"  grown_stage: {stage}", text)
    bad = tmp_path / "distribution.yaml"
    bad.write_text(re.sub(r"(?m)^  grow_pool: \d+", f"  grow_pool: {pool}", text))
    with pytest.raises(ConfigError, match="training.grow_pool a whole number at least as large"):
        dist_mod.load(bad)


@pytest.mark.parametrize("edit,rule", [
    ("shapes: [1x6144x4096, ", "is already a training shape"),    # a suite's shape picked again
    ("why: \"decode steps:", "needs a one-line `why` and `shapes`"),
])
def test_a_bad_picked_shape_is_refused_with_its_rule(tmp_path, edit, rule):
    text = dist_mod.DISTRIBUTION_FILE.read_text()
    bad = tmp_path / "distribution.yaml"
    if edit.startswith("shapes"):
        text = text.replace(edit, edit + "1x4096x4096, ")
    else:
        text = re.sub(r'(?m)^      why: "decode steps:.*$', '      why: ""', text)
    bad.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(rule)):
        dist_mod.training(dist_mod.load(bad))


def test_a_bad_added_count_is_refused_with_its_rule(tmp_path):
    text = dist_mod.DISTRIBUTION_FILE.read_text()
    bad = tmp_path / "distribution.yaml"
    bad.write_text(re.sub(r"(?m)^  added: \d+", "  added: -3", text))
    with pytest.raises(ConfigError, match="training.added must be a whole number"):
        dist_mod.load(bad)


def test_every_class_is_drawn_within_its_bounds_and_rules(dist, sets):
    train, held = sets
    classes = {c.name: c for c in dist.classes}
    drawn = [s for s in train + held if not s.cls.startswith(("suite:", "picked:"))]
    assert {s.cls for s in held} == set(classes)
    for shape in drawn:
        cls = classes[shape.cls.removeprefix(dist_mod.GROWN_CLASS_PREFIX)]
        assert dist_mod.within_limits(shape, dist), shape
        if cls.square:
            assert shape.m == shape.n == shape.k and cls.m[0] <= shape.m <= cls.m[1]
            continue
        m, n = (shape.m, shape.n)
        if cls.swap_mn and not cls.m[0] <= m <= cls.m[1]:
            m, n = n, m
        assert cls.m[0] <= m <= cls.m[1] and cls.n[0] <= n <= cls.n[1], shape
        assert cls.k[0] <= shape.k <= cls.k[1], shape
        for dim, multiple in cls.multiple:
            assert getattr(shape, dim) % multiple == 0, shape
        if cls.unaligned:
            assert shape.n % 4 or shape.k % 4, shape
    skinny = [s for s in drawn if s.cls == "skinny"]
    assert any(s.m <= 32 for s in skinny) and any(s.n <= 32 for s in skinny)  # both layouts
    everything = [d for s in train + held for d in s.dims]
    assert min(everything) == 1 and max(everything) >= 16384


def test_weights_share_the_count_and_a_small_run_covers_every_class(dist, sets):
    train, _ = sets
    counts = dist_mod.allocate(dist.classes, 64)
    assert sum(counts) == 64 and all(c > 0 for c in counts)
    total = sum(c.weight for c in dist.classes)
    assert all(abs(n - 64 * c.weight / total) < 1 for n, c in zip(counts, dist.classes))
    late = lambda s: s.added or s.cls.startswith("grown:")  # noqa: E731 (stage 3's and the grown come after the others)
    classes = {s.cls for s in train if not late(s)}
    picked = dist_mod.stratified(train, len(classes))
    assert {s.cls for s in picked} == classes and len(picked) == len(classes)
    ordinary = [s for s in train if not late(s)]
    assert {s.dims for s in dist_mod.stratified(train, len(ordinary))} == {s.dims for s in ordinary}
    assert dist_mod.stratified(train, None) == train
    assert dist_mod.stratified(train, 20) == dist_mod.stratified(train, 20)


def test_the_committed_suites_are_the_generators_and_compose(dist, compose):
    for path, text in dist_mod.generated_files(dist).items():
        assert path.read_text() == text, f"{path.name}: run python -m src.tune.distribution --write"
    assert dist_mod.main(["--check"]) == 0
    for name, shapes in (("heldout", dist_mod.heldout(dist)), ("training", dist_mod.training(dist))):
        cfg = compose(f"+suite={name}", return_hydra_config=True)
        assert cfg.suite == name and (cfg.alpha, cfg.beta) == (0.5, 3.0)
        assert str(cfg.hydra.sweeper.params.shape).split(",") == [s.label for s in shapes]
    # the published suite stays the hand-written 48 shapes
    assert set(suites().values()) == {"square", "llm", "skinny", "odd"}


def test_a_bad_class_is_refused_with_its_rule(tmp_path):
    path = tmp_path / "d.yaml"
    text = (CONF_DIR / "shapes" / "distribution.yaml").read_text()
    path.write_text(text.replace("m: [1, 32]", "m: [32, 1]"))
    with pytest.raises(ConfigError, match="rule: each dimension is drawn between two positive bounds"):
        dist_mod.load(path)
    path.write_text(text.replace('why: "per-head and per-expert products: launch and SM fill dominate"', ""))
    with pytest.raises(ConfigError, match="one-line `why`"):
        dist_mod.load(path)
