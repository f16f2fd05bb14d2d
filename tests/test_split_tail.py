"""The split tail (`split_tail` 1 in gemm_tf32, gemm_3xtf32 and gemm_tf32_swapped): where whole
tiles fill more than one wave of blocks, the tiles past the last full wave run K-sliced across a
cluster in a launch of their own (`launch.tail`, each kernel's *_tail entry, which runs the last
tiles), so that they fill one wave for a fraction of a round instead of a few SMs for a whole one.

CPU: the launches it plans (the main launch's whole waves, the tail's tiles and slices, none where
nothing is left past a wave or slicing cannot fit it in one), the runner launching the tail after
the main entry on the same arguments, the wave fill the nearest model counts, the tail entries'
builds. GPU: every kernel's tail verified with alpha and beta against the FP64 reference."""

from __future__ import annotations

import re

import pytest

from src.errors import ConfigError
from src.job import training
from src.job.training import NearestModel
from src.job.gpu import limits_from_spec
from src.job.nvcc import compile_offline, nvcc_path
from src.job.problem import Problem
from src.job.spec import build_spec
from src.tune.plan import candidate_config
from src.tune.space import kernel_identity

H200 = limits_from_spec("h200")  # 132 SMs, as the H100 SXM
PRECISION = {"gemm_tf32": "tf32", "gemm_3xtf32": "fp32", "gemm_tf32_swapped": "tf32"}


def spec_of(kernel: str, shape, limits=H200, **params):
    cfg = candidate_config(kernel, PRECISION[kernel])
    return build_spec({**cfg, "params": {**cfg["params"], **params}}, Problem(*shape, 0.5, 3.0), limits)


# (kernel, shape, params, tiles, tail tiles, tail slices) on 132 SMs
TAILS = [
    ("gemm_tf32", (1177, 7168, 1792), {"bm": 256, "fit": 2, "min_slice_k": 256}, 280, 16, 4),  # K // 256 = 7
    ("gemm_tf32", (726, 5760, 8960), {"bm": 256, "fit": 2}, 135, 3, 8),       # one wave and 3 tiles
    ("gemm_tf32", (1000, 9000, 1000), {"bm": 128, "fit": 2, "min_slice_k": 256}, 568, 40, 2),  # 132 // 40 = 3
    ("gemm_tf32", (1177, 7167, 1791), {"bm": 256, "fit": 2, "min_slice_k": 256, "unaligned_rows": 2}, 280, 16, 4),
    ("gemm_3xtf32", (1177, 7168, 1792), {"bm": 128, "bn": 128}, 560, 32, 4),
    ("gemm_3xtf32", (1177, 7168, 1792), {"register_operand": 2, "bm": 128, "bn": 128}, 560, 32, 4),
    ("gemm_3xtf32", (1177, 7167, 1791), {"bm": 128, "bn": 128, "unaligned_rows": 2}, 560, 32, 4),
    ("gemm_tf32_swapped", (30000, 200, 2048), {}, 940, 16, 4),                # 128 x 56 tiles
    ("gemm_tf32_swapped", (30000, 200, 2047), {"unaligned_rows": 2}, 940, 16, 2),  # K // 512 = 3
]


@pytest.mark.parametrize("kernel,shape,params,tiles,tail_tiles,tail_slices", TAILS)
def test_the_tiles_past_the_last_full_wave_run_sliced_in_a_launch_of_their_own(
        kernel, shape, params, tiles, tail_tiles, tail_slices):
    """The main launch runs the first tiles, whole waves of them, unsliced; the tail launch the
    remaining tail_tiles, tail_slices blocks each (a power of two, as many as one wave holds, none
    shorter than min_slice_k): together every tile once. Without split_tail the same shape runs
    one launch of every tile, the same main entry."""
    spec = spec_of(kernel, shape, split_tail=1, **params)
    plain = spec_of(kernel, shape, split_tail=0, **params)
    assert spec.derived["tiles"] == tiles and plain.tail is None and plain.grid == (tiles,)
    assert spec.grid == (tiles - tail_tiles,) and spec.grid[0] % H200["sms"] == 0
    assert spec.tail is not None and spec.tail.slices == tail_slices
    assert spec.tail.grid == (tail_tiles * tail_slices,) and spec.tail.grid[0] <= H200["sms"]
    assert spec.entry == plain.entry and "_cluster" not in spec.entry
    assert spec.tail.entry.startswith(f"{kernel}_tail<") and f", {tail_slices}, " in spec.tail.entry
    assert kernel_identity(spec) != kernel_identity(plain)


