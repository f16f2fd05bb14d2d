"""A sweep that survives its worst kernels, on a GPU: the test-only kernels in tests/kernels/
(an out-of-bounds writer, an infinite loop, a wrong answer) swept between two good kernels.
The good ones finish verified; each bad one is recorded with its own cause; MLflow has a
FAILED run with the error for each and nothing left RUNNING; the summary lists them all."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import run_cli, tracked_runs

EXPECTED = {
    "broken_out_of_bounds": "failed_launch",
    "01_naive": "ok",
    "broken_infinite_loop": "failed_timeout",
    "06_vectorize": "ok",
    "broken_wrong_values": "failed_verification",
}


@pytest.mark.gpu
def test_good_kernels_survive_broken_ones_in_one_sweep(tmp_path, tracking_uri):
    proc = run_cli(tmp_path, "-m", "hydra.searchpath=[file://tests/conf]",
                   "kernel=" + ",".join(EXPECTED), "size=512", "bench=quick",
                   "isolation.timeout_s=15", MLFLOW_TRACKING_URI=tracking_uri)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["kernel"]: r for r in
               (json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/record.json"))}
    assert {name: r["status"] for name, r in records.items()} == EXPECTED, records
    for name, r in records.items():
        if r["status"] == "ok":
            assert r["rel_err"] <= r["tolerance"] and r["gflops"] > 0
            assert r["cublas_fp32_gflops"] > 0  # baselines still measured after the faults
        else:
            assert r["gflops"] is None and r["error"]
    assert "illegal" in records["broken_out_of_bounds"]["error"].lower()
    assert "made no progress for 15 s" in records["broken_infinite_loop"]["error"]
    assert "exceeds the tolerance" in records["broken_wrong_values"]["error"]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    for status in ("failed_launch", "failed_timeout", "failed_verification"):
        assert status in summary
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    by_kernel = {job.data.params["kernel"]: job for job in jobs}
    for name, status in EXPECTED.items():
        assert by_kernel[name].info.status == ("FINISHED" if status == "ok" else "FAILED")
        assert by_kernel[name].data.tags["status"] == status


@pytest.mark.gpu
def test_resume_reuses_verified_results_and_runs_the_rest(tmp_path, tracking_uri):
    """A sweep re-run with resume=true: the jobs measured before come from the cache (same
    figures, marked from_cache); a job not measured before runs."""
    common = ["bench=quick", "size=256", f"cache_dir={tmp_path}/cache", "mlflow.enabled=false"]
    first = run_cli(tmp_path / "a", "-m", "kernel=01_naive,06_vectorize", *common)
    assert first.returncode == 0, first.stderr
    again = run_cli(tmp_path / "b", "-m", "kernel=01_naive,06_vectorize,05_blocktile_2d",
                    "resume=true", *common)
    assert again.returncode == 0, again.stderr
    before = {r["kernel"]: r for r in (json.loads(p.read_text())
              for p in (tmp_path / "a" / "sweep").glob("*/record.json"))}
    after = {r["kernel"]: r for r in (json.loads(p.read_text())
             for p in (tmp_path / "b" / "sweep").glob("*/record.json"))}
    for name in ("01_naive", "06_vectorize"):
        assert after[name]["from_cache"] and after[name]["gflops"] == before[name]["gflops"]
    assert after["05_blocktile_2d"]["status"] == "ok" and not after["05_blocktile_2d"]["from_cache"]


@pytest.mark.gpu
def test_throttled_samples_are_flagged_and_a_fully_throttled_job_fails(compose, monkeypatch):
    """Each sample's SM clock comes from clock64 over the global timer, and NVML's clock-event
    reasons are read around every batch of rounds. The power cap alone is recorded as a condition
    and the job stands; a thermal or hardware slowdown in every batch leaves no usable round and
    the job fails failed_throttled, naming the rule (NVML's answer is replaced here: a real
    slowdown cannot be ordered)."""
    from src.job import measure as measure_mod
    from src.job import protocol
    from src.job.pipeline import run_job

    record = run_job(compose("kernel=06_vectorize", "size=1024", "bench=quick"))
    assert record.ok and record.samples_throttled == 0
    assert len(record.sample_clock_mhz) == record.samples
    top = record.device["max_sm_clock_mhz"]
    assert all(0.3 * top < c <= 1.05 * top for c in record.sample_clock_mhz), record.sample_clock_mhz
    monkeypatch.setattr(measure_mod, "throttle_mask", lambda device: protocol.POWER_CAP)
    capped = run_job(compose("kernel=06_vectorize", "size=1024", "bench=quick"))
    assert capped.ok and capped.power_capped_share == 1.0 and capped.gflops > 0
    monkeypatch.setattr(measure_mod, "throttle_mask", lambda device: 0x8)  # HW_SLOWDOWN
    throttled = run_job(compose("kernel=06_vectorize", "size=1024", "bench=quick"))
    assert throttled.status == "failed_throttled" and throttled.gflops is None
    assert "bench.throttle_threshold" in throttled.error and "hw_slowdown" in throttled.error


@pytest.mark.gpu
def test_a_compile_error_shows_nvrtcs_log_with_file_and_line(tmp_path):
    proc = run_cli(tmp_path, "hydra.searchpath=[file://tests/conf]", "kernel=broken_compile",
                   "size=128", "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [failed_compile]" in output, output
    assert "tests/kernels/broken_compile.cu(7)" in output and "undeclared_value" in output
    assert "Traceback" not in output


@pytest.mark.gpu
def test_a_problem_larger_than_free_memory_says_how_much_it_needs(tmp_path):
    proc = run_cli(tmp_path, "kernel=01_naive", "m=150000", "n=150000", "k=8",
                   "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [out_of_memory]" in output, output
    assert "GiB are free" in output and "need" in output and "Traceback" not in output


@pytest.mark.gpu
def test_healthy_gpu_jobs_share_one_worker(compose):
    """After a verified GPU job the worker's context is healthy: the next job reuses it."""
    from omegaconf import OmegaConf

    from src.records.record import new_record
    from src.sweep.worker import Worker

    cfg = compose("kernel=06_vectorize", "size=256", "bench=quick")
    container = OmegaConf.to_container(cfg, resolve=True)
    worker = Worker()
    try:
        for _ in range(2):
            record, _ = worker.run(container, set(), 120, new_record("06_vectorize", "fp32", "nvrtc", cfg))
            assert record.ok, record.error
        assert worker.started == 1
    finally:
        worker.stop()
