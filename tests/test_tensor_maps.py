"""Tensor maps (src/job/tensor_maps.py): a chapter's launch.tensor_maps become checked specs with
their boxes evaluated against the parameters; the TMA's rules are refused before compiling.
Encoding needs the driver and runs in the GPU tests (tests/test_gpu.py, chapter 20)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.spec import build_spec
from src.job.tensor_maps import TensorMapSpec, check
from tests.conftest import CONF_DIR

H100 = limits_from_spec("h100_sxm")


def chapter20(**params) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "20_wgmma_tf32.yaml"))
    cfg["params"].update(params)
    return cfg


@pytest.mark.parametrize("bm", [128, 256])
def test_boxes_follow_the_parameters(bm):
    spec = build_spec(chapter20(bm=bm), Problem(1000, 1032, 260, 1, 0), H100)
    a, b = spec.tensor_maps
    assert (a.matrix, a.box, a.swizzle, a.element) == ("a", (32, bm), 128, "tf32")
    assert (b.matrix, b.box, b.swizzle, b.element) == ("b", (32, 32), 128, "f32")
    # edge tiles are launched, not refused: the TMA fills outside the matrix with zeros
    assert spec.grid == (-(-1000 // bm) * -(-1032 // 128),)
    assert spec.block == (384,) and spec.derived["accumulators"] == bm // 2


def test_chapters_without_tensor_maps_have_none():
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "19_mma_tf32.yaml"))
    spec = build_spec(cfg, Problem(4096, 4096, 4096, 1, 0), H100)
    assert spec.tensor_maps == () and spec.arch is None


@pytest.mark.parametrize("bad,rule", [
    (TensorMapSpec("c", (32, 32), 128), "names an input"),
    (TensorMapSpec("a", (32, 32), 128, "f16"), "TMA element type"),
    (TensorMapSpec("a", (32, 32), 96), "swizzles 32, 64 or 128"),
    (TensorMapSpec("a", (32, 512), 128), "at most 256 elements"),
    (TensorMapSpec("a", (2, 32), 0), "16-byte chunks"),
    (TensorMapSpec("a", (64, 32), 128), "inner box bytes <= swizzle bytes"),
])
def test_tma_rules_are_refused_with_their_rule(bad, rule):
    with pytest.raises(ConfigError, match=rule):
        check((bad,), "20_wgmma_tf32")


def test_a_valid_map_passes():
    check((TensorMapSpec("a", (32, 256), 128, "tf32"), TensorMapSpec("b", (4, 8), 0)), "k")


def test_a_box_needs_two_dimensions():
    cfg = chapter20()
    cfg["launch"]["tensor_maps"][0]["box"] = [32]
    with pytest.raises(ConfigError, match="2-element box"):
        build_spec(cfg, Problem(4096, 4096, 4096, 1, 0), H100)
