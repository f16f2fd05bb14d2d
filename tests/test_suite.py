"""Shape suites (conf/suite/), `shape=MxNxK`, per-shape dispatch (kernel=best_fp32 / best_tf32,
src/job/dispatch.py) and the suite's publication (src/publish/suite.py), without a GPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from src.errors import ConfigError, InvalidProblem, UnsupportedSize
from src.job.prepare import prepare
from src.job.problem import Problem
from src.publish.suite import publish, suite_frame, suites, summary
from src.records import math_units
from src.records.collect import read_runs
from src.job import autotune, dispatch
from src.job.config import kernel_config
from src.job import gpu as gpu_mod
from tests.conftest import CONF_DIR, DATA_DIR
from tests.runs_fixture import as_dispatched

ROOT = CONF_DIR.parent
from tests.runs_fixture import SUITE_EXPLORATION as EXPLORATION


def test_shape_sets_m_n_k_and_size_still_works(compose):
    cfg = compose("shape=4095x4097x333")
    assert (cfg.m, cfg.n, cfg.k) == (4095, 4097, 333)
    cfg = compose("size=512")
    assert (cfg.m, cfg.n, cfg.k) == (512, 512, 512)
    cfg = compose("m=10", "n=20", "k=30")
    assert (cfg.m, cfg.n, cfg.k) == (10, 20, 30)


@pytest.mark.parametrize("bad", ["4096x2048", "4096x0.5x2", "axbxc"])
def test_a_bad_shape_is_refused_with_its_rule(compose, bad):
    with pytest.raises(InvalidProblem, match="shape=MxNxK"):
        Problem.from_cfg(compose(f"shape={bad}"))


def test_suites_hold_40_to_60_distinct_shapes_and_say_why():
    shapes = suites()
    assert 40 <= len(shapes) <= 60
    assert set(shapes.values()) == {"square", "llm", "skinny", "odd"}
    for path in (CONF_DIR / "suite").glob("*.yaml"):
        text = path.read_text()
        assert "Why:" in text, path.name          # each suite says why it exists
        listed = str(yaml.safe_load(text)["hydra"]["sweeper"]["params"]["shape"]).split(",")
        assert len(listed) == len(set(listed)), path.name
    dims = [tuple(map(int, s.split("x"))) for s in shapes]
    assert any(1 in d[:2] for d in dims)                      # a matrix-vector product
    assert any(d[1] % 4 or d[2] % 4 for d in dims)            # rows not 16-byte aligned
    assert max(max(d) for d in dims) >= 16384 and min(d[2] for d in dims) <= 64


def test_a_suite_is_one_sweep_axis(tmp_path):
    """`-m +suite=odd kernel=a,b`: every shape of the suite for each kernel (12 x 2 jobs), with
    the suite's alpha and beta; the progress line counts the suite's shapes."""
    out = subprocess.run(
        [sys.executable, "-m", "src.run", "-m", "+suite=odd", "kernel=01_naive,02_gmem_coalesce",
         "mlflow=off", "isolation=inline", f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "job 1 of 24:" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/record.json")]
    assert len(records) == 24
    assert {(r["m"], r["n"], r["k"]) for r in records} == \
        {tuple(map(int, s.split("x"))) for s, name in suites().items() if name == "odd"}
    assert {(r["alpha"], r["beta"]) for r in records} == {(0.5, 3.0)}


def _problem(m, n, k):
    return Problem(m, n, k, 1.0, 0.0)


def test_the_h100_dispatch_runs_each_training_shape_on_its_best_measured_candidate():
    """conf/tuned/h100_sxm.yaml is `sgemm-lab tune`'s output with the nearest-neighbour model: at
    each shape of its evidence (the suite's 48 among them) best_fp32 and best_tf32 run a candidate
    measured best there (ties: any of them), read here from the CSV alone (its same_as rows with
    their source rows' figures, as the file's reader gives them)."""
    from src.job import training

    best: dict[tuple, dict] = {}
    for row in training.read(ROOT / "results" / "tuning" / "h100_sxm.csv"):
        if row["status"] != "ok":
            continue
        key = (row["dispatcher"], row["m"], row["n"], row["k"])
        best.setdefault(key, {})[(row["kernel"], row["params"])] = row["ratio_best"]
    assert len(best) >= 2 * 100 and suites().keys() <= {"x".join(map(str, k[1:])) for k in best}
    for (dispatcher, *shape), ratios in best.items():
        choice = dispatch.choose({"name": dispatcher, "dispatch": True, "default": "17_flagship"},
                                 "h100_sxm", _problem(*shape))
        got = ratios.get((choice.kernel, json.dumps(choice.params, sort_keys=True)))
        assert got == max(ratios.values()), (dispatcher, shape, choice)
        assert choice.rule.startswith("conf/tuned/h100_sxm.yaml: nearest: a training shape")


@pytest.mark.parametrize("gpu", ["h100_sxm", "h200"])
def test_the_tuned_dispatch_sends_matrix_vector_products_to_the_skinny_kernel(gpu):
    """conf/tuning/dispatch.yaml reserves min(m, n) <= 2 for gemm_ffma_skinny: through each GPU's
    committed tuned file, both dispatchers run it at the held-out set's matrix-vector products
    (3760x1x1258 chose the fitted 3xTF32 tiles before the region: its nearest training shapes
    include 10684x24x1552) and at shapes near none of the training shapes; the rule text says the
    guards left it alone there (or the reserved rule chose it), as it does for the big-tile kernel
    at 4096^3, and not where several kernels may run."""
    import yaml

    heldout = yaml.safe_load((ROOT / "conf" / "suite" / "heldout.yaml").read_text())
    shapes = [tuple(map(int, s.split("x")))
              for s in heldout["hydra"]["sweeper"]["params"]["shape"].split(",")]
    gemv = [s for s in shapes if min(s[:2]) <= 2] + [(2, 77, 99), (16384, 1, 333), (1, 1, 1)]
    assert (3760, 1, 1258) in gemv and len(gemv) >= 8
    for dispatcher in ("best_fp32", "best_tf32"):
        for shape in gemv:
            choice = dispatch.choose({"name": dispatcher, "dispatch": True, "default": "17_flagship"},
                                     gpu, _problem(*shape))
            assert choice.kernel == "gemm_ffma_skinny", (dispatcher, shape, choice.rule)
            assert (choice.rule.endswith("gemm_ffma_skinny is the only candidate kernel the "
                                         "guards allow here")  # the nearest model
                    or "reserved for gemm_ffma_skinny" in choice.rule), choice.rule  # the rules
        wide = dispatch.choose({"name": dispatcher, "dispatch": True, "default": "17_flagship"},
                               gpu, _problem(4096, 4096, 4096))
        assert wide.kernel != "gemm_ffma_skinny"  # there only the big-tile kernel's guard holds
        assert wide.rule.endswith(f"{wide.kernel} is the only candidate kernel the guards allow here")
        narrow = dispatch.choose({"name": dispatcher, "dispatch": True, "default": "17_flagship"},
                                 gpu, _problem(12, 867, 938))  # skinny may run, so may others
        assert "only candidate kernel" not in narrow.rule


def test_an_unaligned_shape_the_tf32_dispatch_sends_to_the_tma_kernel_is_padded_first(compose):
    """best_tf32 on the H100 (RECORDED: the committed tuned file): where it chooses gemm_tf32 (TMA)
    for rows that are not 16-byte aligned, the kernel's pre-pass pads them; where it chooses
    gemm_tf32_swapped, its pre-pass writes B transposed (rows of its own, aligned); gemm_mma_tf32
    reads them as stored (no pre-pass); never a refusal or a three-product fallback."""
    tma = prepare(compose("kernel=best_tf32", "shape=2616x1418x3736"))
    assert tma.spec.name == "gemm_tf32" and tma.spec.precision == "tf32"
    assert "nearest" in tma.dispatched.rule and tma.spec.prepass.entry == "pad_unaligned_rows"
    swapped = prepare(compose("kernel=best_tf32", "shape=1156x65x4351"))
    assert swapped.spec.name == "gemm_tf32_swapped" and swapped.spec.prepass.entry.startswith("split_tf32_b_transposed")
    mma = prepare(compose("kernel=gemm_mma_tf32", "shape=552x6x2313"))
    assert mma.spec.name == "gemm_mma_tf32" and mma.spec.precision == "tf32"
    assert mma.spec.prepass is None
    aligned = prepare(compose("kernel=best_tf32", "shape=4096x4096x4096"))
    assert aligned.spec.name == "gemm_tf32" and aligned.spec.prepass is None


@pytest.mark.parametrize("gpu", ["a100", "rtx4090"])
def test_a_gpu_without_a_dispatch_table_runs_the_first_portable_default_that_builds(compose, gpu):
    """No `dispatch:` for the GPU: each shape runs the first of the dispatcher's `default` kernels
    that builds there (conf/kernel/best_*.yaml): TF32 on the tensor cores through mma.sync, not
    chapter 17's FFMA; gemm_ffma_skinny only where its own rule lets it run (min(m, n) <= 32)."""
    expected = {("best_tf32", "4095x4097x333"): "gemm_mma_tf32",
                ("best_tf32", "7x4096x4096"): "gemm_mma_tf32",
                ("best_fp32", "4095x4097x333"): "17_flagship",
                ("best_fp32", "7x4096x4096"): "gemm_ffma_skinny"}
    for (kernel, shape), chosen in expected.items():
        prepared = prepare(compose(f"kernel={kernel}", f"gpu={gpu}", f"shape={shape}"))
        assert prepared.spec.name == chosen, (kernel, shape)
        assert prepared.spec.arch is None  # built for the GPU's own architecture, not sm_90a
        assert prepared.dispatched.when is None
        assert prepared.dispatched.rule.startswith(f"{kernel} default (no dispatch rule for "
                                                   f"{shape} on {gpu}): the first of its ")


def test_on_a_gpu_without_a_table_autotune_measures_the_portable_defaults_that_build():
    """An A100 has no dispatch table: the choice is the first default that builds, and autotune
    lists the others that build there (the skinny kernel only at a skinny shape), each once."""
    limits = gpu_mod.limits_from_spec("a100")
    settings = autotune.Settings.from_cfg(None)
    for name, shape, kernels in [
            ("best_tf32", (2500, 3500, 900), ["gemm_mma_tf32", "17_flagship"]),
            ("best_tf32", (7, 4096, 4096), ["gemm_mma_tf32", "gemm_ffma_skinny", "17_flagship"]),
            ("best_fp32", (2500, 3500, 900), ["17_flagship", "gemm_mma_3xtf32", "gemm_ffma"]),
            ("best_fp32", (7, 4096, 4096), ["gemm_ffma_skinny", "17_flagship", "gemm_mma_3xtf32",
                                            "gemm_ffma"])]:
        problem = Problem(*shape, 1.0, 0.0)
        choice = dispatch.choose(kernel_config(name), "a100", problem, limits)
        assert not autotune.coverage(choice, name, shape, None, 0.5, "a100.csv", margin=0.02).well
        planned = autotune.planned(choice, kernel_config(name), "a100", problem, None, settings, limits)
        assert [c.kernel for c, _ in planned] == kernels, (name, shape)


def test_each_dispatcher_measures_as_many_candidates_as_its_count_says():
    """dispatch.autotune_candidates as {dispatcher: count}: best_fp32's count cuts its list, and
    best_tf32, not named, measures the default 4 (the A100's portable defaults, as above)."""
    limits = gpu_mod.limits_from_spec("a100")
    settings = autotune.Settings.from_cfg({"dispatch": {"autotune_candidates": {"best_fp32": 2}}})
    problem = Problem(7, 4096, 4096, 1.0, 0.0)
    listed = {}
    for name in ("best_fp32", "best_tf32"):
        choice = dispatch.choose(kernel_config(name), "a100", problem, limits)
        listed[name] = [c.kernel for c, _ in autotune.planned(choice, kernel_config(name), "a100", problem,
                                                              None, settings, limits)]
    assert listed == {"best_fp32": ["gemm_ffma_skinny", "17_flagship"],
                      "best_tf32": ["gemm_mma_tf32", "gemm_ffma_skinny", "17_flagship"]}


@pytest.mark.parametrize("gpu", ["gh200", "h100_pcie"])
def test_an_untuned_hopper_gpu_borrows_the_h100s_rules_and_explain_says_so(compose, gpu, capsys):
    """The GH200 and the H100 PCIe are the H100 SXM's processor: their tuned files take its rules
    (the sm_90a kernels, not chapter 17's fallback), and explain says the rules were not fitted on
    them; the H100 SXM's own rules are not reported as borrowed."""
    from src.cli import main as cli

    for kernel in ("best_fp32", "best_tf32"):
        prepared = prepare(compose(f"kernel={kernel}", f"gpu={gpu}", "shape=4095x4097x333"))
        assert prepared.spec.name.startswith("gemm_")  # a library kernel, not 17's fallback
        assert prepared.dispatched.rule.startswith(f"conf/tuned/{gpu}.yaml: ")
        same_on_h100 = prepare(compose(f"kernel={kernel}", "gpu=h100_sxm", "shape=4095x4097x333"))
        assert prepared.spec.entry == same_on_h100.spec.entry
    for spec, borrowed in ((gpu, True), ("h100_sxm", False)):
        assert cli(["explain", "4096x4096x4096", "--gpu", spec]) == 0
        out = capsys.readouterr().out
        assert (f"the rules are h100_sxm's, taken by conf/tuned/{spec}.yaml, not fitted" in out) is borrowed


@pytest.mark.parametrize("gpu,limits_from", [("a100", None), ("unknown", "a100's limits")])
def test_explain_on_a_gpu_without_a_table_shows_what_builds_there(capsys, gpu, limits_from):
    """explain names the default that builds at the shape (not the skinny kernel at a square) and
    what autotune measures; a GPU without a spec is explained with an sm_80 stand-in's limits,
    and says so."""
    from src.cli import main as cli

    assert cli(["explain", "4096x4096x4096", "--gpu", gpu]) == 0
    out = capsys.readouterr().out
    assert "  runs 17_flagship " in out and "the first of its 5 that builds here" in out
    assert "autotune: measures these 3 here" in out and "gemm_ffma_skinny {}" not in out
    assert (f"checked against {limits_from}" in out) if limits_from else "stand" not in out
    assert cli(["explain", "4096x4096x4096", "--gpu", gpu, "--precision", "tf32"]) == 0
    assert "  runs gemm_mma_tf32 " in capsys.readouterr().out


def test_a_library_kernel_run_by_name_takes_its_own_size_classes(compose):
    """A library kernel run by name (not through a dispatch rule that names its parameters)
    takes the parameters of its first size class in conf/tuned/h100_sxm.yaml that holds."""
    # gemm_ffma_skinny (matrix-vector-like): K slices of 1024 for few columns up to 4096 rows; the
    # first loads issued before the small operand is staged only at width 1
    for shape, index, entry in [
            ("4096x1x4096", 0, "<0, 1, 8, 4, 1024, 4, 1>"),
            ("4096x8x4096", 0, "<0, 8, 8, 4, 1024, 4, 0>"),
            ("8192x2x8192", 1, "<0, 2, 8, 4, 512, 4, 0>"),
            ("1x4096x4096", 1, "<1, 1, 8, 4, 256, 8, 1>"),
            ("8x4096x4096", 1, "<1, 8, 8, 4, 256, 8, 0>")]:
        vector = prepare(compose("kernel=gemm_ffma_skinny", f"shape={shape}"))
        assert vector.spec.entry == "gemm_ffma_skinny" + entry, shape
        assert vector.tuned_from.startswith(f"conf/tuned/h100_sxm.yaml: gemm_ffma_skinny[{index}]")
    # gemm_3xtf32 with A in registers (more rows than columns): 64-column tiles for few columns, 64 or 128 rows
    for shape, index, entry in [
            ("4096x64x4096", 0, "_cluster<1, 64, 64, 8, 8, 1, 2, 2, 0, 0>"),    # 64 tiles: 2 slices
            ("512x64x8192", 0, "_cluster<1, 64, 64, 8, 8, 1, 2, 8, 0, 0>"),     # few rows: 8 slices
            ("1024x64x4096", 1, "_cluster<1, 128, 64, 6, 8, 1, 2, 8, 0, 0>"),   # 8 tiles of 128 rows
            ("16384x64x1024", 1, "<1, 128, 64, 6, 8, 1, 2, 1, 0, 0>"),          # 128 tiles: no slices
            ("8192x128x8192", 2, "_cluster<1, 128, 128, 4, 8, 1, 2, 2, 0, 0>")]:  # 64 tiles: 2 slices
        narrow = prepare(compose("kernel=gemm_3xtf32", f"shape={shape}"))
        assert narrow.spec.entry == "gemm_3xtf32" + entry, shape
        assert narrow.tuned_from.startswith(f"conf/tuned/h100_sxm.yaml: gemm_3xtf32[{index}]")
    # gemm_3xtf32 with B in registers: one wave of 64 x 64 tiles, or 23's 128 x 128 tile, K slices where few
    for shape, index, entry in [
            ("32x4096x4096", 3, "_cluster<0, 64, 64, 8, 8, 1, 2, 2, 0, 0>"),    # 64 tiles: 2 slices
            ("333x333x333", 3, "_cluster<0, 64, 64, 8, 8, 1, 2, 2, 0, 0>"),     # 36 tiles, slices from K 256
            ("256x256x256", 3, "_cluster<0, 64, 64, 8, 8, 1, 2, 4, 0, 0>"),     # 16 tiles, 4 slices of 64
            ("128x4096x8192", 3, "<0, 64, 64, 8, 8, 1, 2, 1, 0, 0>"),           # 128 tiles: no slices
            ("511x513x8191", 4, "_cluster<0, 128, 128, 4, 8, 1, 2, 4, 0, 0>"),  # 20 tiles: 4 slices
            ("1024x1024x1024", 4, "_cluster<0, 128, 128, 4, 8, 1, 2, 2, 0, 0>"),
            ("4096x4096x4096", 4, "<0, 128, 128, 4, 8, 1, 2, 1, 0, 0>")]:       # 23's launch, unsplit
        fp32 = prepare(compose("kernel=gemm_3xtf32", f"shape={shape}"))
        assert fp32.spec.entry == "gemm_3xtf32" + entry, shape
        assert fp32.tuned_from.startswith(f"conf/tuned/h100_sxm.yaml: gemm_3xtf32[{index}]")
    # gemm_tf32, whose size classes pick tiles and, through them, the K slices
    for shape, index, entry in [
            ("511x513x8191", 0, "_cluster<128, 128, 5, 8, 2, 4, 0, 0>"),   # small C, long K: 4 slices, 5 stages
            ("32x4096x4096", 1, "_cluster<64, 64, 8, 8, 2, 2, 0, 0>"),     # one wave of 64 x 64 tiles
            ("4096x64x4096", 1, "_cluster<64, 64, 8, 8, 2, 2, 0, 0>"),
            ("128x4096x8192", 1, "<64, 64, 8, 8, 2, 1, 0, 0>"),            # 128 tiles: no slices
            ("128x5120x13824", 2, "_cluster<128, 128, 4, 8, 2, 2, 0, 0>"),  # a few rows
            ("8192x128x8192", 2, "_cluster<128, 128, 4, 8, 2, 2, 0, 0>"),
            ("768x768x768", 3, "<64, 128, 8, 8, 2, 1, 0, 0>"),             # small squares
            ("1024x1024x1024", 4, "_cluster<128, 128, 4, 8, 2, 2, 0, 0>"),
            ("512x10240x8192", 5, "_cluster<256, 128, 4, 8, 2, 2, 0, 0>"),  # 160 tiles: 2 slices
            ("1024x13824x5120", 6, "<256, 128, 4, 8, 2, 1, 0, 0>"),         # 432 tiles: unsplit
            ("4096x4096x4096", 6, "<256, 128, 4, 8, 2, 1, 0, 0>")]:       # 20's tile, unsplit
        tf32 = prepare(compose("kernel=gemm_tf32", f"shape={shape}"))
        assert tf32.spec.entry == "gemm_tf32" + entry, shape
        assert tf32.tuned_from.startswith(f"conf/tuned/h100_sxm.yaml: gemm_tf32[{index}]")


def test_bad_dispatch_rules_are_config_errors(monkeypatch):
    def table(rules):
        monkeypatch.setattr(dispatch, "tuned_config", lambda gpu: {"dispatch": {"best_fp32": rules}})

    spec = {"name": "best_fp32", "dispatch": True, "default": "17_flagship"}
    table([{"when": "m >", "kernel": "22_ffma_warp_specialized"}])
    with pytest.raises(ConfigError, match=r"best_fp32\[0\] has a bad `when`"):
        dispatch.choose(spec, "h100_sxm", _problem(8, 8, 8))
    table([{"when": "True"}])
    with pytest.raises(ConfigError, match="names no kernel"):
        dispatch.choose(spec, "h100_sxm", _problem(8, 8, 8))
    table([])
    with pytest.raises(ConfigError, match="has no `default`"):
        dispatch.choose({"name": "best_fp32", "dispatch": True}, "h100_sxm", _problem(8, 8, 8))
    for bad in ([{"kernel": "17_flagship"}], [{"why": "runs anywhere"}], ["17_flagship"], [], {"a": 1}):
        with pytest.raises(ConfigError, match=r"\{kernel, why\}"):
            dispatch.choose({"name": "best_fp32", "dispatch": True, "default": bad}, "h100_sxm",
                            _problem(8, 8, 8))
    # a bare chapter name is one default, with the config's own why
    assert dispatch.defaults(spec | {"why": "any shape"}) == [{"kernel": "17_flagship", "why": "any shape"}]
    # none builds at the shape: refused, each default with the rule it breaks there
    two = {"name": "best_fp32", "dispatch": True, "precision": "fp32",
           "default": [{"kernel": "gemm_ffma_skinny", "why": "a"}, {"kernel": "gemm_ffma_narrow", "why": "b"}]}
    with pytest.raises(UnsupportedSize, match=r"none of its 2 defaults builds here \(gemm_ffma_skinny: "
                                              r"`min\(m, n\) <= 32`; gemm_ffma_narrow: `"):
        dispatch.choose(two, "h100_sxm", _problem(4096, 4096, 4096), gpu_mod.limits_from_spec("h100_sxm"))


def test_an_unlisted_hopper_gpu_runs_the_wgmma_defaults():
    """A GPU the lab has no spec for but of compute capability 9.0 (an H20, an H800, an H100 NVL:
    `gpu=auto` names it unknown) has no table: the first default that builds there is the wgmma
    kernel, not mma.sync; the skinny kernel keeps its shapes for best_fp32."""
    hopper = {**gpu_mod.limits_from_spec("h100_sxm"), "sms": 78}
    square, skinny = _problem(4095, 4097, 333), _problem(7, 4096, 4096)
    choice = dispatch.choose(kernel_config("best_tf32"), "unknown", square, hopper)
    assert choice.kernel == "gemm_tf32"
    assert dispatch.choose(kernel_config("best_fp32"), "unknown", square, hopper).kernel == "gemm_3xtf32"
    assert dispatch.choose(kernel_config("best_fp32"), "unknown", skinny, hopper).kernel == "gemm_ffma_skinny"
    planned = autotune.planned(choice, kernel_config("best_tf32"), "unknown", square, None,
                               autotune.Settings.from_cfg(None), hopper)
    assert [c.kernel for c, _ in planned] == ["gemm_tf32", "gemm_mma_tf32", "17_flagship"]


def test_a_gpu_before_sm_80_runs_a_default_that_builds_there_or_is_refused_naming_the_rule(compose):
    """A Turing GPU (compute capability 7.5, no table): best_fp32 at a skinny shape runs
    gemm_ffma_skinny (no cp.async); best_tf32 has nothing there (mma.sync's TF32 and cp.async need
    sm_80): a one-paragraph refusal naming each default's rule, not a ptxas error."""
    turing = {**gpu_mod.limits_from_spec("a100"), "compute_capability": 75}
    fp32 = dispatch.choose(kernel_config("best_fp32"), "unknown", _problem(7, 4096, 4096), turing)
    assert fp32.kernel == "gemm_ffma_skinny"
    with pytest.raises(UnsupportedSize) as refused:
        dispatch.choose(kernel_config("best_tf32"), "unknown", _problem(4096, 4096, 4096), turing)
    text = str(refused.value)
    assert text.startswith("best_tf32 has no kernel for 4096x4096x4096 on this GPU (unknown)")
    assert "gemm_mma_tf32: `compute_capability >= 80`" in text and "17_flagship: `compute_capability >= 80`" in text
    assert "gemm_ffma_skinny: `min(m, n) <= 32`" in text and "\n" not in text


def test_suite_publication_from_recorded_h100_runs(tmp_path):
    metrics = publish(as_dispatched(tmp_path), tmp_path / "out", "h100_sxm")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["suite.csv", "suite.md", "suite.png",
                                                    "suite_metrics.json", "suite_wide.md"]
    table = pd.read_csv(out / "suite.csv")
    fp32 = table[table.kernel == "best_fp32"]
    assert len(fp32) == 48 and (fp32.status == "ok").all()
    # the geometric mean and the minimum, recomputed from the published ratios
    ratios = fp32.ratio.tolist()
    stats = metrics["h100_sxm"]["fp32"]["vs_default"]
    assert stats["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)), abs=1e-4)
    assert stats["min"] == min(ratios) and stats["min_shape"] == "4096x1x4096"
    # a ratio is the kernel's GFLOP/s over its paired baseline's, to rounding
    assert (abs(fp32.ratio - fp32.gflops / fp32.baseline_gflops) < 2e-3).all()
    # 20 refuses unaligned rows: those are failed shapes, with no ratio, counted as failed
    tf32 = table[table.kernel == "best_tf32"]
    refused = tf32[tf32.status != "ok"]
    assert len(refused) == metrics["h100_sxm"]["tf32"]["failed"] > 0
    assert refused.ratio.isna().all() and refused.gflops.isna().all()
    text = (out / "suite.md").read_text()
    maths = metrics["h100_sxm"]["fp32"]["by_math"]
    assert sum(m["shapes"] for m in maths.values()) == 48 and set(maths) <= {"ffma", "3xtf32"}
    assert set(table.loc[table.kernel == "best_fp32", "math"]) == set(maths)
    counts = ", ".join(f"{math_units.label(m)} {c['shapes']}" for m, c in maths.items())
    assert f"| fp32 | best_fp32 | 48 ({counts}) | 0 |" in text and "4096x1x4096" in text
    assert json.loads((out / "suite_metrics.json").read_text()) == metrics


def test_a_gpu_set_refuses_another_gpus_suite_runs(tmp_path):
    """The recorded H100 suite runs cannot become the H200's published suite: nothing is written."""
    out = tmp_path / "h200"
    with pytest.raises(ValueError, match=r"into results/h200/: it holds jobs measured on h100_sxm"):
        publish(as_dispatched(tmp_path), out, "h200")
    assert not out.exists() or not any(out.iterdir())


def test_summary_ignores_non_dispatching_kernels():
    frame = suite_frame(read_runs(EXPLORATION))
    assert frame.empty and summary(frame) == {}


def test_suite_rows_measured_through_an_earlier_dispatch_are_counted_and_listed(tmp_path, capsys):
    """RECORDED: the H200's published suite runs (results/h200/suite_runs.csv), every row measured
    through today's conf/tuned/h200.yaml (`earlier dispatch` 0). One TF32 row edited to record
    another tile, as if a re-fit had moved its choice since, and one FP32 row another kernel: each
    precision counts one row of an earlier dispatch (suite.md's column and suite_metrics.json),
    lists it with what today's dispatch runs, the published suite.csv names it in
    `dispatch_now`, and `python -m src.publish.dispatched` prints the two as sweeps."""
    from src.publish import dispatched

    recorded = ROOT / "results" / "h200" / "suite_runs.csv"
    runs = read_runs(recorded)
    metrics = publish(recorded, tmp_path / "today", "h200")["h200"]
    assert metrics["fp32"]["earlier_dispatch"] == metrics["tf32"]["earlier_dispatch"] == 0
    assert "measured through an earlier dispatch\n" not in (tmp_path / "today" / "suite.md").read_text()

    tf32 = runs[(runs.kernel == "best_tf32") & (runs.dispatched_to == "gemm_tf32")].index[0]
    params = json.loads(runs.at[tf32, "params"])
    params["stages"] = params["stages"] + 1
    runs.at[tf32, "params"] = json.dumps(params)
    fp32 = runs[(runs.kernel == "best_fp32") & (runs.dispatched_to == "gemm_3xtf32")].index[-1]
    runs.at[fp32, "dispatched_to"] = "gemm_ffma"
    edited = tmp_path / "runs.csv"
    runs.to_csv(edited, index=False)
    metrics = publish(edited, tmp_path / "h200", "h200")["h200"]
    assert metrics["fp32"]["earlier_dispatch"] == metrics["tf32"]["earlier_dispatch"] == 1
    assert json.loads((tmp_path / "h200" / "suite_metrics.json").read_text())["h200"] == metrics
    text = (tmp_path / "h200" / "suite.md").read_text()
    shape = lambda at: f"{runs.at[at, 'm']}x{runs.at[at, 'n']}x{runs.at[at, 'k']}"  # noqa: E731
    for kernel, at, now in (("best_tf32", tf32, "gemm_tf32 {"), ("best_fp32", fp32, "gemm_3xtf32 {")):
        section = text.split(f"## {kernel}: measured through an earlier dispatch")[1].split("\n## ")[0]
        line = next(x for x in section.splitlines() if f"| {shape(at)} |" in x)
        assert line.split(" | ")[-1].startswith(now)
    assert f"| {metrics['tf32']['shapes']} (" in text and " | 0 | 1 | " in text  # failed 0, earlier 1
    published = pd.read_csv(tmp_path / "h200" / "suite.csv")
    assert published.dispatch_now.notna().sum() == 2

    assert dispatched.main([str(edited), "--gpu", "h200"]) == 0
    printed = capsys.readouterr().out.split("\n")
    for kernel, at in (("best_fp32", fp32), ("best_tf32", tf32)):
        assert printed.count(f"{kernel} {shape(at)}") == 1
    # no file, or a GPU without a datasheet: a one-paragraph error naming the rule, nothing printed
    assert dispatched.main([str(tmp_path / "none.csv"), "--gpu", "h200"]) == 1
    out, err = capsys.readouterr()
    assert not out and "is not a file (rule:" in err
    assert dispatched.main([str(edited), "--gpu", "a100_made_up"]) == 1
    out, err = capsys.readouterr()
    assert not out and "names no GPU datasheet" in err and "h200" in err
