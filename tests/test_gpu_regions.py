"""Where the tuner measures a candidate on a GPU without the sm_90a kernels (src/tune/gpu_regions.py):
a `measured_where` region drawn `beside` kernels that do not build there is dropped, so an A100's
tune measures its tensor-core kernels at every shape they build at. On the CPU: plans and fit
guards only, no GPU figure."""

from __future__ import annotations

import pytest

from src.errors import ConfigError
from src.tune import distribution, gpu_regions, refit
from src.tune import plan as plan_mod
from src.tune.fit import holds
from src.job.gpu import limits_from_spec

BESIDE_WGMMA = {"gemm_ffma", "gemm_mma_tf32", "gemm_mma_3xtf32"}  # regions drawn around gemm_tf32 / gemm_3xtf32


@pytest.mark.parametrize("gpu", ["h100_sxm", "h200", "gh200", "h100_pcie"])
def test_a_hopper_gpu_keeps_every_region(gpu):
    settings = plan_mod.load_settings()
    assert gpu_regions.on_gpu(settings, gpu) is settings


@pytest.mark.parametrize("gpu", ["a100", "a6000", "rtx4090"])
def test_off_hopper_the_regions_beside_the_wgmma_kernels_are_dropped(gpu):
    settings = plan_mod.load_settings()
    assert {k for k, v in settings["measured_where"].items() if v.get("beside")} == BESIDE_WGMMA
    here = gpu_regions.on_gpu(settings, gpu)
    assert set(here["measured_where"]) == set(settings["measured_where"]) - BESIDE_WGMMA
    assert not gpu_regions.runs_on("gemm_tf32", limits_from_spec(gpu))
    assert gpu_regions.runs_on("gemm_mma_tf32", limits_from_spec(gpu))
    assert settings["measured_where"].keys() >= BESIDE_WGMMA  # the loaded settings are not changed
    # the fit's guards follow: gemm_mma_tf32 only outside the reserved matrix-vector region there
    assert refit.guards(here)["gemm_mma_tf32"] == "not (min(m, n) <= 2)"
    assert "min(m, n) <= 96" in refit.guards(settings)["gemm_mma_tf32"]


def test_an_a100_tune_measures_the_tensor_core_kernels_at_large_aligned_shapes():
    """On an H100, gemm_mma_tf32 is measured only at narrow, small or unaligned training shapes
    (beside gemm_tf32); on an A100 also at the large aligned ones, where it is the only TF32
    tensor-core candidate that builds."""
    shapes = distribution.stratified(distribution.training(), 40)
    big = [s.dims for s in shapes if min(s.dims[:2]) > 96 and s.dims[0] * s.dims[1] * s.dims[2] > 2 ** 32
           and s.dims[1] % 4 == 0 and s.dims[2] % 4 == 0]
    assert big

    def measured(gpu: str, kernel: str) -> set:
        plan = plan_mod.build(gpu, shapes, plan_mod.load_settings())
        return {s.dims for sw in plan.sweeps + plan.stage2 + plan.stage3 if sw.kernel == kernel
                for s in sw.covered}

    assert not set(big) & measured("h100_sxm", "gemm_mma_tf32")
    assert set(big) <= measured("a100", "gemm_mma_tf32")
    assert set(big) <= measured("a100", "gemm_mma_3xtf32")
    assert not measured("a100", "gemm_tf32")  # sm_90a: builds nowhere on an A100


def test_a_bad_beside_is_refused_naming_the_rule():
    settings = plan_mod.load_settings()
    bad = {**settings, "measured_where": {**settings["measured_where"],
                                          "gemm_ffma": {"when": "True", "beside": "gemm_tf32", "why": "x"}}}
    with pytest.raises(ConfigError, match="rule: `beside` lists the kernels"):
        gpu_regions.on_gpu(bad, "a100")


def test_the_regions_kept_hold_as_before():
    """What stays on an A100 (gemm_ffma_narrow's own region) is the same `when`."""
    settings = plan_mod.load_settings()
    here = gpu_regions.on_gpu(settings, "a100")
    narrow = here["measured_where"]["gemm_ffma_narrow"]["when"]
    assert narrow == settings["measured_where"]["gemm_ffma_narrow"]["when"]
    assert holds(narrow, (14792, 10, 3067)) and not holds(narrow, (4096, 4096, 4096))