@pytest.mark.parametrize("kernel,shape,params,why", [
    ("gemm_tf32", (4096, 4096, 4096), {}, "116 tiles past 3 waves: two slices would not fit one wave"),
    ("gemm_tf32", (1024, 1024, 1024), {}, "32 tiles, under one wave: K slices of the whole launch"),
    ("gemm_tf32", (1024, 4224, 4096), {"bm": 128}, "264 tiles, whole waves: nothing left over"),
    ("gemm_tf32", (1177, 7168, 300), {"bm": 256, "fit": 2}, "K 300 holds no second slice of 512"),
    ("gemm_tf32", (726, 5760, 8960), {"bm": 256, "fit": 2, "min_slices": 2}, "sliced already"),
    ("gemm_3xtf32", (1177, 7168, 1792), {"bm": 128, "bn": 128, "split_k": 1}, "split_k 1: never sliced"),
    ("gemm_tf32_swapped", (500, 200, 2048), {}, "16 tiles: K slices of the whole launch"),
])
def test_no_tail_where_nothing_is_left_past_a_wave_or_slicing_cannot_fit_it(kernel, shape, params, why):
    """Where the tiles fill whole waves, fill under one (the whole launch's K slices serve), are
    sliced already, or the tail cannot take two slices within one wave or of min_slice_k each,
    split_tail 1 builds split_tail 0's launch: the tuner's twin, measured once."""
    spec = spec_of(kernel, shape, split_tail=1, **params)
    assert spec.tail is None, why
    assert kernel_identity(spec) == kernel_identity(spec_of(kernel, shape, split_tail=0, **params))


def test_a_tail_that_cannot_be_read_is_a_config_error():
    cfg = candidate_config("gemm_tf32", "tf32")
    problem = Problem(726, 5760, 8960, 1.0, 0.0)
    params = {**cfg["params"], "bm": 256, "fit": 2, "split_tail": 1}
    for tail, rule in [({"grid": ["tail_tiles * tail_slices"]}, "needs an entry and a grid"),
                       ({**cfg["launch"]["tail"], "slices": "tail_slices - 8"}, "at least 1")]:
        broken = {**cfg, "params": params, "launch": {**cfg["launch"], "tail": tail}}
        with pytest.raises(ConfigError, match=rule):
            build_spec(broken, problem, H200)


def test_the_wave_fill_counts_a_tail_round_as_its_share_of_a_tile():
    """The nearest model's wave fill (src/job/training.wave_fill): 280 whole tiles take 3 rounds
    of 132 (fill 0.71); 264 of them then 16 in 4 slices take 2 rounds and a quarter (0.94); a
    tail whose blocks spill past one wave costs a second of its short rounds."""
    assert training.wave_fill(280, 1, 132) == pytest.approx(280 / 396)
    assert training.wave_fill(264, 1, 132, 64, 4) == pytest.approx(280 / (2.25 * 132))
    assert training.wave_fill(264, 1, 132, 140, 4) == pytest.approx(299 / (2.5 * 132))
    assert training.wave_fill(132, 1, 132) == training.wave_fill(132, 1, 132, 0, 1) == 1.0
    from src.job import dispatch

    candidate = training.Candidate("gemm_tf32", '{"bm": 256, "fit": 2, "min_slice_k": 256, "split_tail": %d}')
    fill = dispatch.wave_fills("h200", "tf32")
    split, whole = (fill(training.Candidate(candidate.kernel, candidate.params % v), (1177, 7168, 1792))
                    for v in (1, 0))
    assert split == pytest.approx(280 / (2.25 * 132)) and whole == pytest.approx(280 / 396)


