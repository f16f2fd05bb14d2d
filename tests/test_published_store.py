"""The published MLflow store (src/publish/store.py): built from the published runs CSVs, opened
by `sgemm-lab ui --published` / `links --published` on a machine without a GPU. One store is
built for the module (a real sqlite store in a tmp dir, seconds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
from mlflow import MlflowClient

from src import cli
from src.publish import store as published
from src.sweep.tracking.views import SHARED_VIEW_PREFIX, VIEWS
from tests.conftest import ROOT

SOURCES = list(published.DEFAULT_SOURCES)  # every published GPU set: what links/ui --published read


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    db = tmp_path_factory.mktemp("published") / "mlflow.db"
    assert published.ensure_published(db, SOURCES) is True
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(published.EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=5000)
    return {"db": db, "client": client, "experiment": experiment, "runs": runs,
            "jobs": [r for r in runs if r.data.tags.get("kind") == "job"],
            "sweeps": [r for r in runs if r.data.tags.get("kind") == "sweep"]}


def rows_of(source) -> pd.DataFrame:
    return pd.read_csv(source, dtype={"job": str, "status": str, "error": str})


def job_runs(built, source) -> dict[str, object]:
    """The store's job runs from `source`, by the CSV's job column."""
    prefix = f"{source.relative_to(ROOT).as_posix()}:"
    return {r.data.tags["source"][len(prefix):]: r for r in built["jobs"]
            if r.data.tags["source"].startswith(prefix)}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_row_is_a_run_under_its_sources_parent(built, source):
    rows = rows_of(source)
    runs = job_runs(built, source)
    assert sorted(runs) == sorted(rows["job"])
    [parent] = [r for r in built["sweeps"] if r.data.tags["source"] == source.relative_to(ROOT).as_posix()]
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {parent.info.run_id}
    failed = int((rows["status"] != "ok").sum())
    assert parent.data.metrics == {"jobs": len(rows), "jobs_ok": len(rows) - failed,
                                   "jobs_failed": failed}
    for row in rows.to_dict("records"):
        run = runs[row["job"]]
        assert run.info.status == ("FINISHED" if row["status"] == "ok" else "FAILED")
        assert run.data.tags["status"] == row["status"]
        assert (run.data.params["kernel"], run.data.params["m"]) == (row["kernel"], str(row["m"]))
        assert "nothing here was measured on this machine" in run.data.tags["mlflow.note.content"]
    assert len(built["jobs"]) == sum(len(rows_of(s)) for s in SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_metrics_are_the_rows_figures_rounded(built, source):
    runs = job_runs(built, source)
    for row in rows_of(source).to_dict("records"):
        metrics = runs[row["job"]].data.metrics
        if row["status"] != "ok":
            assert "gflops" not in metrics
            continue
        assert metrics["gflops"] == round(row["gflops"], 1)
        own = row["pct_of_cublas_tf32"] if row["precision"] == "tf32" else row["pct_of_cublas_fp32"]
        assert metrics["pct_of_cublas"] == round(own, 2)


def test_a_failed_runs_description_is_its_error(tmp_path):
    """A job that failed becomes a FAILED run whose description is its error. The runs published
    on 2026-11-26 hold no failure, so one row of the published suite is recorded here as the
    throttled job it could have been."""
    rows = rows_of(SOURCES[1]).head(4).copy()
    error = ("only 3 of 300 timed rounds are usable, fewer than bench.min_samples=20 (rule: a job "
             "needs at least min_samples rounds ...)\nthe clocks seen")
    rows.loc[rows.index[0], ["status", "error", "gflops"]] = ["failed_throttled", error, None]
    source = tmp_path / "suite_runs.csv"
    rows.to_csv(source, index=False)
    db = tmp_path / "mlflow.db"
    assert published.ensure_published(db, [source]) is True
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(published.EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    [run] = [r for r in runs if r.data.tags.get("status") == "failed_throttled"]
    assert run.info.status == "FAILED"
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**failed_throttled**")
    assert " ".join(error.split()) in " ".join(note.split())
    assert run.data.tags["error"] == error.splitlines()[0][:500]


def search(built, key: str) -> list:
    """What the UI shows for the saved view `key`: its filter and sort, as MLflow runs them."""
    tag = built["experiment"].tags[SHARED_VIEW_PREFIX + key]
    envelope = json.loads(tag)
    state = json.loads(envelope["state"])
    assert envelope["name"] == VIEWS[key].name
    assert state["selectedColumns"] == list(VIEWS[key].columns)
    order = f"{state['orderByKey']} {'ASC' if state['orderByAsc'] else 'DESC'}"
    return built["client"].search_runs([built["experiment"].experiment_id], state["searchFilter"],
                                       order_by=[order], max_results=1000)


def test_the_saved_views_answer_the_readmes_questions(built):
    rows = pd.concat([rows_of(s) for s in SOURCES])  # every GPU's progression and suite
    at_4096 = rows[(rows.m == 4096) & (rows.n == 4096) & (rows.k == 4096) & (rows.status == "ok")]
    fastest = at_4096[at_4096.precision == "fp32"].sort_values("gflops", ascending=False)
    shown = search(built, "sgemm-lab-fp32-4096")
    assert [r.data.params["kernel"] for r in shown] == list(fastest["kernel"])
    assert shown[0].data.metrics["pct_of_cublas"] == round(fastest.iloc[0]["pct_of_cublas_fp32"], 2)
    failed = search(built, "sgemm-lab-failed")
    assert sorted(r.data.tags["source"].split(":", 1)[1] for r in failed) == \
        sorted(rows[rows.status != "ok"]["job"])
    note = built["experiment"].tags["mlflow.note.content"]
    for key in VIEWS:  # the experiment's description links every question
        assert f"viewStateShareKey={key}" in note or key == "sgemm-lab-runs"


def test_the_store_is_rebuilt_only_when_its_sources_change(built, tmp_path):
    assert published.ensure_published(built["db"], SOURCES) is False  # as built: kept
    source = tmp_path / "runs.csv"
    rows_of(SOURCES[0]).head(3).to_csv(source, index=False)
    db = tmp_path / "store" / "mlflow.db"
    assert published.ensure_published(db, [source]) is True
    assert published.ensure_published(db, [source]) is False
    rows_of(SOURCES[0]).head(2).to_csv(source, index=False)  # a new published run
    assert published.ensure_published(db, [source]) is True
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(published.EXPERIMENT)
    assert len(client.search_runs([experiment.experiment_id], "tags.kind = 'job'")) == 2


def test_a_file_that_is_not_a_runs_csv_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "runs.csv"
    bad.write_text("a,b\n1,2\n")
    assert published.main([str(bad), "-o", str(tmp_path / "x.db")]) == 1
    assert "is not a runs CSV" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()  # nothing half-built is left


def lab(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """`sgemm-lab ARGS` (python -m src.cli) with no GPU visible."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "src.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_links_published_answers_without_a_gpu(built):
    proc = lab("links", "--published", "--store", str(built["db"]), "--port", "5123")
    assert proc.returncode == 0, proc.stderr
    experiment = built["experiment"].experiment_id
    for key in VIEWS:  # each printed link opens a view the store holds
        url = f"http://127.0.0.1:5123/#/experiments/{experiment}/runs?viewStateShareKey={key}"
        assert url in proc.stdout
        assert SHARED_VIEW_PREFIX + key in built["experiment"].tags
    assert "building" not in proc.stderr  # built already: not again


