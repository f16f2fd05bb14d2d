"""The command line as a user meets it: clear errors with non-zero exits for a single run, and
sweeps that record a failed job and go on to write their summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SHAPE_LIMITED, compose_config

ALL_KERNELS = sorted(p.stem for p in (ROOT / "conf" / "kernel").glob("*.yaml"))
assert {"01_naive", "17_flagship", "cublas_fp32", "cublas_tf32"} <= set(ALL_KERNELS)


def cli_env(**extra: str) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, HYDRA_FULL_ERROR="0", **extra)


def run_cli(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m src.run ARGS` with its outputs in tmp_path. MLflow tracking goes wherever ARGS
    or env (MLFLOW_TRACKING_URI) say; a test that says neither fails (conftest)."""
    return subprocess.run(
        [sys.executable, "-m", "src.run", *args, f"hydra.run.dir={tmp_path}/run",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(**env), capture_output=True, text=True, timeout=300,
    )


def tracked_runs(uri: str) -> tuple[object, list]:
    """(the sweep runs, the job runs) in the store at `uri`: no run is left RUNNING."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert not [run.info.run_name for run in runs if run.info.status == "RUNNING"]
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    return parents, [run for run in runs if run not in parents]


def assert_sweep_exit(proc, records, clean: bool = True) -> None:
    """A sweep exits 0 when a job succeeded, else 1 with one line saying so (on a machine
    without a GPU every job of a sweep is no_gpu). `clean`: and prints no traceback."""
    records = list(records)
    assert records, proc.stdout + proc.stderr
    if any(r["status"] == "ok" for r in records):
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 1, proc.stderr
        assert "error [no_job_succeeded]" in proc.stdout + proc.stderr
        assert not clean or "Traceback" not in proc.stdout + proc.stderr


BAD_INPUTS = [
    (["kernel=06_vectorize", "kernel.params.bk=6"], "invalid_params", "tm % 4 == 0 and tn % 4 == 0 and bk % 4 == 0"),
    (["kernel=05_blocktile_2d", "size=1000"], "unsupported_size", "m % bm == 0"),
    (["size=0"], "invalid_problem", "m=0"),
    (["size=abc"], "invalid_problem", "m='abc'"),
    (["m=3000000000"], "invalid_problem", "m <= 2147483647"),
    (["isolation.timeout_s=inf"], "invalid_config", "isolation.timeout_s must be a positive"),
]


def run_single_in_process(tmp_path, *args: str) -> tuple[int, dict]:
    """A single run of `python -m src.run ARGS`, in this process, through the steps src.run.main
    takes: a bad input refused in the launching process (fail_fast_on_bad_input exits 1), else
    the job in its worker (run_isolated). Returns the exit status (1: a failed job, as main
    exits) and the record.json written to the run directory."""
    from src.run import fail_fast_on_bad_input
    from src.sweep.worker import run_isolated
    from src.job.tuned import explicit_params

    cfg = compose_config(*args)
    run_dir = tmp_path / "run"
    try:
        fail_fast_on_bad_input(cfg, run_dir)
    except SystemExit as exc:
        code = exc.code
    else:
        record, _ = run_isolated(cfg, explicit_params(list(args)))
        record.write(run_dir)
        code = 0 if record.ok else 1
    return code, json.loads((run_dir / "record.json").read_text())


@pytest.mark.parametrize("args,status,needle", BAD_INPUTS)
def test_bad_input_is_one_clear_error(tmp_path, args, status, needle):
    """Each rule, checked through the runner's own steps in this process (composing and a
    subprocess per case cost seconds; test_a_bad_input_exits_1_with_one_paragraph runs the
    command itself)."""
    code, record = run_single_in_process(tmp_path, *args, "mlflow.enabled=false")
    assert code == 1
    assert record["status"] == status and needle in record["error"], record["error"]
    assert record["gflops"] is None and "Traceback" not in record["error"]


def test_a_bad_input_exits_1_with_one_paragraph(tmp_path):
    """The command itself, on a bad input its worker finds (the launching process refuses the
    others before a worker starts: tests/test_startup.py): exit status 1, the one paragraph,
    no traceback, the record, and no tracking store touched."""
    args, status, needle = BAD_INPUTS[1]
    store = tmp_path / "mlflow.db"
    proc = run_cli(tmp_path, *args, "mlflow.enabled=false", MLFLOW_TRACKING_URI=f"sqlite:///{store}")
    assert not store.exists()  # tracking off: no store touched
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert f"error [{status}]" in output and needle in output, output
    assert "Traceback" not in output
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == status and record["gflops"] is None


@pytest.mark.parametrize("override", ["=5", "+=5", "="])
def test_an_override_without_a_key_is_one_line(tmp_path, override):
    proc = run_cli(tmp_path, override, "mlflow.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [invalid_override]" in output, output
    assert f"the override {override!r} names no key" in output and "key=value" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1


def test_unknown_kernel_lists_the_choices(tmp_path):
    proc = run_cli(tmp_path, "kernel=07_nope", "mlflow.enabled=false")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "Could not find 'kernel/07_nope'" in output
    for name in ALL_KERNELS:
        assert name in output
    assert "Traceback" not in output


def test_unknown_gpu_lists_the_choices():
    """Hydra's own error, raised as the runner composes (test_unknown_kernel_lists_the_choices
    runs the command: exit status and no traceback)."""
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as raised:
        compose_config("gpu=b200", "mlflow.enabled=false")
    output = str(raised.value)
    assert "Could not find 'gpu/b200'" in output
    for name in ("auto", "h100_sxm", "h200", "a100"):
        assert name in output


@pytest.mark.parametrize("sweep", [False, True])
def test_a_tracking_uri_mlflow_cannot_use_is_one_clear_error(tmp_path, sweep):
    proc = run_cli(tmp_path, *(["-m"] if sweep else []), "size=128", "mlflow.tracking_uri=ftp://x")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "error [tracking_error]" in output and "scheme 'ftp'" in output
    assert "mlflow.enabled=false" in output and "Traceback" not in output
    assert not list(tmp_path.rglob("record.json"))  # stopped before any job ran


def test_sweep_records_every_job_and_goes_on_after_failures(tmp_path, tracking_uri):
    """A sweep over every kernel config plus a bad-parameter job: every job leaves a record
    (ok on a GPU machine; without one the first job is no_gpu and the rest not_run: the sweep
    stops there), the bad one is invalid_params, the summary is written, and the sweep itself
    succeeds. In MLflow (the store named by MLFLOW_TRACKING_URI) the sweep is one FINISHED parent
    run with one child per job that ran, FAILED where the job failed."""
    proc = run_cli(tmp_path, "-m", "kernel=glob(*)", "size=128", "bench=quick",
                   MLFLOW_TRACKING_URI=tracking_uri)
    sweep = tmp_path / "sweep"
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/record.json")}
    assert_sweep_exit(proc, records.values())
    assert sorted(r["kernel"] for r in records.values()) == ALL_KERNELS
    for r in records.values():
        if r["status"] == "not_run":  # after the first no_gpu job: nothing of it ran
            assert "found no GPU" in r["error"], r
        elif r["kernel"] in SHAPE_LIMITED:  # 24 at 128^3: refused by its size rule, before the GPU
            assert r["status"] == "unsupported_size" and "min(m, n) <= 32" in r["error"], r
        else:
            assert r["status"] in ("ok", "no_gpu"), r
        if r["status"] != "ok":
            assert r["gflops"] is None and r["error"]
    assert sum(r["status"] == "no_gpu" for r in records.values()) <= 1
    summary = (sweep / "summary.md").read_text()
    for name in ALL_KERNELS:
        assert name in summary
    assert (sweep / "summary.csv").is_file()

    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert json.loads((sweep / "mlflow_parent.json").read_text())["run_id"] == parent.info.run_id
    by_title = {f"{r['kernel']} {r['m']}³": r for r in records.values()  # run.py's run names
                if r["status"] != "not_run"}
    assert sorted(job.info.run_name for job in jobs) == sorted(by_title)  # one per job that ran
    ok = sum(r["status"] == "ok" for r in records.values())
    outcome = f"{len(jobs)} jobs: {ok} ok" + (f", {len(jobs) - ok} failed" if ok < len(jobs) else "")
    assert parent.info.run_name == f"kernel=glob(*) size=128 bench=quick ({outcome})"  # what it swept
    assert parent.data.metrics["jobs_failed"] == len(jobs) - ok
    for job in jobs:
        record = by_title[job.info.run_name]
        assert job.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert job.info.status == ("FINISHED" if record["status"] == "ok" else "FAILED")
        assert job.data.tags["status"] == record["status"]
        assert job.data.params["kernel"] == record["kernel"]
        assert ("gflops" in job.data.metrics) == (record["status"] == "ok")
    ok = sum(r["status"] == "ok" for r in records.values())
    assert (parent.data.tags["jobs"], parent.data.tags["jobs_ok"], parent.data.tags["jobs_failed"]) \
        == (str(len(by_title)), str(ok), str(len(by_title) - ok))  # the jobs that ran
    assert (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlruns").is_dir()  # beside it

    bad = run_cli(tmp_path / "bad", "-m", "kernel=06_vectorize", "kernel.params.bk=6,8",
                  "size=128", "bench=quick", "mlflow.enabled=false")
    statuses = {json.loads(p.read_text())["params"]["bk"]: json.loads(p.read_text())["status"]
                for p in (tmp_path / "bad" / "sweep").glob("*/record.json")}
    assert_sweep_exit(bad, [{"status": status} for status in statuses.values()])
    assert statuses[6] == "invalid_params" and statuses[8] in ("ok", "no_gpu")
    assert "invalid_params" in (tmp_path / "bad" / "sweep" / "summary.md").read_text()
    assert not (tmp_path / "bad" / "sweep" / "mlflow_parent.json").exists()  # tracking off


def test_a_failed_single_run_is_one_failed_run(tmp_path, tracking_uri):
    """The store and experiment named in the config (MLFLOW_TRACKING_URI names another)."""
    proc = run_cli(tmp_path, "kernel=06_vectorize", "kernel.params.bk=6",
                   f"mlflow.tracking_uri={tracking_uri}", "mlflow.experiment_name=tiles")
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "error [invalid_params]" in output and "Traceback" not in output
    parents, jobs = tracked_runs(tracking_uri)
    assert jobs == [] and len(parents) == 1  # one run, no parent
    run = parents[0]
    assert run.info.status == "FAILED" and run.data.tags["status"] == "invalid_params"
    assert run.data.params["kernel.params.bk"] == "6" and "gflops" not in run.data.metrics
    assert "tm % 4 == 0 and tn % 4 == 0 and bk % 4 == 0" in run.data.tags["error"]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    assert client.get_experiment(run.info.experiment_id).name == "tiles"
    error = Path(client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path)))
    # error.txt is the error wrapped for reading: the same words as the record's
    recorded = json.loads((tmp_path / "run" / "record.json").read_text())["error"]
    assert error.read_text().split() == recorded.split()


@pytest.mark.integration  # joblib's worker processes, as SLURM's (tests/test_slurm.py)
def test_a_sweep_under_another_launcher_nests_jobs_from_other_processes(tmp_path, tracking_uri):
    """Hydra's joblib launcher runs the jobs in worker processes (and pickles the callbacks to
    them): they find the parent run through the sweep directory."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = run_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                   "kernel=01_naive,06_vectorize", "size=128", "bench=quick",
                   MLFLOW_TRACKING_URI=tracking_uri)
    # (joblib's loky processes print a traceback of their own at exit: not the lab's)
    assert_sweep_exit(proc, [json.loads(p.read_text())
                             for p in (tmp_path / "sweep").glob("*/record.json")], clean=False)
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(jobs) == 2
    parent = parents[0]
    for job in jobs:
        assert job.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert job.data.tags["pid"] != parent.data.tags["pid"]  # another process
    assert parent.data.tags["jobs"] == "2"


