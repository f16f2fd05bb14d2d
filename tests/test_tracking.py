"""MLflow tracking against a real store (sqlite in tmp_path), driven by the recorded H100 results:
a sweep is one parent run with one child per job, carrying every param, metric, tag and file the
job produced; failures end FAILED with error.txt, interrupts KILLED, and nothing stays RUNNING.

The jobs are replayed as run.py runs them (tracking.job_run around the job, log_result with its
record and outputs), with the recorded record in place of a GPU run."""

from __future__ import annotations

import contextlib

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from src.sweep import tracking  # noqa: E402
from src.sweep.tracking import signals  # noqa: E402
from src.sweep.tracking.job_run import rounded  # noqa: E402
from src.job.compile import expand_source  # noqa: E402
from src.errors import VerificationFailed  # noqa: E402
from src.job.measure import JobOutputs  # noqa: E402
from src.job.pipeline import run_job  # noqa: E402
from src.job import dispatch  # noqa: E402
from src.job.config import kernel_config  # noqa: E402
from src.job.problem import Problem  # noqa: E402
from src.records.record import mark_failed  # noqa: E402
from src.paths import KERNELS_DIR  # noqa: E402
from tests.conftest import ROOT, compose_config, load_jsonl  # noqa: E402
from tests.replay import (composed, all_runs, artifact, artifact_names, config_of,  # noqa: E402
                          job_name, outputs_of, replay_job, start_sweep)


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    """`interrupted` is per process; each test starts as a fresh process would."""
    monkeypatch.setattr(signals, "_interrupted", False)


# --- a recorded sweep, replayed once for the tests that read it -----------------------------------