def test_the_wave_fill_scales_a_ratio_only_between_launches_that_split_their_tail_alike():
    """The nearest model scales a neighbour's ratio by the wave fill here against there only where
    both launches split their tail or neither does (src/job/training._corrected): a split tail's
    second launch and its slices' add-up cost what the fill does not count. SYNTHETIC: TAIL runs
    0.9 at both neighbours with its last round half empty there (fill 0.5), PLAIN 1.0 with full
    rounds. At the query TAIL fills its rounds: as one launch it scores 0.9 * 2 ** 0.5 = 1.273 and
    wins; as a split tail against neighbours that measured one launch its 0.9 stands and PLAIN
    wins; with neighbours that split their tail too, the scaling is back (1.273)."""
    near, far, query = (64, 64, 64), (1024, 1024, 1024), (100, 100, 100)
    tail, plain = '{"split_tail": 1}', '{"split_tail": 0}'
    rows = [{"dispatcher": "best_tf32", "kernel": "gemm_tf32", "params": p, "m": s[0], "n": s[1],
             "k": s[2], "status": "ok", "ratio_best": v}
            for p, v in ((tail, 0.9), (plain, 1.0)) for s in (near, far)]
    tab = training.table(rows, "best_tf32")
    anything = lambda c, s: True  # noqa: E731

    def chosen(query_fill, neighbour_fill):
        def fill(c, s):
            if c.params == plain:
                return training.WaveFill(1.0)
            return query_fill if s == query else neighbour_fill
        choice = training.nearest_choice(tab, query, tab.shapes, anything, NearestModel(2, "equal", fill, 0.5))
        return choice[0].params, round(choice[2], 3)

    assert chosen(training.WaveFill(1.0), training.WaveFill(0.5)) == (tail, 1.273)
    assert chosen(1.0, 0.5) == (tail, 1.273)  # plain floats: fills of one launch each
    assert chosen(training.WaveFill(1.0, True), training.WaveFill(0.5)) == (plain, 1.0)
    assert chosen(training.WaveFill(1.0, True), training.WaveFill(0.5, True)) == (tail, 1.273)

    # the fill says whether its launch splits the tail: gemm_tf32 at 1177 x 7168 x 1792
    assert training.wave_fill(264, 1, 132, 64, 4).split_tail and not training.wave_fill(280, 1, 132).split_tail
    from src.job import dispatch

    fill = dispatch.wave_fills("h200", "tf32")
    split, whole = (fill(training.Candidate("gemm_tf32", '{"bm": 256, "fit": 2, "min_slice_k": 256, '
                                                         f'"split_tail": {v}}}'), (1177, 7168, 1792))
                    for v in (1, 0))
    assert split.split_tail and not whole.split_tail
    # split_tail 1 where no tile is left past a wave: one launch, no tail
    assert not fill(training.Candidate("gemm_tf32", '{"bm": 256, "fit": 2, "split_tail": 1}'),
                    (1024, 1024, 1024)).split_tail


