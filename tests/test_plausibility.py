"""Plausibility (src/job/plausibility.py) against the ceilings recorded on an H100 SXM
(results/ceilings.json) and its datasheet, and the protocol checks (src/job/protocol.py)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError, Implausible
from src.job import gpu as gpu_mod
from src.job import plausibility
from src.job.measure import SpotCheck
from src.job.problem import Problem
from src.job.protocol import BenchProtocol, check_bench, reason_names
from src.paths import CONF_DIR, ROOT
from src.records.collect import read_runs, records_from_runs
from tests.conftest import DATA_DIR

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def h100():
    return gpu_mod.spec_for_device_name(H100)


@pytest.fixture
def measured():
    data = plausibility.load_measured(H100, ROOT / "results" / "h100_sxm" / "ceilings.json")
    assert data is not None and data["ffma_gflops"] > 0
    return data


def _time_ms(problem: Problem, gflops: float) -> float:
    return problem.flops / (gflops * 1e9) * 1e3


def test_the_published_cheater_is_implausible(h100, measured):
    """The kernel that skipped work after its first launch was published at 275 TFLOP/s FP32."""
    problem = Problem(4096, 4096, 4096, 1.0, 0.0)
    bound = plausibility.ceiling("fp32", None, h100, measured)
    assert bound.math_source == "measured FFMA throughput"
    with pytest.raises(Implausible, match="ceiling for its math") as err:
        plausibility.check("cheat", problem, _time_ms(problem, 275_000), bound)
    assert err.value.status == "failed_implausible"


def test_every_recorded_h100_result_is_plausible(h100, measured):
    """The jobs of the published sweep (results/runs.csv), each against the ceiling of the math
    that ran: the chapter's own, or for best_* the chosen library kernel's (dispatched_to)."""
    records = [r for r in records_from_runs(read_runs(ROOT / "results" / "h100_sxm" / "runs.csv")) if r.ok]
    assert len(records) > 50 and any(r.dispatched_to for r in records)
    for r in records:
        path = CONF_DIR / "kernel" / f"{r.dispatched_to or r.kernel}.yaml"
        math = OmegaConf.load(path).get("math") if path.exists() else None
        bound = plausibility.ceiling(r.precision, math, h100, measured)
        plausibility.check(r.kernel, Problem(r.m, r.n, r.k, r.alpha, r.beta), r.time_ms_median,
                           bound)


def test_tf32_is_bounded_by_the_tensor_peak_and_3xtf32_by_a_third(h100, measured):
    problem = Problem(8192, 8192, 8192, 1.0, 0.0)
    tf32 = plausibility.ceiling("tf32", None, h100, measured)
    assert tf32.math_gflops == pytest.approx(494_700)
    plausibility.check("ok", problem, _time_ms(problem, 400_000), tf32)  # cuBLAS TF32's level
    with pytest.raises(Implausible):
        plausibility.check("too fast", problem, _time_ms(problem, 600_000), tf32)
    three = plausibility.ceiling("fp32", "3xtf32", h100, measured)
    assert three.math_gflops == pytest.approx(494_700 / 3)
    plausibility.check("3xtf32", problem, _time_ms(problem, 120_000), three)  # beats FFMA


def test_a_kernel_faster_than_its_bytes_can_move_is_implausible(h100, measured):
    problem = Problem(4096, 4096, 8, 1.0, 2.0)  # K = 8: C (read and written) is most of the bytes
    bound = plausibility.ceiling("fp32", None, h100, measured)
    floor_ms = plausibility.bytes_moved(problem) / (3350e9) * 1e3
    plausibility.check("ok", problem, 1.2 * floor_ms, bound)
    with pytest.raises(Implausible, match="cross from device memory"):
        plausibility.check("cheat", problem, 0.5 * floor_ms, bound)
    # without the flush the inputs may come from L2: no memory floor
    plausibility.check("unflushed", problem, 0.5 * floor_ms, bound, l2_flushed=False)


def test_without_measured_ceilings_the_datasheet_bounds_fp32(h100):
    assert plausibility.load_measured(H100, DATA_DIR / "ceilings_fixture_not_measured.json") is None
    assert plausibility.load_measured("another GPU", ROOT / "results" / "h100_sxm" / "ceilings.json") is None
    bound = plausibility.ceiling("fp32", None, h100, None)
    assert bound.math_gflops == pytest.approx(66_900) and bound.math_source == "datasheet FP32 peak"


@pytest.mark.parametrize("key,value,rule", [
    ("min_samples", 0, "integer >= 1"), ("min_samples", 2.5, "integer >= 1"),
    ("warmup", -1, "integer >= 0"), ("max_samples", True, "integer >= 1"),
    ("max_seconds", float("inf"), "finite"), ("max_seconds", float("nan"), "finite"),
    ("target_rel_iqr", 0, "> 0"), ("plausibility_margin", 0.9, ">= 1"),
    ("short_min_samples", 0, "integer >= 1"), ("warmup_ms", -1.0, "number >= 0"),
    ("warmup_ms", float("inf"), "finite"), ("throttle_threshold", 5, r"in \(0, 1\]"),
    ("throttle_threshold", 0, r"in \(0, 1\]"), ("flush_l2", "maybe", "true or false"),
    ("flush_l2", 1, "true or false"), ("best_cublas", "yes", "true or false"),
    ("seed", -1, "integer >= 0"), ("seed", 1.5, "integer >= 0"),
    ("tolerance.fp32", float("inf"), "finite number > 0"),
    ("tolerance.fp32", float("nan"), "finite number > 0"),
    ("tolerance.fp32", -1, "finite number > 0"), ("tolerance.tf32", 0, "finite number > 0"),
    ("tolerance.tf32", "1e-3", "finite number > 0"), ("tolerance.fp32", None, "finite number > 0")])
def test_protocol_values_that_break_their_rule_are_refused(key, value, rule):
    bench = dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / "default.yaml")))
    check_bench(bench)  # the published protocol passes
    check_bench({**bench, "throttle_threshold": 1.0, "seed": 7})  # the ends of the ranges pass
    if key.startswith("tolerance."):
        bench["tolerance"] = {**bench["tolerance"], key.split(".")[1]: value}
    else:
        bench[key] = value
    with pytest.raises(ConfigError, match=rule) as err:
        check_bench(bench)
    assert f"bench.{key}" in str(err.value)
    with pytest.raises(ConfigError, match=rule):  # the typed protocol is built through the check
        BenchProtocol.from_config(bench)


def test_the_protocol_is_a_typed_frozen_object_that_keeps_its_configured_values():
    """What measure reads by attribute, with the defaults of keys a protocol leaves out; the
    configured mapping (the measurement cache's key) as given."""
    import dataclasses

    bench = dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / "quick.yaml")))
    bench = {**dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / "default.yaml"))),
             **{k: v for k, v in bench.items() if k != "defaults"}}
    protocol = BenchProtocol.from_config(bench)
    assert (protocol.warmup, protocol.min_samples, protocol.max_samples) == (1, 5, 20)
    assert protocol.max_seconds == 0.5 and protocol.warmup_ms == 0.0 and protocol.timer == "cupti"
    assert protocol.tolerance["fp32"] == 1.0e-5 and protocol.flush_l2 is True
    assert dict(protocol.settings) == bench
    with pytest.raises(dataclasses.FrozenInstanceError):
        protocol.min_samples = 1
    sparse = BenchProtocol.from_config({k: v for k, v in bench.items()
                                        if k not in ("warmup_ms", "timer", "flush_l2", "best_cublas")})
    assert (sparse.warmup_ms, sparse.timer, sparse.flush_l2, sparse.best_cublas) == (0.0, "cupti", True, False)


def test_throttle_reason_bits_are_named():
    assert reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert reason_names(0x1) == []  # idle is not a throttle


class _Inputs:
    def __init__(self):
        self.c = np.ones(4, dtype=np.float32)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_spot_check_poisons_c_before_its_sample_and_keeps_the_output_after(beta):
    inputs = _Inputs()
    spot = SpotCheck(inputs, beta, samples=20)
    assert 0 <= spot.index < 20
    for i in range(20):
        spot.before(i)
        if i == spot.index:
            assert np.isnan(inputs.c).all() == (beta == 0.0)  # beta != 0: C0 is restored anyway
            inputs.c[:2] = 7.0  # the "kernel" writes half of C
        spot.after(i)
    assert spot.snapshot[:2].tolist() == [7.0, 7.0]
    assert np.isnan(spot.snapshot[2:]).all() == (beta == 0.0)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_alpha_and_beta_must_be_finite(name, value):
    from src.errors import InvalidProblem

    cfg = {"m": 8, "n": 8, "k": 8, "alpha": 1.0, "beta": 0.0, name: value}
    with pytest.raises(InvalidProblem, match=f"rule: {name} finite"):
        Problem.from_cfg(cfg)
