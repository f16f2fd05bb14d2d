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
    (TensorMapSpec("workspace", (32, 32), 128), "exactly when matrix is workspace"),
    (TensorMapSpec("a", (32, 32), 128, "f32", (0, 8, 8, 8)), "exactly when matrix is workspace"),
    (TensorMapSpec("workspace", (32, 32), 128, "f32", (8, 8, 8, 8)), "16-byte aligned offset"),
    (TensorMapSpec("workspace", (32, 32), 128, "f32", (0, 8, 6, 6)), "row stride of whole 16-byte"),
    (TensorMapSpec("workspace", (32, 32), 128, "f32", (0, 8, 9, 8)), "1..stride columns"),
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


def chapter23() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "23_wgmma_3xtf32.yaml"))


@pytest.mark.parametrize("shape", [(1000, 1032, 260), (1000, 1030, 259), (1, 1, 1)])
def test_3xtf32_maps_read_the_workspace_regions(shape):
    """23's A_big and A_small are workspace regions with padded rows that stop at k (the TMA
    zero-fills beyond); B is read in place when its rows are 16-byte aligned, else its copy."""
    m, n, k = shape
    spec = build_spec(chapter23(), Problem(m, n, k, 1, 0), H100)
    big, small, b = spec.tensor_maps
    k_pad, n_pad = -(-k // 4) * 4, -(-n // 4) * 4
    assert (big.matrix, big.region, big.box) == ("workspace", (0, m, k, k_pad), (32, 128))
    assert (small.matrix, small.region) == ("workspace", (4 * m * k_pad, m, k, k_pad))
    if n % 4 == 0:
        assert (b.matrix, b.region) == ("b", None)
    else:
        assert (b.matrix, b.region) == ("workspace", (8 * m * k_pad, k, n, n_pad))
        assert spec.workspace_bytes == 4 * (2 * m * k_pad + k * n_pad)
    assert all(tm.element == "f32" and tm.swizzle == 128 for tm in spec.tensor_maps)
