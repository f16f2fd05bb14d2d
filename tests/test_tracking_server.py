"""A real `mlflow server` on 127.0.0.1, read over its REST API as the UI reads it: a sweep logged
to the local sqlite store (then served, as `mlflow ui` in the project root serves it), and a
sweep logged through the server (a shared tracking server, artifacts proxied)."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import load_jsonl

pytestmark = pytest.mark.integration  # a real `mlflow server` process

requests = pytest.importorskip("requests")
pytest.importorskip("mlflow")

from tests.replay import job_name, replay_job, start_sweep  # noqa: E402

STARTUP_SECONDS = 60
PARENT = "mlflow_parent.json"


def _full_mlflow_missing() -> str | None:
    try:
        importlib.metadata.version("mlflow")
    except importlib.metadata.PackageNotFoundError:
        return ("the tracking server needs the full `mlflow` package (only mlflow-skinny is "
                "installed here): pip install mlflow")
    return None


@pytest.fixture
def server(tmp_path, mlflow_template):
    """`mlflow server` on a free port over a store holding one sweep logged directly to it."""
    reason = _full_mlflow_missing()
    if reason:
        pytest.skip(reason)
    import shutil

    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(mlflow_template, store / "mlflow.db")
    local_uri = f"sqlite:///{store / 'mlflow.db'}"
    records = load_jsonl("records_h100_mixed.jsonl")
    callback, config = start_sweep(local_uri, tmp_path / "local-sweep")
    parent = callback.sweep.parent
    for num, record in enumerate(records):
        replay_job(record, local_uri, job_name(num, record), parent, tmp_path / "local-sweep")
    callback.on_multirun_end(config)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", local_uri,
         "--artifacts-destination", str(store / "mlartifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not come up within {STARTUP_SECONDS} s "
                            f"(exit {proc.poll()}):\n{(tmp_path / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield {"url": url, "local_parent": parent, "local_records": records, "tmp": tmp_path}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def search(url: str, experiment_id: str, filter_string: str) -> list[dict]:
    reply = requests.post(f"{url}/api/2.0/mlflow/runs/search", timeout=30, json={
        "experiment_ids": [experiment_id], "filter": filter_string, "max_results": 1000})
    reply.raise_for_status()
    return reply.json().get("runs", [])


def experiment_id(url: str, name: str) -> str:
    reply = requests.get(f"{url}/api/2.0/mlflow/experiments/get-by-name",
                         params={"experiment_name": name}, timeout=30)
    reply.raise_for_status()
    return reply.json()["experiment"]["experiment_id"]


def get_artifact(url: str, run_id: str, path: str) -> requests.Response:
    """As the UI fetches a run's file."""
    reply = requests.get(f"{url}/get-artifact", params={"path": path, "run_uuid": run_id}, timeout=30)
    reply.raise_for_status()
    return reply


def as_dict(entries: list[dict]) -> dict:
    return {e["key"]: e["value"] for e in entries}


def check_sweep(url: str, experiment: str, parent_id: str, records) -> None:
    exp = experiment_id(url, experiment)
    sweeps = search(url, exp, "tags.kind = 'sweep'")
    assert parent_id in [run["info"]["run_id"] for run in sweeps]
    children = search(url, exp, f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert len(children) == len(records)
    by_name = {run["info"]["run_name"]: run for run in children}
    for num, record in enumerate(records):
        run = by_name[job_name(num, record)]
        assert run["info"]["status"] == ("FINISHED" if record.ok else "FAILED")
        params = as_dict(run["data"]["params"])
        metrics = as_dict(run["data"].get("metrics", []))
        assert params["kernel"] == record.kernel and params["m"] == str(record.m)
        if record.ok:
            assert metrics["gflops"] == round(record.gflops, 1)  # rounded for reading
        else:
            assert "gflops" not in metrics
            # error.txt is the error wrapped for reading: the same words as the record's
            assert get_artifact(url, run["info"]["run_id"], "error.txt").text.split() == \
                record.error.split()
        assert get_artifact(url, run["info"]["run_id"], "record.json").json()["status"] == record.status
    parent = requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": parent_id},
                          timeout=30).json()["run"]
    assert parent["info"]["status"] == "FINISHED"
    tags = as_dict(parent["data"]["tags"])
    failed = sum(not r.ok for r in records)
    assert (tags["jobs"], tags["jobs_failed"]) == (str(len(records)), str(failed))
    table = get_artifact(url, parent_id, "summary_table.json").json()
    assert len(table["data"]) == len(records)
    assert get_artifact(url, parent_id, "gflops.png").content.startswith(b"\x89PNG")


def test_the_server_shows_local_and_served_sweeps(server):
    url = server["url"]
    # 1. The sweep logged straight to the sqlite store, artifacts in mlruns/ beside it.
    check_sweep(url, "sgemm-lab/config", server["local_parent"].run_id, server["local_records"])

    # 2. A sweep logged through the server, into an experiment the server creates (artifacts
    #    proxied to its --artifacts-destination).
    records = load_jsonl("records_h100_progression.jsonl")[::4]
    sweep_dir = server["tmp"] / "served-sweep"
    callback, config = start_sweep(url, sweep_dir, "mlflow.experiment_name=shared")
    parent = callback.sweep.parent
    for num, record in enumerate(records):
        replay_job(record, url, job_name(num, record), parent, sweep_dir)
    callback.on_multirun_end(config)
    check_sweep(url, "shared", parent.run_id, records)
    stored = list(Path(server["tmp"] / "store" / "mlartifacts").rglob("record.json"))
    assert len(stored) == len(records)  # uploaded through the server

    # 3. A sweep through the server with credentials in the URI, given as the environment's
    #    $MLFLOW_TRACKING_URI (issues 22, 35; the command line refuses them): the password is
    #    nowhere: not on the console, not in the sweep directory's files (mlflow_parent.json,
    #    Hydra's copies of the command line), not in any run's params, tags or config.yaml.
    from tests.test_robust import finish, start

    secret_uri = url.replace("http://", "http://alice:s3cret@")
    proc = start(server["tmp"], "-m", "kernel=01_naive,06_vectorize", "size=128",
                 "mlflow.experiment_name=secret", f"hydra.sweep.dir={server['tmp']}/secret-sweep",
                 serve="paced_serve", MLFLOW_TRACKING_URI=secret_uri)
    output = finish(proc)
    assert proc.returncode == 0, output
    assert "s3cret" not in output, [line for line in output.splitlines() if "s3cret" in line]
    assert "job 1 of 2" in output and "job 2 of 2" in output
    files = [p for p in (server["tmp"] / "secret-sweep").rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in files) and any(p.name == PARENT for p in files)
    assert [p for p in files if "s3cret" in p.read_text(errors="replace")] == []
    runs = search(url, experiment_id(url, "secret"), "")
    assert len(runs) == 3
    for run in runs:
        values = [e["value"] for e in run["data"].get("params", []) + run["data"].get("tags", [])]
        assert not [v for v in values if "s3cret" in v], run["info"]["run_name"]
        if "mlflow.parentRunId" in as_dict(run["data"]["tags"]):
            config = get_artifact(url, run["info"]["run_id"], "config.yaml").text
            assert "mlflow:" in config and "s3cret" not in config