def test_ui_published_serves_the_published_store_quietly(built, monkeypatch, capsys):
    import uvicorn
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR, REGISTRY_STORE_URI_ENV_VAR

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(
        (options, os.environ[BACKEND_STORE_URI_ENV_VAR])))
    for name in (BACKEND_STORE_URI_ENV_VAR, REGISTRY_STORE_URI_ENV_VAR,
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"):
        monkeypatch.delenv(name, raising=False)  # restored after the test (serve sets them)
    assert cli.main(["ui", "--published", "--store", str(built["db"]), "--port", "5078"]) == 0
    [(options, uri)] = calls
    assert options["workers"] == 1 and options["log_level"] == "warning"
    assert uri == f"sqlite:///{built['db'].resolve()}"
    out = capsys.readouterr().out
    assert "moved" not in out and "viewStateShareKey=sgemm-lab-runs" in out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_ui_published_answers_from_one_process(built):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    server = subprocess.Popen(
        [sys.executable, "-m", "src.cli", "ui", "--published", "--store", str(built["db"]),
         "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "ui did not start"
                time.sleep(0.3)
        group = subprocess.run(["ps", "-o", "pid=", "-s", str(server.pid)], capture_output=True,
                               text=True).stdout.split()
        assert group == [str(server.pid)]
        request = urllib.request.Request(
            f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name="
            + urllib.request.quote(published.EXPERIMENT))
        with urllib.request.urlopen(request, timeout=30) as reply:
            tags = {t["key"] for t in json.loads(reply.read())["experiment"]["tags"]}
        assert {SHARED_VIEW_PREFIX + key for key in VIEWS} <= tags
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert "Warning" not in output and "moved" not in output
    assert len(output.splitlines()) <= 12  # the links and one line: no server log