# `python -m src.run ...` whose worker process takes long per job (as a GPU job does); its jobs
# run in this process, as on one GPU, whatever GPUs the machine has (the stand-in is patched here).
SLOW_JOB = """
import os
import runpy
import src.sweep.worker
import tests.fault_jobs

os.environ["CUDA_VISIBLE_DEVICES"] = ""
src.sweep.worker._serve = tests.fault_jobs.slow_serve
runpy.run_module("src.run", run_name="__main__", alter_sys=True)
"""


def test_sigterm_mid_sweep_leaves_runs_killed_not_running(tmp_path, tracking_uri):
    """The launching process gets SIGTERM while its first job runs: that job's run and the
    sweep's run end KILLED, the rest of the sweep never starts, exit status 143. (Ctrl-C takes
    the same path; tests/test_tracking.py sends a real SIGINT.)"""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_JOB, "-m", "kernel=01_naive,06_vectorize", "size=128",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(MLFLOW_TRACKING_URI=tracking_uri), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # bounded by the process: it sleeps 120 s at most per job
            lines.append(line)
            if "job started in worker " in line:  # a line of the launcher may run into it
                break
        assert lines and "job started in worker " in lines[-1], "".join(lines)
        worker_pid = int(lines[-1].split()[-1])
        proc.send_signal(signal.SIGTERM)
        output = "".join(lines) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, output
    assert "interrupted: " in output and "Traceback" not in output
    parents, jobs = tracked_runs(tracking_uri)
    assert len(parents) == 1 and len(jobs) == 1, output  # the sweep stopped in its first job
    assert parents[0].info.status == "KILLED" and jobs[0].info.status == "KILLED"
    assert parents[0].data.tags["jobs_killed"] == "1"
    with pytest.raises(ProcessLookupError):  # the job's worker process went with its launcher
        os.kill(worker_pid, 0)