@pytest.fixture(scope="module")
def sweep(tmp_path_factory, mlflow_template):
    """The progression sweep and the sweep with failures, replayed as one sweep: 24 jobs, 5 failed."""
    import shutil

    root = tmp_path_factory.mktemp("sweep")
    shutil.copy(mlflow_template, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    records = load_jsonl("records_h100_progression.jsonl") + load_jsonl("records_h100_mixed.jsonl")
    sweep_dir = root / "multirun" / "sweep"
    callback, config = start_sweep(uri, sweep_dir)
    parent = tracking.Parent.read(sweep_dir)  # what each job process reads
    assert parent is not None and parent.tracking_uri == uri
    # Launchers that run jobs in other processes pickle Hydra's callbacks, this one included.
    assert pickle.loads(pickle.dumps(callback)).sweep.parent == parent
    for num, record in enumerate(records):
        replay_job(record, uri, job_name(num, record), parent, sweep_dir)
    callback.on_multirun_end(config)
    client = MlflowClient(uri)
    runs = {run.info.run_name: run for run in all_runs(client)}
    return {"uri": uri, "root": root, "client": client, "parent": parent, "records": records,
            "runs": runs, "jobs": [runs[job_name(num, r)] for num, r in enumerate(records)]}


def test_sweep_is_one_parent_run_with_a_child_per_job(sweep):
    parent, records, jobs = sweep["parent"], sweep["records"], sweep["jobs"]
    runs = list(sweep["runs"].values())
    assert len(runs) == len(records) + 1
    top = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert [run.info.run_id for run in top] == [parent.run_id]
    assert all(job.data.tags["mlflow.parentRunId"] == parent.run_id for job in jobs)
    assert all(run.info.experiment_id == parent.experiment_id for run in runs)
    assert {run.info.status for run in runs} <= {"FINISHED", "FAILED"}  # none left RUNNING

    sweep_run = top[0]
    failed = sum(not r.ok for r in records)
    assert failed == 5
    assert sweep_run.info.status == "FINISHED"  # the sweep went on past its failed jobs
    assert sweep_run.data.tags["kind"] == "sweep"
    assert {key: sweep_run.data.tags[key] for key in ("jobs", "jobs_ok", "jobs_failed", "jobs_killed")} \
        == {"jobs": "24", "jobs_ok": "19", "jobs_failed": "5", "jobs_killed": "0"}
    for record, job in zip(records, jobs):
        assert job.info.status == ("FINISHED" if record.ok else "FAILED")
        assert job.data.tags["status"] == record.status
        assert job.data.tags["kind"] == "job"


def test_job_params_are_the_flattened_composed_config(sweep):
    for record, job in zip(sweep["records"], sweep["jobs"]):
        params = job.data.params
        assert params["kernel"] == params["kernel.name"] == record.kernel
        assert (params["m"], params["n"], params["k"]) == (str(record.m), str(record.n), str(record.k))
        assert (float(params["alpha"]), float(params["beta"])) == (record.alpha, record.beta)
        for key, value in record.params.items():  # tile parameters
            assert params[f"kernel.params.{key}"] == str(value)
        for key in ("warmup", "min_samples", "max_samples", "target_rel_iqr", "max_seconds", "flush_l2"):
            assert json.loads(params[f"bench.{key}"]) == record.bench[key]  # the protocol
        assert json.loads(params["bench.tolerance.fp32"]) == record.bench["tolerance"]["fp32"]
        assert params["gpu.name"] == "auto"
        if record.ok:
            assert params["gpu_spec"] == record.gpu_spec == "h100_sxm"  # what auto picked
        assert params["kernel.precision"] == params["precision"] == record.precision
        assert all(len(value) <= tracking.MAX_PARAM_LENGTH for value in params.values())
        # values, not formulas: the kernel's expressions are not params; what they resolved to is
        assert not [key for key in params if key.startswith(("kernel.derived.", "kernel.launch.",
                                                             "kernel.constraints", "mlflow."))]
        if record.entry:
            assert params["kernel.entry"] == record.entry and "{" not in params["kernel.entry"]
            assert params["launch.grid"] == " x ".join(map(str, record.grid))
            assert params["launch.block"] == " x ".join(map(str, record.block))


def test_metrics_are_rounded_for_reading_finer_than_the_noise():
    """GFLOP/s to 0.1, percentages to 0.01, times to 4 and errors to 3 significant digits (the
    runs table showed 128023.586804 and 248.088434); counts and clocks stay exact."""
    assert rounded("gflops", 128023.586804) == 128023.6
    assert rounded("cublas_fp32_gflops", 52101.999794) == 52102.0
    assert rounded("pct_of_cublas_fp32", 248.088434) == 248.09
    assert rounded("pct_ci_low", 99.99499) == 99.99
    assert rounded("time_ms_median", 1.07354321) == 1.074
    assert rounded("time_ms_iqr", 0.000123456) == 0.0001235
    assert rounded("rel_err", 5.743312807950567e-07) == 5.74e-07
    assert rounded("compile_seconds", 1.13749) == 1.137
    assert rounded("registers", 168.0) == 168.0 and rounded("sm_clock_mhz_before", 1980.0) == 1980.0


def test_pct_of_cublas_is_against_the_same_precisions_baseline(sweep):
    """One column that sorts every kernel fairly: TF32 kernels against cuBLAS TF32."""
    checked = set()
    for record, job in zip(sweep["records"], sweep["jobs"]):
        if not record.ok:
            assert "pct_of_cublas" not in job.data.metrics
            continue
        same = record.pct_of_cublas_tf32 if record.precision == "tf32" else record.pct_of_cublas_fp32
        assert job.data.metrics["pct_of_cublas"] == rounded("pct_of_cublas", same)
        checked.add(record.precision)
        if record.kernel in ("cublas_fp32", "cublas_tf32"):
            assert job.data.metrics["pct_of_cublas"] == pytest.approx(100.0)
    assert checked == {"fp32", "tf32"}


def test_runs_are_described_by_their_outcome(sweep):
    """A job's description is its error (failed) or its headline figures (ok); a sweep's is
    its summary table, with the counts as metrics."""
    for record, job in zip(sweep["records"], sweep["jobs"]):
        note = job.data.tags["mlflow.note.content"]
        if record.ok:
            assert note.startswith(f"{record.gflops:,.1f} GFLOP/s")
        else:
            assert note.startswith(f"**{record.status}**")
            assert " ".join(record.error.split()) in " ".join(note.split())  # wrapped, all there
    parent = sweep["client"].get_run(sweep["parent"].run_id)
    assert parent.data.metrics == {"jobs": 24.0, "jobs_ok": 19.0, "jobs_failed": 5.0, "jobs_killed": 0.0}
    assert parent.data.tags["mlflow.note.content"].startswith("SGEMM on NVIDIA H100")
    assert parent.info.run_name.endswith("(24 jobs: 19 ok, 5 failed)")


def test_run_names_say_kernel_shape_and_swept_tiles():
    assert tracking.run_name("22_ffma_warp_specialized", 4096, 4096, 4096) == "22_ffma_warp_specialized 4096³"
    assert tracking.run_name("05_blocktile_2d", 2048, 1024, 512, ["size=7"]) == "05_blocktile_2d 2048×1024×512"
    assert tracking.run_name("06_vectorize", 4096, 4096, 4096,
                             ["kernel=06_vectorize", "kernel.params.bm=64", "kernel.params.bk=16"]) \
        == "06_vectorize 4096³ bk=16 bm=64"


def test_error_file_is_wrapped_for_reading():
    from src.sweep.tracking.job_run import wrap

    line = "kernel x failed verification: " + "word " * 60
    wrapped = wrap(line + "\n  File \"a.py\", line 3\n")
    assert all(len(row) <= 100 for row in wrapped.splitlines())
    assert " ".join(wrapped.split()) == " ".join((line + ' File "a.py", line 3').split())
    assert '  File "a.py", line 3' in wrapped.splitlines()  # short lines kept as they are


def test_job_metrics_are_the_records_figures(sweep):
    for record, job in zip(sweep["records"], sweep["jobs"]):
        metrics = job.data.metrics
        for name in ("gflops", "time_ms_median", "time_ms_min", "time_ms_max", "time_ms_iqr",
                     "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_peak", "rel_err",
                     "registers", "static_smem_bytes", "dynamic_smem_bytes", "local_bytes",
                     "compile_seconds", "sm_clock_mhz_before", "sm_clock_mhz_after", "samples"):
            value = getattr(record, name)
            if value is None:
                assert name not in metrics, (record.kernel, name)  # None is simply not logged
            else:
                assert metrics[name] == rounded(name, float(value)), (record.kernel, name)
        if record.ok:
            assert metrics["gflops"] > 0 and metrics["rel_err"] <= metrics["tolerance"]
        else:
            assert "gflops" not in metrics and "pct_of_cublas_fp32" not in metrics
        if record.backend == "cublas":
            assert "registers" not in metrics  # nothing compiled
        else:
            assert record.ok == ("registers" in metrics)


def test_job_tags_say_where_and_from_which_code(sweep):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    for record, job in zip(sweep["records"], sweep["jobs"]):
        tags = job.data.tags
        assert tags["host"] == socket.gethostname()
        assert tags["status"] == record.status
        if head.returncode == 0:
            assert tags["git_commit"] == tags["mlflow.source.git.commit"] == head.stdout.strip()
            assert tags["git_dirty"] in ("true", "false")
        if record.ok:
            assert tags["gpu"] == "NVIDIA H100 80GB HBM3"
            assert (tags["compute_capability"], tags["driver"], tags["cuda_runtime"],
                    tags["nvrtc"], tags["cupy"]) == ("9.0", "13.0", "13.2", "13.0", "14.2.0")
            assert tags["seed"] == str(record.seed)
        else:
            assert "gpu" not in tags  # the job stopped before looking at the device
            assert tags["error"] == record.error.splitlines()[0][:500]
        if record.entry:
            assert tags["entry"] == record.entry


def test_job_artifacts_are_config_record_source_and_report(sweep, tmp_path):
    client = sweep["client"]
    for record, job in zip(sweep["records"], sweep["jobs"]):
        run_id = job.info.run_id
        names = artifact_names(client, run_id)
        record_json = json.loads(artifact(client, run_id, "record.json", tmp_path))
        assert record_json == json.loads(json.dumps(record.to_dict()))
        config = yaml.safe_load(artifact(client, run_id, "config.yaml", tmp_path))
        assert config["kernel"]["name"] == record.kernel and config["m"] == record.m
        assert config["kernel"].get("params", {}) == record.params
        if record.backend == "nvrtc" and record.entry:
            source = artifact(client, run_id, "kernel.cu", tmp_path)
            assert source.startswith(f'#line 1 "kernels/chapters/{record.kernel}.cu"')
            assert '#line 1 "kernels/include/common.cuh"' in source  # the header pasted in, as compiled
        else:
            assert "kernel.cu" not in names
        if record.registers is not None:
            report = json.loads(artifact(client, run_id, "resources.json", tmp_path))
            assert (report["registers"], report["local_bytes"]) == (record.registers, record.local_bytes)
        else:
            assert "resources.json" not in names
        if record.ok:
            assert "error.txt" not in names
        else:
            text = artifact(client, run_id, "error.txt", tmp_path)  # wrapped for reading
            assert " ".join(text.split()) == " ".join(record.error.split())
            assert max(map(len, text.splitlines())) <= max(100, *map(len, record.error.split()))
        assert "kernel.ptx" not in names  # mlflow.log_ptx is off by default


def test_artifacts_are_beside_the_store(sweep):
    """A local sqlite store keeps its artifacts in mlruns/ beside the database file."""
    mlruns = sweep["root"] / "mlruns"
    for job in sweep["jobs"]:
        path = Path(job.info.artifact_uri.removeprefix("file://"))
        assert path.is_relative_to(mlruns) and (path / "record.json").is_file()
    experiment = sweep["client"].get_experiment(sweep["parent"].experiment_id)
    assert experiment.name == "sgemm-lab/config"


def test_sweep_run_has_the_summary_table_and_figure(sweep, tmp_path):
    client, records, parent = sweep["client"], sweep["records"], sweep["parent"]
    assert artifact_names(client, parent.run_id) == {"summary_table.json", "summary.md", "gflops.png"}
    table = json.loads(artifact(client, parent.run_id, "summary_table.json", tmp_path))
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(row["kernel"], row["size"], row["status"]) for row in rows] == \
        [(r.kernel, r.size_label, r.status) for r in records]
    for row, record in zip(rows, records):
        assert row["gflops"] == (pytest.approx(record.gflops) if record.ok else None)
    assert json.loads(client.get_run(parent.run_id).data.tags["mlflow.loggedArtifacts"]) == \
        [{"path": "summary_table.json", "type": "table"}]  # shown as a table in the UI
    summary = artifact(client, parent.run_id, "summary.md", tmp_path)
    assert summary.startswith("SGEMM on NVIDIA H100 80GB HBM3: 24 jobs, 19 ok, 5 failed")
    dst = tmp_path / "png"
    dst.mkdir()
    png = Path(client.download_artifacts(parent.run_id, "gflops.png", str(dst))).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


