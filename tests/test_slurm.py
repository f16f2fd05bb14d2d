"""Sweeps on a SLURM cluster, tracked on a shared MLflow server with a PostgreSQL store: the real
engines (tests/cluster.py starts them on loopback and stops them), on a CPU machine. Every job
ends no_gpu there (a GPU machine: ok); what is checked is where the jobs ran and what was
recorded: SLURM ran each job with its GPU's constraint, each job wrote its record and is a child
of its sweep in the server's PostgreSQL store, with its files served by the server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import cluster
from tests.conftest import ROOT

pytestmark = pytest.mark.integration  # real SLURM daemons, PostgreSQL and an MLflow server

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytest.importorskip("psycopg2")
pytest.importorskip("mlflow.server")

SWEEP_TIMEOUT_S = 240
# a GPU node runs the kernels; on a CPU node the first job says no_gpu and the sweep's jobs after
# it are not run (recorded not_run, with no MLflow run of their own)
STATUSES = {"ok", "no_gpu", "not_run"}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    reason = cluster.ensure_engines()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("engines")
    daemons = cluster.Daemons()
    postgres = slurm = None
    try:
        slurm = cluster.start_slurm(daemons, base / "slurm")
        postgres = cluster.start_postgres(daemons)
        url = cluster.start_mlflow_server(daemons, postgres.uri, base / "mlartifacts",
                                          base / "mlflow-server.log")
        yield {"slurm": slurm, "postgres": postgres, "url": url, "artifacts": base / "mlartifacts"}
    finally:
        try:
            if slurm is not None:
                slurm.cancel_all()
        finally:
            daemons.stop()
        if postgres is not None:
            shutil.rmtree(postgres.dir, ignore_errors=True)


def sweep_cmd(sweep_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "src.run", "-m", "hydra/launcher=slurm",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=5", "size=128",
            "bench=quick", f"hydra.sweep.dir={sweep_dir}", *args]


def sweep_env(engines, tracking_uri: str | None = None) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(engines["slurm"].env, PYTHONPATH=path, HYDRA_FULL_ERROR="0",
                MLFLOW_TRACKING_URI=tracking_uri or engines["url"])


def run_sweep(engines, sweep_dir: Path, *args: str, tracking_uri: str | None = None):
    return subprocess.run(sweep_cmd(sweep_dir, *args), cwd=ROOT, env=sweep_env(engines, tracking_uri),
                          capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)


def server_runs(url: str) -> tuple[list, list]:
    """(sweep runs, job runs) as the server has them; none left RUNNING."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("sgemm-lab/config")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert not [run.info.run_name for run in runs if run.info.status == "RUNNING"]
    sweeps = [run for run in runs if run.data.tags.get("kind") == "sweep"]
    return sweeps, [run for run in runs if run.data.tags.get("kind") == "job"]


def slurm_job(engines, job_id: str) -> dict[str, str]:
    """`scontrol show job` as key=value pairs (the controller keeps ended jobs MinJobAge s)."""
    text = engines["slurm"].run("scontrol", "show", "job", "-o", job_id)
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def children_of(jobs: list, sweep) -> list:
    return [run for run in jobs if run.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]


def test_a_sweep_over_gpus_runs_under_slurm_and_nests_in_the_postgres_backed_server(engines, tmp_path):
    from mlflow import MlflowClient

    sweep_dir = tmp_path / "sweep"
    proc = run_sweep(engines, sweep_dir, "gpu=h100_sxm,h200", "kernel=01_naive,06_vectorize")
    output = proc.stdout + proc.stderr
    # a CPU node: every job ends no_gpu, so the sweep says no job succeeded and exits 1
    assert proc.returncode == 1 and "no_job_succeeded" in output, output
    for line in ("-> SLURM job", "constraint=h100_sxm", "constraint=h200", "4 jobs"):
        assert line in output, output

    # every job wrote its record in its job directory
    records = {path.parent.name: json.loads(path.read_text())
               for path in sweep_dir.glob("*/record.json")}
    assert len(records) == 4 and {r["status"] for r in records.values()} <= STATUSES, records

    # ... and is a child of the sweep's run on the server, run by SLURM on the node its GPU
    # config's constraint selects
    sweeps, jobs = server_runs(engines["url"])
    sweep = next(run for run in sweeps if run.data.tags["sweep_dir"] == str(sweep_dir))
    ran = {name: r for name, r in records.items() if r["status"] != "not_run"}  # runs of their own
    assert sweep.info.status == "FINISHED" and sweep.data.tags["jobs"] == str(len(ran))
    children = children_of(jobs, sweep)
    by_run = {record["mlflow_run_id"]: record for record in ran.values()}
    assert sorted(run.info.run_id for run in children) == sorted(by_run)
    client = MlflowClient(engines["url"])
    for run in children:
        tags, params = run.data.tags, run.data.params
        assert tags["status"] == by_run[run.info.run_id]["status"]
        assert run.info.status == ("FINISHED" if tags["status"] == "ok" else "FAILED")
        assert tags["pid"] != sweep.data.tags["pid"]
        job = slurm_job(engines, tags["slurm_job_id"])
        assert job["JobState"] == "COMPLETED" and job["Features"] == params["gpu.name"], job
        assert job["ArrayJobId"] == tags["slurm_array_job_id"]
        assert tags["slurm_node"] == job["NodeList"] and tags["slurm_partition"] == job["Partition"]
        assert "gpu:1" in job.get("TresPerNode", "") + job.get("TresPerJob", ""), job  # one GPU
        # the files go through the server: the store names no path of this machine
        assert run.info.artifact_uri.startswith("mlflow-artifacts:/"), run.info.artifact_uri
        served = json.loads(Path(client.download_artifacts(run.info.run_id, "record.json",
                                                           str(tmp_path))).read_text())
        assert served == by_run[run.info.run_id]

    # the runs are in PostgreSQL (the server's backend store), with no absolute artifact paths
    import psycopg2

    pg = engines["postgres"]
    with psycopg2.connect(host="127.0.0.1", port=pg.port, user="mlflow", dbname="mlflow") as db:
        with db.cursor() as cur:
            cur.execute("SELECT r.status, t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                        "WHERE t.key = 'mlflow.parentRunId' AND t.value = %s", (sweep.info.run_id,))
            assert len(cur.fetchall()) == len(ran)  # every job that ran, in the database itself
            cur.execute("SELECT artifact_uri FROM runs UNION SELECT artifact_location FROM experiments")
            locations = [row[0] for row in cur.fetchall()]
    assert locations and all(loc.startswith("mlflow-artifacts:/") for loc in locations), locations


def wait_for_line(folder: Path, pattern: str, needle: str, deadline: float) -> Path:
    """The first file under `folder` matching `pattern` that holds `needle`."""
    while time.monotonic() < deadline:
        for path in folder.glob(pattern):
            if needle in path.read_text(errors="replace"):
                return path
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} never appeared in {folder}/{pattern}")