def test_the_runner_launches_the_tail_after_the_main_entry_on_the_same_arguments(monkeypatch):
    """compile_kernel loads the tail entry with the main entry's shared memory opt-in; a launch
    runs the pre-pass (none here: aligned rows), the main entry over its whole waves, then the
    tail over its grid, each with the block, shared memory and arguments of the main one."""
    import types

    from tests import fake_cupy

    spec = spec_of("gemm_tf32", (1177, 7168, 1792), split_tail=1, bm=256, fit=2, min_slice_k=256)
    calls, raised = [], {}

    class Function:
        def __init__(self, name):
            self.name, self.shared_size_bytes = name, 0
            self.num_regs, self.local_size_bytes, self.max_threads_per_block = 168, 0, 384
            self.attributes = {}

        def __setattr__(self, key, value):
            if key == "max_dynamic_shared_size_bytes":
                raised[self.name] = value
            object.__setattr__(self, key, value)

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append((self.name, grid, block, args, shared_mem))

    compile_mod = fake_cupy.install_loader(monkeypatch, Function)
    kernel = compile_mod.compile_kernel(spec)
    assert raised == {spec.entry: spec.dynamic_smem_bytes, spec.tail.entry: spec.dynamic_smem_bytes}
    monkeypatch.setattr(kernel, "_tensor_maps", lambda a, b: ("map_a", "map_b"))
    a = types.SimpleNamespace(shape=(1177, 1792))
    b = types.SimpleNamespace(shape=(1792, 7168))
    kernel.launch(a, b, "c", 0.5, 3.0)
    assert [(name, grid) for name, grid, *_ in calls] == [(spec.entry, (264,)), (spec.tail.entry, (64,))]
    assert calls[0][2:] == calls[1][2:]  # block, arguments, shared memory
    assert calls[1][3][-2:] == ("map_a", "map_b") and calls[1][4] == spec.dynamic_smem_bytes


needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")


@needs_nvcc
@pytest.mark.parametrize("kernel,shape,params,tiles,tail_tiles,tail_slices",
                         [TAILS[0], TAILS[3], TAILS[4], TAILS[5], TAILS[6], TAILS[8]])
def test_the_tail_entries_build_without_spills(kernel, shape, params, tiles, tail_tiles, tail_slices):
    """Each kernel's tail entry (a cluster of tail_slices blocks, the last tiles) builds for sm_90a
    beside its main entry with no spills and no stack frame, as the cluster entries do."""
    spec = spec_of(kernel, shape, split_tail=1, **params)
    log = compile_offline(spec, spec.arch)["log"]
    for entry in (spec.entry, spec.tail.entry):
        name = entry.split("<")[0]
        found = re.search(rf"Compiling entry function '_Z\d+{name}I[^']*' for 'sm_90a'\n(?:.*\n){{0,3}}?"
                          rf".*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert found is not None, log
        assert found.groups() == ("0", "0"), log


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,shape,params", [
    pytest.param(kernel, shape, params, id=f"{kernel}-{'x'.join(map(str, shape))}-{i}",
                 marks=[pytest.mark.chapter(kernel)] + ([pytest.mark.smoke] if i in (0, 4, 7) else []))
    for i, (kernel, shape, params, *_) in enumerate(TAILS)])
def test_split_tail_alpha_beta(compose, kernel, shape, params):
    """The split tail in each kernel (gemm_3xtf32 in both roles), with fitted and partial tiles,
    unaligned rows streamed by the producer: verified with alpha and beta against the FP64
    reference at the kernel's tolerance, its timed launches and fresh inputs too, with no local
    memory; the main launch ran the first tiles alone (its grid whole waves), so the tail ran."""
    from src.job.pipeline import run_job

    m, n, k = shape
    # every parameter pinned to the planned launch's, so the kernel's defaults in conf/ (not the
    # test's candidate) cannot turn its tail into a K-sliced main launch
    params = spec_of(kernel, shape, **params, split_tail=1).params
    record = run_job(compose(f"kernel={kernel}", f"m={m}", f"n={n}", f"k={k}", "alpha=0.5", "beta=3.0",
                             *[f"kernel.params.{p}={v}" for p, v in params.items()], "bench=quick"),
                     explicit_params=set(params))
    assert record.status == "ok", record.error
    assert max(record.rel_err, record.rel_err_timed, record.rel_err_fresh) <= record.tolerance
    assert record.local_bytes == 0
    assert record.grid[0] < spec_of(kernel, shape, **params).derived["tiles"], record.grid