# --- single runs and failures ---------------------------------------------------------------------

def test_a_single_run_is_one_run_without_parent(progression, tracking_uri):
    record = progression[-1]
    run_id = replay_job(record, tracking_uri, "single")
    runs = all_runs(MlflowClient(tracking_uri))
    assert [run.info.run_id for run in runs] == [run_id]
    assert "mlflow.parentRunId" not in runs[0].data.tags
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.metrics["gflops"] == round(record.gflops, 1)  # rounded for reading


def test_failed_verification_is_failed_with_its_error_and_no_gflops(progression, tracking_uri, tmp_path):
    record = next(r for r in progression if r.kernel == "06_vectorize")
    mark_failed(record, VerificationFailed(
        "kernel 06_vectorize failed verification: normwise relative error 1.000e-03 ...", rel_err=1e-3))
    run_id = replay_job(record, tracking_uri, "wrong")
    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed_verification"
    assert "gflops" not in run.data.metrics and "time_ms_median" not in run.data.metrics
    assert run.data.metrics["rel_err"] == pytest.approx(1e-3)  # what failed is kept
    assert run.data.metrics["registers"] == record.registers
    assert artifact(client, run_id, "error.txt", tmp_path).startswith("kernel 06_vectorize failed verification")


def _settings(uri: str) -> tuple[tracking.Settings, object]:
    cfg = composed("06_vectorize", (), uri)
    return tracking.Settings.from_cfg(cfg, ROOT, "config"), cfg


