"""Kernels that cheat after their first launch (tests/kernels/cheat.cu) and figures beyond the
GPU's ceiling: each is caught with its own status and has no figure anywhere (console, record,
MLflow, summary, published table). The NVRTC build runs on CPU; the rest needs a GPU."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from src.job.compile import expand_source
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.conftest import ROOT, SHAPE_LIMITED
from tests.test_compile import H100, needs_nvrtc

TEST_CONF = ROOT / "tests" / "conf"
CHEATS = {  # kernel -> which check catches it
    "cheat_skip_after_first": "failed_timed_verification",
    "cheat_reuse_result": "failed_timed_verification",
    "cheat_after_n_launches": "failed_timed_verification",
}
HEALTHY = ("06_vectorize", "cublas_fp32")


def _spec(name: str):
    cfg = OmegaConf.to_container(OmegaConf.load(TEST_CONF / "kernel" / f"{name}.yaml"))
    return build_spec(cfg, Problem(1024, 1024, 1024, 1.0, 0.0), H100)


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheating_kernels_build_with_nvrtc(tmp_path, name):
    from src.job.compile import build_cubin

    spec = _spec(name)
    cubin = build_cubin(expand_source(spec.source), spec.entry, "sm_90", tmp_path, spec.name)
    assert open(cubin.path, "rb").read()[:4] == b"\x7fELF"


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("beta", ["0.0", "2.0"])
def test_cheating_kernels_are_caught_and_never_published(tmp_path, tracking_uri, beta):
    from src.publish.table import progression_frame
    from src.records.record import Record
    from tests.test_cli import run_cli, tracked_runs

    kernels = [*CHEATS, *HEALTHY]
    proc = run_cli(tmp_path, "-m", "hydra.searchpath=[file://tests/conf]",
                   "kernel=" + ",".join(kernels), "size=1024", f"beta={beta}", "bench=quick",
                   MLFLOW_TRACKING_URI=tracking_uri)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    records = {r.kernel: r for r in (Record.from_dict(json.loads(p.read_text()))
                                     for p in (tmp_path / "sweep").glob("*/record.json"))}
    assert {k: r.status for k, r in records.items()} == {**CHEATS, **{k: "ok" for k in HEALTHY}}
    for name in CHEATS:
        r = records[name]
        assert r.gflops is None and r.pct_of_cublas is None and r.baseline_gflops is None
        assert r.rel_err <= r.tolerance  # its first launch passed: only the new checks catch it
        assert "timed" in r.error or "fresh inputs" in r.error, r.error
        lines = [line for line in output.splitlines() if name in line]
        assert any(r.status.upper() in line for line in lines), output
        assert not any("GFLOP/s" in line for line in lines)
    good = records["06_vectorize"]
    assert good.rel_err_timed <= good.tolerance and good.rel_err_fresh <= good.tolerance
    assert good.checked_sample is not None and good.baseline == "cublas_fp32"
    assert good.pct_ci_low <= good.pct_of_cublas <= good.pct_ci_high
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "failed_timed_verification" in summary
    frame = progression_frame(list(records.values()))
    assert frame[frame.kernel.isin(list(CHEATS))].gflops.isna().all()
    _, jobs = tracked_runs(tracking_uri)
    for job in jobs:
        if job.data.params["kernel"] in CHEATS:
            assert job.info.status == "FAILED" and "gflops" not in job.data.metrics
            assert job.data.tags["status"] == "failed_timed_verification"


@pytest.mark.gpu
@pytest.mark.smoke
def test_a_figure_above_the_ceiling_is_implausible_and_never_published(compose, monkeypatch):
    """A healthy kernel against a ceiling set far below it (a stand-in for a kernel that fools
    the timing): failed_implausible, no figure in the record or the table."""
    from src.job import plausibility
    from src.job.pipeline import run_job
    from src.publish.table import progression_frame

    monkeypatch.setattr(plausibility, "load_measured",
                        lambda name, path=None: {"measured": True, "ffma_gflops": 100.0})
    record = run_job(compose("kernel=06_vectorize", "size=1024", "bench=quick"))
    assert record.status == "failed_implausible", record.error
    assert "measured FFMA throughput: 100 GFLOP/s" in record.error
    assert record.gflops is None and record.pct_of_cublas is None
    assert "GFLOP/s" not in record.console_line().split("FAILED_IMPLAUSIBLE")[0]
    assert progression_frame([record]).gflops.isna().all()


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("kernel", ["06_vectorize", "22_ffma_warp_specialized", "20_wgmma_tf32",
                                    "gemm_3xtf32", "gemm_ffma_skinny", "gemm_tf32",
                                    "cublas_tf32"])
def test_healthy_kernels_pass_every_check(compose, kernel):
    from src.job.pipeline import run_job

    shape = "shape=1024x8x1024" if kernel in SHAPE_LIMITED else "size=1024"  # skinny: few columns
    record = run_job(compose(f"kernel={kernel}", shape))
    assert record.status == "ok", record.error
    assert max(record.rel_err, record.rel_err_timed, record.rel_err_fresh) <= record.tolerance
    assert record.pct_of_cublas is not None and record.verdict in ("faster", "slower", "tie")
    assert record.pct_of_cublas == pytest.approx(100 * record.gflops / record.baseline_gflops)
    assert record.samples >= 20 and record.check_seconds < 2.0
    if kernel.startswith("cublas"):
        assert record.pct_of_cublas == 100.0
