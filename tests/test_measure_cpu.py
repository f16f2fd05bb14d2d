"""The measure step's checks on CPU, with a NumPy stand-in for CuPy (tests/fake_cupy.py) and
Python kernels: an honest one passes with a paired figure; each class of cheating (less work
after the first launch, reusing the first result, changing after N launches) fails as
failed_timed_verification; the timed launches really are the ones checked."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from src.errors import TimedVerificationFailed
from src.job import gpu as gpu_mod
from src.job import measure as measure_mod
from src.job.measure import Baseline, verify_and_time
from src.job.prepare import Target, prepare_kernel
from src.job.problem import Problem
from src.job.protocol import BenchProtocol
from src.paths import CONF_DIR
from src.records.record import mark_failed, new_record
from tests import fake_cupy

DEVICE = gpu_mod.Device(name="stand-in", compute_capability="9.0", sms=132,
                        max_threads_per_block=1024, max_smem_per_block=232448, l2_bytes=50 << 20)


class Gemm:
    """C = alpha A B + beta C; `cheat(launch)` says how launch number `launch` (from 0) cheats:
    None (honest), "skip" (a quarter of K), "reuse" (writes nothing)."""

    def __init__(self, cheat=lambda launch: None):
        self.cheat, self.launches, self.report = cheat, 0, None

    def launch(self, a, b, c, alpha, beta):
        how = self.cheat(self.launches)
        self.launches += 1
        if how == "reuse":
            return
        k = a.shape[1] // 4 if how == "skip" else a.shape[1]
        product = (a[:, :k].astype(np.float64) @ b[:k].astype(np.float64)).astype(np.float32)
        c[...] = alpha * product + (beta * c if beta != 0.0 else 0.0)


def _job(beta: float, bench_overrides: dict | None = None):
    bench = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / "default.yaml"))
    # warm-up by count only: the tests below count launches (the timed warm-up: test_timing.py)
    bench.update(flush_l2=False, min_samples=12, max_samples=40, max_seconds=0.5, seed=7,
                 warmup_ms=0.0, **(bench_overrides or {}))
    kcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "01_naive.yaml"))
    where = Target(DEVICE, gpu_mod.limits_from_spec("h100_sxm"),
                   gpu_mod.spec_for_device_name("NVIDIA H100 80GB HBM3"))
    return prepare_kernel(kcfg, Problem(64, 48, 32, 1.5, beta), where,
                          BenchProtocol.from_config(bench))


def _run(monkeypatch, kernel, beta=0.0, baseline=True, stronger=None):
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(measure_mod, "compile_kernel", lambda spec, cache_dir=None: kernel)
    prepared = _job(beta)
    record = new_record("01_naive", "fp32", "nvrtc", vars(prepared.problem))
    paired = Baseline("cublas_fp32", Gemm(), 1e-5) if baseline else None
    try:
        verify_and_time(prepared, record, baseline=paired, stronger=stronger)
    except TimedVerificationFailed as exc:
        mark_failed(record, exc)
    return record


@pytest.mark.parametrize("beta", [0.0, 2.0])
def test_an_honest_kernel_passes_every_check_with_a_paired_figure(monkeypatch, beta):
    kernel = Gemm()
    r = _run(monkeypatch, kernel, beta)
    assert r.status == "ok", r.error
    assert max(r.rel_err, r.rel_err_timed, r.rel_err_fresh) <= r.tolerance
    assert 0 <= r.checked_sample < 12 and r.samples >= 12 and r.check_seconds >= 0
    assert r.baseline == "cublas_fp32" and len(r.kernel_time_ms) == len(r.baseline_time_ms)
    assert r.pct_of_cublas == pytest.approx(100 * r.gflops / r.baseline_gflops)
    assert r.pct_ci_low <= r.pct_of_cublas <= r.pct_ci_high
    assert r.timer == "events" and r.timer_resolution_ns == 500.0  # the interval is widened by it
    # launches: verify 1 + warm-up 3 + the timed samples + 1 on fresh inputs
    assert kernel.launches == 1 + 3 + r.samples + 1


@pytest.mark.parametrize("beta", [0.0, 2.0])
@pytest.mark.parametrize("cheat,caught_by", [
    (lambda n: "skip" if n >= 1 else None, "timed sample"),      # less work after the first
    (lambda n: "reuse" if n >= 1 else None, "timed sample"),     # keeps the first result
    (lambda n: "skip" if n >= 30 else None, "last timed launch"),  # changes after N launches
], ids=["skip-after-first", "reuse-result", "after-n-launches"])
def test_each_class_of_cheating_is_caught(monkeypatch, beta, cheat, caught_by):
    r = _run(monkeypatch, Gemm(cheat), beta)
    assert r.status == "failed_timed_verification", r.status
    assert caught_by in r.error and r.gflops is None and r.pct_of_cublas is None
    assert r.rel_err <= r.tolerance  # the first launch passed


class RightOnFirstInputs(Gemm):
    """Right on the inputs it first saw (all the timed launches), wrong on any others."""

    def launch(self, a, b, c, alpha, beta):
        self.first_a = getattr(self, "first_a", a)
        self.cheat = lambda n: None if a is self.first_a else "skip"
        super().launch(a, b, c, alpha, beta)


def test_a_kernel_right_only_on_the_inputs_it_was_timed_on_is_caught(monkeypatch):
    r = _run(monkeypatch, RightOnFirstInputs())
    assert r.status == "failed_timed_verification" and "fresh inputs" in r.error
    assert r.rel_err_fresh > r.tolerance and r.rel_err_timed <= r.tolerance


def test_without_a_baseline_the_kernel_is_timed_alone(monkeypatch):
    r = _run(monkeypatch, Gemm(), baseline=False)
    assert r.status == "ok" and r.gflops > 0 and r.pct_of_cublas is None and r.kernel_time_ms is None


class Slow(Gemm):
    def launch(self, a, b, c, alpha, beta):
        super().launch(a, b, c, alpha, beta)
        super().launch(a, b, c, alpha, beta)  # twice the work (beta = 0: the same C)


@pytest.mark.parametrize("stronger_kernel,best", [(Gemm(), None), (Slow(), "cublas_fp32")])
def test_the_stronger_of_two_baselines_is_the_one_compared(monkeypatch, stronger_kernel, best):
    stronger = Baseline("cublaslt_fp32_autotuned", stronger_kernel, 1e-5)
    r = _run(monkeypatch, Gemm(), stronger=stronger)
    assert r.status == "ok" and r.cublaslt_gflops > 0 and r.best_cublas in (
        "cublas_fp32", "cublaslt_fp32_autotuned")
    if best is not None:  # the autotuned one does twice the work: the default is stronger
        assert r.best_cublas == best and r.pct_of_best_cublas == pytest.approx(r.pct_of_cublas)
    assert r.pct_best_ci_low <= r.pct_of_best_cublas <= r.pct_best_ci_high


def test_without_nvmath_the_autotuned_baseline_is_missing_not_a_crash(monkeypatch):
    import sys

    from src.job.baselines import Baselines

    monkeypatch.setitem(sys.modules, "nvmath", None)  # import fails as if not installed
    assert Baselines().autotuned("fp32", _job(0.0)) is None


def test_the_power_cap_is_recorded_as_a_condition_of_an_ok_job(monkeypatch):
    """NVML says sw_power_cap all along (a heavy job's normal state): the job is ok, with the
    share of rounds under the cap and the reasons in its record."""
    from src.job.protocol import POWER_CAP

    monkeypatch.setattr(measure_mod, "throttle_mask", lambda device: POWER_CAP)
    r = _run(monkeypatch, Gemm())
    assert r.status == "ok" and r.power_capped_share == 1.0 and r.samples_slowdown == 0
    assert r.throttle_reasons == ["sw_power_cap"] and r.samples_throttled == 0


def test_time_each_times_every_launch_interleaved_and_restores_before_each_sample(monkeypatch):
    """How the autotuned cuBLASLt ranks its algorithms: each launch's median by the timing
    step's clock (here events on the host clock), `restore` run untimed before every sample."""
    import time

    fake_cupy.install(monkeypatch)
    restores = []
    launches = [lambda d=d: time.sleep(d) for d in (0.004, 0.001, 0.002)]
    times = measure_mod.time_each(launches, lambda: restores.append(1), _job(0.0).bench, DEVICE)
    assert len(times) == 3 and times[1] < times[2] < times[0]
    assert 0.8 <= times[1] and 3.5 <= times[0] < 40  # milliseconds
    rounds = measure_mod.RANK_WARMUP + measure_mod.RANK_SAMPLES
    assert len(restores) == 3 * rounds


class _DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data.ptr`, as AutotunedGemm keys its plan on the pointers."""

    @property
    def data(self):
        import types

        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _stand_in_nvmath(monkeypatch, count: int):
    """nvmath's Matmul as AutotunedGemm uses it, with `count` algorithms; it records which
    algorithm each execute() ran and computes C = alpha A B + beta C in place."""
    import sys
    import types

    class Matmul:
        made: list = []

        def __init__(self, a, b, c, alpha, beta, options):
            self.a, self.b, self.c, self.alpha, self.beta = a, b, c, alpha, beta
            self.ran, self.autotuned = [], False
            Matmul.made.append(self)

        def plan(self):
            self.algorithms = tuple(f"algorithm {i}" for i in range(count))

        def autotune(self, iterations):
            self.autotuned = True

        def execute(self, algorithm=None):
            self.ran.append(algorithm)
            self.c[...] = self.alpha * (self.a @ self.b) + self.beta * self.c

        def free(self):
            pass

    linalg = types.SimpleNamespace(ComputeType=types.SimpleNamespace(COMPUTE_32F=0, COMPUTE_32F_FAST_TF32=1))
    monkeypatch.setitem(sys.modules, "nvmath", types.ModuleType("nvmath"))
    monkeypatch.setitem(sys.modules, "nvmath.linalg", linalg)
    monkeypatch.setitem(sys.modules, "nvmath.linalg.advanced", types.SimpleNamespace(Matmul=Matmul))
    return Matmul


def test_the_autotuned_baseline_runs_the_algorithm_its_ranking_found_fastest(monkeypatch):
    from src.job.cublaslt import AutotunedGemm

    matmul = _stand_in_nvmath(monkeypatch, 3)
    rng = np.random.default_rng(3)
    a, b, c0 = (rng.uniform(-1, 1, s).view(_DevArray) for s in ((4, 5), (5, 6), (4, 6)))
    c = c0.copy().view(_DevArray)
    seen = []

    def rank(launches, restore):  # every algorithm launched (each overwrites C), then C restored
        for launch in launches:
            restore()
            launch()
            seen.append(c.copy())
        return [3.0, 1.0, 2.0]

    gemm = AutotunedGemm("fp32", rank)
    gemm.launch(a, b, c, 0.5, 3.0)
    mm = matmul.made[-1]
    np.testing.assert_allclose(c, 0.5 * (a @ b) + 3.0 * c0)  # one product: the ranking's undone
    assert mm.ran == ["algorithm 0", "algorithm 1", "algorithm 2", "algorithm 1"]
    assert gemm.algorithm_ms == [3.0, 1.0, 2.0] and not mm.autotuned  # never nvmath's own order
    assert all(np.allclose(s, 0.5 * (a @ b) + 3.0 * c0) for s in seen)  # restored each time