def test_an_exception_in_a_job_leaves_it_failed_with_the_traceback(tracking_uri, tmp_path):
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(RuntimeError, match="cuda fault"):
        with tracking.job_run(settings, cfg, "boom") as job:
            raise RuntimeError("cuda fault")
    client = MlflowClient(tracking_uri)
    run = client.get_run(job.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed_internal"
    assert "kernel.params.bm" in run.data.params  # the config was logged before the job ran
    error = artifact(client, job.run_id, "error.txt", tmp_path)
    assert "Traceback" in error and "RuntimeError: cuda fault" in error


def test_keyboard_interrupt_leaves_the_job_killed(tracking_uri):
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(KeyboardInterrupt):
        with tracking.job_run(settings, cfg, "ctrl-c") as job:
            raise KeyboardInterrupt
    run = MlflowClient(tracking_uri).get_run(job.run_id)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "killed"


def test_sigterm_leaves_the_job_killed(tracking_uri):
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("something in this test process already handles SIGTERM")
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(tracking.Terminated):
        with tracking.job_run(settings, cfg, "sigterm") as job:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(500):  # the handler runs between two bytecodes, well within this
                time.sleep(0.01)
            pytest.fail("SIGTERM did not interrupt the job")
    # the process is leaving: later signals stay ignored until it has (reset: it carries on)
    assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    signals.reset()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    run = MlflowClient(tracking_uri).get_run(job.run_id)
    assert run.info.status == "KILLED"
    assert not [r for r in all_runs(MlflowClient(tracking_uri)) if r.info.status == "RUNNING"]


def test_a_job_without_a_record_is_failed(tracking_uri):
    settings, cfg = _settings(tracking_uri)
    with tracking.job_run(settings, cfg, "empty") as job:
        pass
    assert MlflowClient(tracking_uri).get_run(job.run_id).info.status == "FAILED"


# --- sweeps that stop early -----------------------------------------------------------------------

def test_an_interrupted_sweep_ends_killed_with_no_run_left_running(progression, tmp_path, tracking_uri):
    """Ctrl-C (a real SIGINT) in the second job: that job KILLED; a job whose process died without a word
    (SIGKILL) KILLED too; at exit (the atexit hook) the parent KILLED, with the counts."""
    sweep_dir = tmp_path / "sweep"
    callback, _config = start_sweep(tracking_uri, sweep_dir)
    parent = tracking.Parent.read(sweep_dir)
    replay_job(progression[0], tracking_uri, "0_ok", parent)
    client = MlflowClient(tracking_uri)
    orphan = client.create_run(parent.experiment_id, run_name="2_sigkilled",
                               tags={"mlflow.parentRunId": parent.run_id})
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(KeyboardInterrupt):
        with tracking.job_run(settings, cfg, "1_interrupted", parent):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            for _ in range(500):
                time.sleep(0.01)
            pytest.fail("SIGINT did not interrupt the job")
    assert signals.was_interrupted()
    callback.sweep.close_unfinished()  # what atexit runs when the interrupt ends the process
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # ignored until the process exits
    signals.reset()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    runs = {run.info.run_name: run for run in all_runs(client)}
    assert runs["0_ok"].info.status == "FINISHED"
    assert runs["1_interrupted"].info.status == "KILLED"
    assert runs["2_sigkilled"].info.status == "KILLED"
    assert client.get_run(orphan.info.run_id).data.tags["status"] == "killed"
    sweep_run = client.get_run(parent.run_id)
    assert sweep_run.info.status == "KILLED"
    assert (sweep_run.data.tags["jobs_ok"], sweep_run.data.tags["jobs_killed"]) == ("1", "2")
    assert not [run for run in runs.values() if run.info.status == "RUNNING"]
    callback.sweep.close_unfinished()  # a second call (atexit after an explicit close) is a no-op
    assert client.get_run(parent.run_id).info.status == "KILLED"


def test_a_sweep_stopped_by_an_error_ends_failed(progression, tmp_path, tracking_uri):
    """Hydra stops a sweep when a job raises (not a recorded failure, an exception): FAILED."""
    sweep_dir = tmp_path / "sweep"
    callback, _config = start_sweep(tracking_uri, sweep_dir)
    parent = tracking.Parent.read(sweep_dir)
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(ValueError):
        with tracking.job_run(settings, cfg, "0_raises", parent):
            raise ValueError("a bug")
    callback.sweep.close_unfinished()
    client = MlflowClient(tracking_uri)
    sweep_run = client.get_run(parent.run_id)
    assert sweep_run.info.status == "FAILED"
    assert sweep_run.data.tags["jobs_failed"] == "1"
    assert "error.txt" in artifact_names(client, parent.run_id)


def test_disabled_tracking_starts_nothing_and_forgets_a_stale_parent(tmp_path, tracking_uri):
    sweep_dir = tmp_path / "sweep"
    tracking.Parent("stale", "0", tracking_uri).write(sweep_dir)
    callback, config = start_sweep(tracking_uri, sweep_dir, "mlflow.enabled=false")
    assert callback.sweep is None
    assert tracking.Parent.read(sweep_dir) is None  # no job attaches to an earlier sweep's run
    callback.on_multirun_end(config)
    assert all_runs(MlflowClient(tracking_uri)) == []


# --- where, and what is logged --------------------------------------------------------------------

@contextlib.contextmanager
def health_server():
    """An HTTP server on 127.0.0.1 that answers GET /health with 200, as `mlflow server` does."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_default_store_is_mlflows_own_default_in_the_original_cwd(monkeypatch, tmp_path, compose):
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH, DEFAULT_TRACKING_URI

    # the same layout MLflow 3 uses by itself: sqlite:///mlflow.db, artifacts in ./mlruns
    assert f"sqlite:///{tracking.DEFAULT_DB}" == DEFAULT_TRACKING_URI
    assert f"./{tracking.ARTIFACTS_DIR}" == DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.resolve_tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    assert tracking.resolve_tracking_uri("sqlite:///other.db", tmp_path) == f"sqlite:///{tmp_path}/other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking.resolve_tracking_uri(None, tmp_path) == "http://mlflow.example:5000"
    assert tracking.resolve_tracking_uri("http://config:5000", tmp_path) == "http://config:5000"

    with health_server() as served:  # a server that answers MLflow's GET /health
        monkeypatch.setenv("MLFLOW_TRACKING_URI", served)
        settings = tracking.Settings.from_cfg(compose(), tmp_path, "config")
    assert settings == tracking.Settings(True, served, "sgemm-lab/config", False)
    settings = tracking.Settings.from_cfg(
        compose("mlflow.enabled=false", "mlflow.experiment_name=tiles", "mlflow.log_ptx=true"),
        tmp_path, "config")
    assert (settings.enabled, settings.experiment_name, settings.log_ptx) == (False, "tiles", True)


def test_long_param_values_are_cut_to_mlflows_limit(tracking_uri):
    flat = tracking.flatten({"a": {"b": "x" * 7000, "c": [1, 2], "d": None, "e": {}}, "f": True})
    assert flat == {"a.b": "x" * (tracking.MAX_PARAM_LENGTH - 1) + "…", "a.c": "[1, 2]",
                    "a.d": "null", "a.e": "{}", "f": "true"}
    client = MlflowClient(tracking_uri)
    run = client.create_run(tracking.ensure_experiment(client, "limits", tracking_uri))
    tracking.log_batch(client, run.info.run_id, params=flat)  # the store takes them
    assert client.get_run(run.info.run_id).data.params == flat


def test_a_deleted_experiment_is_a_clear_error(tracking_uri):
    client = MlflowClient(tracking_uri)
    client.delete_experiment(tracking.ensure_experiment(client, "sgemm-lab/config", tracking_uri))
    settings, cfg = _settings(tracking_uri)
    with pytest.raises(RuntimeError, match=r"is deleted in .*: restore it \(mlflow experiments restore"):
        with tracking.job_run(settings, cfg, "x"):
            pass


def test_the_job_hands_over_the_source_it_compiles(compose):
    """run_job fills JobOutputs: the expanded source as soon as the spec is built (here, with no
    GPU, the job then fails with no_gpu; on a GPU it also has the resource report)."""
    outputs = JobOutputs()
    record = run_job(compose("kernel=06_vectorize", "size=256", "bench=quick"), outputs)
    assert outputs.source == expand_source(KERNELS_DIR / "chapters" / "06_vectorize.cu")
    if record.ok:
        assert outputs.resources is not None and outputs.resources.registers == record.registers
    else:
        assert record.status == "no_gpu" and outputs.resources is None
    outputs = JobOutputs()
    run_job(compose("kernel=06_vectorize", "kernel.params.bk=6"), outputs)
    assert outputs.source is None  # invalid parameters: nothing would be compiled


@pytest.mark.parametrize("ptx", ["ok", "fails", "off"])
def test_ptx_is_logged_when_asked(progression, tracking_uri, monkeypatch, tmp_path, ptx):
    record = next(r for r in progression if r.kernel == "06_vectorize")
    seen = []

    def fake_ptx(source, entry, cc):
        seen.append((entry, cc))
        if ptx == "fails":
            raise OSError("libnvrtc.so not found")
        return ".version 9.0\n.target sm_90\n"

    monkeypatch.setattr("src.job.compile.nvrtc_ptx", fake_ptx)
    cfg = config_of(record, tracking_uri)
    settings = replace(tracking.Settings.from_cfg(cfg, ROOT, "config"), log_ptx=ptx != "off")
    with tracking.job_run(settings, cfg, "ptx") as job:
        job.log_result(record, outputs_of(record, cfg))
    client = MlflowClient(tracking_uri)
    assert client.get_run(job.run_id).info.status == "FINISHED"  # PTX is optional
    names = artifact_names(client, job.run_id)
    assert ("kernel.ptx" in names) == (ptx == "ok")
    assert seen == ([] if ptx == "off" else [(record.entry, "9.0")])
    if ptx == "ok":
        assert artifact(client, job.run_id, "kernel.ptx", tmp_path).startswith(".version")


def test_nvrtc_ptx_of_a_chapter():
    """Real NVRTC (no GPU needed): skipped where the NVRTC library is missing."""
    from src.job.compile import nvrtc_ptx

    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC is not available here ({type(exc).__name__})")
    ptx = nvrtc_ptx(expand_source(KERNELS_DIR / "chapters" / "06_vectorize.cu"),
                    "sgemm_vectorize<128, 128, 8, 8, 8>", "9.0")
    assert ".target sm_90" in ptx and ".entry" in ptx and "sgemm_vectorize" in ptx


def test_tuned_kernel_logs_the_tile_parameters_it_used(tracking_uri):
    """A tuned kernel's kernel.params.* are the values the job ran with (conf/tuned/ for the
    GPU, here an H100 SXM by name), logged with the result, plus where they came from."""
    cfg = compose_config("kernel=17_flagship", "gpu=h100_sxm", "size=1024",
                         f"mlflow.tracking_uri={tracking_uri}")
    settings = tracking.Settings.from_cfg(cfg, ROOT, "config")
    with tracking.job_run(settings, cfg, "tuned") as job:
        record = run_job(cfg)
        job.log_result(record)
    params = MlflowClient(tracking_uri).get_run(job.run_id).data.params
    assert record.tuned_from and params["kernel.tuned_from"] == record.tuned_from
    for key, value in record.params.items():
        assert params[f"kernel.params.{key}"] == str(value)
    assert params["kernel.params.split_k"] == "2"  # the 1024 class, not the config's 1


def test_dispatched_kernel_logs_the_chapter_its_rule_and_its_parameters(tracking_uri):
    """kernel=best_fp32: the run says which chapter ran the shape, the rule that chose it, and
    the tile parameters that chapter ran with (here on an H100 SXM by name, without a GPU)."""
    cfg = compose_config("kernel=best_fp32", "gpu=h100_sxm", "size=1024",
                         f"mlflow.tracking_uri={tracking_uri}")
    settings = tracking.Settings.from_cfg(cfg, ROOT, "config")
    with tracking.job_run(settings, cfg, "dispatched") as job:
        record = run_job(cfg)
        job.log_result(record)
    params = MlflowClient(tracking_uri).get_run(job.run_id).data.params
    choice = dispatch.choose(kernel_config("best_fp32"), "h100_sxm", Problem(1024, 1024, 1024, 1.0, 0.0))
    assert choice.kernel.startswith("gemm_") and choice.params  # the tuned file names a tile
    assert params["kernel"] == "best_fp32" and params["dispatched_to"] == choice.kernel
    assert params["dispatch_rule"] == record.dispatch_rule == choice.rule
    assert record.dispatch_rule.startswith("conf/tuned/h100_sxm.yaml: ")
    assert {k: params[f"kernel.params.{k}"] for k in choice.params} == \
        {k: str(v) for k, v in choice.params.items()}


def test_an_interrupt_that_a_library_swallows_while_mlflow_loads_is_not_lost(tmp_path, tracking_uri,
                                                                             monkeypatch):
    """Ctrl-C while the sweep's run starts (MLflow's import takes seconds), caught by a library
    that raises its own error instead (pydantic-core turns it into a SchemaError; Hydra then only
    warns about the callback): the process still knows it was interrupted, so the next job stops
    the sweep, and no run was made. Measured in the soak: the sweep went on, MLflow half-imported."""
    from src.sweep.tracking import sweep_run

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("something in this test process already handles SIGINT")
    real_client = sweep_run.client

    def client_of_a_swallowing_library(uri):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(500):
                time.sleep(0.01)
        except KeyboardInterrupt as exc:
            raise RuntimeError("SchemaError: Error building validator") from exc
        return real_client(uri)

    monkeypatch.setattr(sweep_run, "client", client_of_a_swallowing_library)
    settings, _cfg = _settings(tracking_uri)
    try:
        with pytest.raises(RuntimeError, match="SchemaError"):
            tracking.SweepRun.start(settings, tmp_path / "sweep", ["size=128"])
        assert signals.was_interrupted()
        with pytest.raises(KeyboardInterrupt):  # what the next job's start does (src/run.py)
            signals.raise_if_interrupted()
    finally:
        signals.reset()
    assert all_runs(MlflowClient(tracking_uri)) == []


def test_a_sweep_run_is_ended_even_when_the_store_fails_while_describing_it(progression, tmp_path,
                                                                            tracking_uri, monkeypatch):
    """The store fails while the sweep's end is written (counting its jobs, here), and refuses
    the first tries of the end itself (a sqlite store locked by other sweeps): the parent run
    still ends, FAILED, never left RUNNING."""
    from src.sweep.tracking import sweep_run

    sweep_dir = tmp_path / "sweep"
    callback, config = start_sweep(tracking_uri, sweep_dir)
    parent = tracking.Parent.read(sweep_dir)

    def store_down(*args, **kwargs):
        raise OSError("database is locked")

    monkeypatch.setattr(sweep_run, "child_runs", store_down)
    refusals = []
    set_terminated = MlflowClient.set_terminated

    def locked_twice(self, run_id, status=None, end_time=None):
        if len(refusals) < 2:
            refusals.append(status)
            raise OSError("database is locked")
        return set_terminated(self, run_id, status, end_time)

    monkeypatch.setattr(MlflowClient, "set_terminated", locked_twice)
    monkeypatch.setattr(sweep_run, "TERMINATE_PAUSE_S", 0, raising=False)
    with pytest.raises(OSError):  # finish fails counting (Hydra warns of it): closed unfinished
        callback.on_multirun_end(config)
    assert MlflowClient(tracking_uri).get_run(parent.run_id).info.status == "FAILED"
    assert refusals == ["FAILED", "FAILED"]


@pytest.mark.parametrize("set_by_user", [None, "false"])
def test_mlflows_usage_telemetry_is_off_unless_the_user_says(monkeypatch, tmp_path, set_by_user):
    """The store's client turns MLflow 3's usage telemetry off (MLFLOW_DISABLE_TELEMETRY), as
    MLflow reads it; a value the user set is kept."""
    from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY

    from src.sweep.tracking.store import client

    if set_by_user is None:
        monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", set_by_user)
    client(f"sqlite:///{tmp_path}/mlflow.db")
    assert MLFLOW_DISABLE_TELEMETRY.get() is (set_by_user is None)


LOST_IN_A_FINALIZER = """
import signal, sys
from src.sweep.tracking import Terminated, signals

class Finalized:
    def __del__(self):  # what a library's weakref callback does when the collector runs it
        signal.raise_signal(signal.SIGTERM)

class Broken:
    def __del__(self):
        raise ValueError("a library's own finalizer error")

signals.install_signal_handlers()
Broken()
Finalized()
print("after the finalizer:", signals.was_interrupted(), flush=True)
try:
    signals.raise_if_interrupted()
except Terminated:
    print("stopped before the next job", flush=True)
"""


def test_a_sigterm_lost_in_a_finalizer_prints_one_line_and_still_stops_the_sweep():
    """A SIGTERM whose exception lands in a finalizer (measured in the soak: SQLAlchemy's class
    registry, run by the garbage collector) is dropped by Python, which would print a traceback:
    one line says the sweep stops before its next job instead, and it does. A library's own
    finalizer error still prints its traceback."""
    done = subprocess.run([sys.executable, "-c", LOST_IN_A_FINALIZER], cwd=ROOT, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["after the finalizer: True", "stopped before the next job"]
    assert "interrupted (SIGTERM) while the garbage collector ran a cleanup" in done.stderr
    assert done.stderr.count("Traceback") == 1 and "ValueError: a library's own" in done.stderr
    assert "Terminated" not in done.stderr
