"""Without a GPU: one message that says which it is (no driver, no device, something else), and
a sweep that stops at its first no_gpu job, recording the rest as not run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from src.job import gpu
from src.records.record import Record, load_records
from src.sweep import callbacks
from tests.conftest import ROOT, _gpu_visible


class CUDARuntimeError(RuntimeError):
    """Named as CuPy's, whose text the message reads."""


def test_no_driver_is_said_plainly(monkeypatch):
    monkeypatch.setattr(gpu, "driver_loadable", lambda: False)
    text = gpu.no_gpu_message(CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version "
                                               "is insufficient for CUDA runtime version"))
    assert text.startswith("no NVIDIA driver on this machine") and "insufficient" not in text


def test_a_driver_without_a_visible_device(monkeypatch):
    monkeypatch.setattr(gpu, "driver_loadable", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for text in (gpu.no_gpu_message(None, count=0),
                 gpu.no_gpu_message(CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"))):
        assert text.startswith("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES='')")


def test_an_old_driver_and_a_missing_cupy_are_told_apart(monkeypatch):
    monkeypatch.setattr(gpu, "driver_loadable", lambda: True)
    old = gpu.no_gpu_message(CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"))
    assert old.startswith("the NVIDIA driver is older than the CUDA runtime")
    assert gpu.no_gpu_message(ImportError("No module named 'cupy'")).startswith("CuPy cannot be imported")


def test_after_a_no_gpu_job_the_next_is_not_run(tmp_path, compose):
    record = Record(kernel="01_naive", precision="fp32", backend="nvrtc",
                    m=256, n=256, k=256, alpha=1.0, beta=0.0)
    cfg = compose("kernel=02_gmem_coalesce", "size=512")
    assert callbacks.not_run_after_no_gpu(cfg, tmp_path) is None  # nothing found yet
    record.status, record.error = "ok", None
    callbacks.note_no_gpu(tmp_path, record)  # an ok job marks nothing
    assert callbacks.not_run_after_no_gpu(cfg, tmp_path) is None
    record.status, record.error = "no_gpu", "no NVIDIA driver on this machine"
    callbacks.note_no_gpu(tmp_path, record)
    skipped = callbacks.not_run_after_no_gpu(cfg, tmp_path)
    assert skipped.status == "not_run" and skipped.kernel == "02_gmem_coalesce" and skipped.m == 512
    assert "01_naive 256: no NVIDIA driver on this machine" in skipped.error and skipped.gflops is None


@pytest.mark.skipif(_gpu_visible() is None, reason="a GPU is visible: the jobs would run")
def test_a_sweep_without_a_gpu_stops_at_its_first_job(tmp_path):
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "src.run", "-m", "kernel=01_naive,02_gmem_coalesce", "size=256,512",
         "mlflow.enabled=false", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1
    statuses = [r.status for r in load_records(sweep)]
    assert statuses == ["no_gpu", "not_run", "not_run", "not_run"]
    # one worker started, for the first job: the others record why they did not run
    assert done.stderr.count("NOT_RUN") + done.stdout.count("NOT_RUN") == 3
    # nothing but the sweep's own lines: no library warning (Hydra's schema matching of the
    # lab's sweeper, src/compose/rules.py) before them
    assert "Warning" not in done.stderr, done.stderr
