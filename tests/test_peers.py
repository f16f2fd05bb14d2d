"""Peers (conf/kernel/triton_*.yaml, and best_*'s `peers`) on CPU: their configs compose into
Triton specs with the tolerance of their accuracy, a missing triton is a skipped row (and a
skipped comparison, never a failed best_* job), the strongest peer is the one compared with
its paired interval, a peer whose timed output is wrong is left out, and the tables show it."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError, PeerMissing
from src.job import gpu as gpu_mod
from src.job import measure as measure_mod
from src.job.baselines import Baselines
from src.job.compile import compile_kernel
from src.job.measure import Baseline, verify_and_time
from src.job.prepare import Target, prepare_kernel
from src.job.protocol import BenchProtocol
from src.job.problem import Problem
from src.job.spec import build_spec
from src.paths import CONF_DIR
from src.records.record import Record, new_record
from tests import fake_cupy
from tests.test_measure_cpu import DEVICE, Gemm, Slow

PEERS = {"triton_fp32": ("fp32", "ieee", "ffma"), "triton_tf32": ("tf32", "tf32", "tf32"),
         "triton_tf32x3": ("fp32", "tf32x3", "3xtf32")}
H100 = gpu_mod.limits_from_spec("h100_sxm")


def _bench(**overrides) -> BenchProtocol:
    bench = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench" / "default.yaml"))
    bench.update(flush_l2=False, min_samples=12, max_samples=40, max_seconds=0.5, seed=7,
                 warmup_ms=0.0, **overrides)
    return BenchProtocol.from_config(bench)


def _where() -> Target:
    return Target(DEVICE, H100, gpu_mod.spec_for_device_name("NVIDIA H100 80GB HBM3"))


@pytest.mark.parametrize("name", sorted(PEERS))
def test_a_peer_config_composes_into_a_triton_spec_with_its_accuracy(compose, name):
    precision, input_precision, math = PEERS[name]
    cfg = compose(f"kernel={name}", "size=1000")
    kcfg = OmegaConf.to_container(cfg.kernel, resolve=True)
    assert kcfg["backend"] == "triton" and kcfg["peer"] and kcfg["math"] == math
    spec = build_spec(kcfg, Problem(1000, 1000, 1000, 1.0, 0.0), H100)
    assert (spec.precision, spec.input_precision) == (precision, input_precision)
    assert input_precision in spec.entry and spec.source is None
    # the tolerance is its accuracy's: tf32x3 and ieee at FP32's, tf32 at TF32's
    assert cfg.bench.tolerance[spec.precision] == (1e-3 if name == "triton_tf32" else 1e-5)


def test_a_peer_with_an_unknown_input_precision_is_refused():
    cfg = {"name": "triton_x", "backend": "triton", "precision": "fp32", "input_precision": "bf16x9"}
    with pytest.raises(ConfigError, match="input_precision must be one of"):
        build_spec(cfg, Problem(64, 64, 64, 1.0, 0.0), H100)


def test_the_dispatchers_list_peers_of_their_accuracy(compose):
    fp32 = compose("kernel=best_fp32").kernel
    tf32 = compose("kernel=best_tf32").kernel
    assert {compose(f"kernel={p}").kernel.precision for p in fp32.peers} == {"fp32"}
    assert list(tf32.peers) == ["triton_tf32"]
    assert {p.name for p in fp32.peers_not_built} == {"cublas_fp32_emulated"}
    prepared = prepare_kernel(OmegaConf.to_container(fp32, resolve=True),
                              Problem(4096, 4096, 4096, 1.0, 0.0), _where(), _bench())
    assert prepared.peers == ("triton_tf32x3", "triton_fp32", "cutlass_3xtf32")
    assert any(line.startswith("cublas_fp32_emulated: ") for line in prepared.peers_not_built)


def _without_peer_packages(monkeypatch):
    for name in ("triton", "torch", "src.job.triton_matmul", "cutlass_library"):
        monkeypatch.setitem(sys.modules, name, None)  # import (or the header lookup) fails


def test_without_triton_a_peer_is_skipped_with_the_extra_to_install(monkeypatch):
    _without_peer_packages(monkeypatch)
    spec = build_spec({"name": "triton_tf32x3", "backend": "triton", "precision": "fp32",
                       "input_precision": "tf32x3"}, Problem(64, 64, 64, 1.0, 0.0), H100)
    with pytest.raises(PeerMissing) as raised:
        compile_kernel(spec)
    assert raised.value.status == "skipped_missing_peer"
    assert ".[peers]" in str(raised.value) and "triton_tf32x3" in str(raised.value)


def test_without_the_peers_best_fp32_is_measured_and_says_which_were_skipped(monkeypatch):
    """The peers' packages (triton, torch, nvidia-cutlass) are missing: the dispatch job is still
    paired with cuBLAS, and its record lists the skipped peers (with the not-built one) and has
    no peer figure."""
    _without_peer_packages(monkeypatch)
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(measure_mod, "compile_kernel", lambda spec, cache_dir=None: Gemm())
    baselines = Baselines()
    monkeypatch.setattr(baselines, "paired", lambda name, job: Baseline(name, Gemm(), 1e-5))
    kcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "best_fp32.yaml"))
    prepared = prepare_kernel(kcfg, Problem(64, 48, 32, 1.0, 0.0), _where(), _bench())
    record = new_record("best_fp32", "fp32", "dispatch", vars(prepared.problem))
    measure_mod.measure(prepared, baselines, record)
    assert record.status == "ok" and record.pct_of_cublas > 0
    assert record.peer_name is None and record.pct_of_peer is None
    skipped = {line.split(":")[0]: line for line in record.peers_skipped}
    assert set(skipped) == {"triton_tf32x3", "triton_fp32", "cutlass_3xtf32", "cublas_fp32_emulated"}
    assert "skipped_missing_peer" in skipped["triton_fp32"]
    assert "skipped_missing_peer" in skipped["cutlass_3xtf32"]
    assert "nvidia-cutlass" in skipped["cutlass_3xtf32"]


class Tuned(Gemm):
    """A stand-in Triton peer: right, and with the `tuning` a first launch leaves."""

    def __init__(self, seconds: float, config: str, slow: bool = False, reused: bool = False):
        super().__init__()
        from src.job.recording import Tuning

        self.tuning, self.slow = Tuning(seconds, config, reused), slow

    def launch(self, a, b, c, alpha, beta):
        super().launch(a, b, c, alpha, beta)
        if self.slow:  # twice the work: beta = 0, so C is the same
            super().launch(a, b, c, alpha, beta)


def _run_with_peers(monkeypatch, peers):
    fake_cupy.install(monkeypatch)
    monkeypatch.setattr(measure_mod, "compile_kernel", lambda spec, cache_dir=None: Gemm())
    kcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / "01_naive.yaml"))
    prepared = prepare_kernel(kcfg, Problem(64, 48, 32, 1.0, 0.0), _where(), _bench())
    record = new_record("best_fp32", "fp32", "dispatch", vars(prepared.problem))
    verify_and_time(prepared, record, baseline=Baseline("cublas_fp32", Gemm(), 1e-5),
                    peers=tuple(peers))
    return record


def test_the_strongest_peer_is_compared_with_its_paired_interval(monkeypatch):
    """Two peers in the same rounds: the faster one (the other does twice the work) is the one
    compared; % is the ratio of the medians and lies in its interval; its autotune is kept."""
    fast = Baseline("triton_tf32x3", Tuned(2.5, "BLOCK_M: 128"), 1e-5)
    slow = Baseline("triton_fp32", Tuned(9.0, "BLOCK_M: 64", slow=True), 1e-5)
    r = _run_with_peers(monkeypatch, [slow, fast])
    assert r.status == "ok" and r.peer_name == "triton_tf32x3"
    assert r.pct_of_peer == pytest.approx(100 * r.gflops / r.peer_gflops)
    assert r.pct_peer_ci_low <= r.pct_of_peer <= r.pct_peer_ci_high
    assert r.verdict_peer in ("faster", "slower", "tie")
    assert (r.peer_compile_s, r.peer_config, r.peer_setup_reused) == (2.5, "BLOCK_M: 128", False)
    # the cuBLAS comparison is untouched by the peer arms: arm 1 is still cuBLAS
    assert r.baseline == "cublas_fp32" and r.best_cublas == "cublas_fp32"
    assert r.pct_of_best_cublas == pytest.approx(r.pct_of_cublas)


def test_a_peer_setup_another_process_did_is_recorded_as_reused_with_its_seconds(monkeypatch):
    """Another GPU's slot autotuned this shape (src/job/triton_tuning.py): the record keeps that
    autotune's seconds and config and says it was reused."""
    peer = Baseline("triton_tf32x3", Tuned(7.5, "BLOCK_M: 128", reused=True), 1e-5)
    r = _run_with_peers(monkeypatch, [peer])
    assert r.status == "ok" and r.peer_name == "triton_tf32x3"
    assert (r.peer_compile_s, r.peer_config, r.peer_setup_reused) == (7.5, "BLOCK_M: 128", True)