def test_a_job_slurm_stops_ends_killed_and_resume_reruns_it(engines, tmp_path):
    """scancel sends what a time limit or a preemption sends (SIGTERM, then SIGKILL after
    KillWait): the job's run ends KILLED, the sweep's too, and resume=true runs it again."""
    sweep_dir = tmp_path / "sweep"
    slow = "+hydra.callbacks.slow._target_=tests.fault_jobs.SlowJobs"  # each job takes 2 minutes
    proc = subprocess.Popen(sweep_cmd(sweep_dir, "kernel=01_naive", slow), cwd=ROOT,
                            env=sweep_env(engines), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        log = wait_for_line(sweep_dir, ".submitit/*/*_log.out", "job started in worker",
                            time.monotonic() + 90)
        job_id = log.parent.name  # submitit's folder per SLURM job
        engines["slurm"].run("scancel", job_id)
        output = proc.communicate(timeout=90)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, output
    assert "stopped by SLURM" in output and "resume=true" in output, output
    assert not list(sweep_dir.glob("*/record.json"))  # written whole or not at all
    sweeps, jobs = server_runs(engines["url"])
    sweep = next(run for run in sweeps if run.data.tags["sweep_dir"] == str(sweep_dir))
    [killed] = children_of(jobs, sweep)
    assert killed.info.status == "KILLED" and killed.data.tags["status"] == "killed"
    assert "stopped by SLURM (signal SIGTERM" in killed.data.tags["error"]
    assert sweep.info.status == "KILLED" and sweep.data.tags["jobs_killed"] == "1"

    rerun = run_sweep(engines, sweep_dir, "kernel=01_naive", "resume=true")
    assert rerun.returncode == 1 and "no_job_succeeded" in rerun.stdout + rerun.stderr, \
        rerun.stdout + rerun.stderr  # the re-run job ends no_gpu on this CPU node
    [record] = [json.loads(p.read_text()) for p in sweep_dir.glob("*/record.json")]
    assert record["status"] in STATUSES
    sweeps, jobs = server_runs(engines["url"])
    resumed = [run for run in sweeps if run.data.tags["sweep_dir"] == str(sweep_dir)
               and run.info.run_id != sweep.info.run_id]
    assert len(resumed) == 1 and resumed[0].info.status == "FINISHED"
    [rerun_job] = children_of(jobs, resumed[0])
    assert rerun_job.data.tags["status"] == record["status"]


def test_an_unreachable_tracking_server_is_a_tracking_error_before_any_job(engines, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    jobs_before = engines["slurm"].run("squeue", "-h", "-t", "all", "-o", "%i")
    started = time.monotonic()
    proc = run_sweep(engines, tmp_path / "sweep", "kernel=01_naive", tracking_uri=dead)
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "error [tracking_error]" in output and dead in output and "unreachable" in output, output
    assert elapsed < 60, f"took {elapsed:.0f} s: MLflow's retries were not cut short"
    assert not (tmp_path / "sweep" / ".submitit").exists()  # nothing was submitted
    assert engines["slurm"].run("squeue", "-h", "-t", "all", "-o", "%i") == jobs_before


def test_a_tuning_sweep_runs_its_trials_as_slurm_jobs(engines, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_sweep(engines, sweep_dir, "+tune=10_warptiling", "size=1024", "tune.strategy=tpe",
                     "tune.trials=3", "tune.batch=2")
    output = proc.stdout + proc.stderr
    # tuned from a login node with no GPU: the trials run on the (CPU) node, each no_gpu
    assert proc.returncode == 1 and "no_job_succeeded" in output, output
    assert "measured: 3" in output and output.count("-> SLURM job") == 3, output
    sweeps, jobs = server_runs(engines["url"])
    sweep = next(run for run in sweeps if run.data.tags["sweep_dir"] == str(sweep_dir))
    assert sweep.info.status == "FINISHED" and sweep.data.tags["tune_measured"] == "3"
    trials = children_of(jobs, sweep)
    # every trial that ran is a run of its SLURM job; on a CPU node those after the first no_gpu
    # one may be recorded not_run, without a run (trials start at once, so 1 to 3 ran)
    assert 1 <= len(trials) <= 3 and all(run.data.tags["slurm_job_id"] for run in trials)
    assert {run.data.tags["status"] for run in trials} <= STATUSES