class WrongWhenTimed(Gemm):
    """Right at its first launch (its check), wrong at every later one (its timed launches)."""

    def launch(self, a, b, c, alpha, beta):
        first = self.launches == 0
        super().launch(a, b, c, alpha, beta)
        if not first:
            c[...] *= 1.01


def test_a_peer_whose_timed_output_is_wrong_is_left_out(monkeypatch):
    good = Baseline("triton_fp32", Tuned(1.0, "BLOCK_M: 64", slow=True), 1e-5)
    wrong = Baseline("triton_tf32x3", WrongWhenTimed(), 1e-5)
    r = _run_with_peers(monkeypatch, [wrong, good])
    assert r.status == "ok" and r.peer_name == "triton_fp32"
    assert any(line.startswith("triton_tf32x3: failed_timed_verification") for line in r.peers_skipped)


def _peer_record(kernel: str, size: int, pct: float, verdict: str) -> Record:
    r = Record(kernel=kernel, precision="fp32", backend="dispatch", m=size, n=size, k=size,
               alpha=1.0, beta=0.0, gflops=50000.0, time_ms_median=1.0, rel_err=1e-7,
               baseline="cublas_fp32", baseline_gflops=25000.0, pct_of_cublas=200.0,
               pct_ci_low=198.0, pct_ci_high=202.0, verdict="faster", gpu="NVIDIA H100 80GB HBM3",
               gpu_spec="h100_sxm", dispatched_to="gemm_3xtf32", math="3xtf32", replicate=1,
               timestamp="2026-11-26T00:00:00+00:00")
    r.peer_name, r.peer_gflops, r.pct_of_peer = "triton_tf32x3", 50000.0 * 100 / pct, pct
    r.pct_peer_ci_low, r.pct_peer_ci_high, r.verdict_peer = pct - 2, pct + 2, verdict
    r.peers_skipped = ["cutlass_3xtf32: not built"]
    return r


def test_the_progression_shows_best_against_the_strongest_peer(tmp_path):
    from src.publish.table import PEER_COLUMNS, published_columns, progression_frame, markdown
    from src.records.collect import read_runs, write_runs

    records = [_peer_record("best_fp32", 4096, 120.0, "faster"),
               _peer_record("best_fp32", 8192, 90.0, "slower")]
    write_runs([(f"j{i}", r) for i, r in enumerate(records)], tmp_path / "runs.csv")
    runs = read_runs(tmp_path / "runs.csv")
    frame = progression_frame(records)
    assert published_columns(frame)[-len(PEER_COLUMNS):] == PEER_COLUMNS
    text = markdown(records, runs, None)
    assert "| best_fp32 | 120.0% of 41,667 [118.0, 122.0] faster (triton_tf32x3) | " \
           "90.0% of 55,556 [88.0, 92.0] slower (triton_tf32x3) |" in text
    assert "- cutlass_3xtf32: not built" in text
    without = progression_frame([Record(kernel="01_naive", precision="fp32", backend="nvrtc", m=64,
                                        n=64, k=64, alpha=1.0, beta=0.0, gflops=1.0)])
    assert not set(PEER_COLUMNS) & set(published_columns(without))


def test_the_suite_shows_the_ratio_to_the_strongest_peer(tmp_path):
    from src.publish import suite
    from src.records.collect import read_runs, write_runs

    records = [_peer_record("best_fp32", 4096, 125.0, "faster"),
               _peer_record("best_fp32", 8192, 80.0, "slower")]
    write_runs([(f"j{i}", r) for i, r in enumerate(records)], tmp_path / "runs.csv")
    frame = suite.suite_frame(read_runs(tmp_path / "runs.csv"))
    assert suite.has_peers(frame) and list(frame.ratio_peer) == [1.25, 0.8]
    stats = suite.summary(frame)["fp32"]["vs_peer"]
    assert stats["geomean"] == pytest.approx((1.25 * 0.8) ** 0.5, abs=1e-4) and stats["min"] == 0.8
    text = suite.markdown(frame.drop(columns="gpu_spec"), "h100_sxm", ["H100"])
    assert "geomean / min vs strongest peer" in text and "0.800 slower (triton_tf32x3)" in text
    assert "(below 1.0: the peer is faster)" not in text  # geomean 1.0: not below
