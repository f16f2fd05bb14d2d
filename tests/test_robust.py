"""Robust under concurrency, interruption and bad state (issue 22), as a demanding user tries it:
the real runner, Hydra, MLflow stores and callbacks, with the GPU replaced by a pretend H100 and
stand-in workers (tests/fault_jobs.py) where a job would need one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fault_jobs import FAKE_GPU_RUN
from tests.test_cli import SLOW_JOB, cli_env, run_cli

# The default sweep directory's pattern, under a test's tmp_path; the date alone stands for the
# time, so that sweeps started together surely share the timestamp part.
SAME_TIME_DIR = "{root}/multirun/${{now:%Y-%m-%d}}_${{pid:}}"


def start(tmp_path: Path, *args: str, serve: str = "ok_serve", **env: str) -> subprocess.Popen:
    """`python -m src.run ARGS` on a pretend H100, not waited for."""
    return subprocess.Popen([sys.executable, "-c", FAKE_GPU_RUN, *args], cwd=ROOT,
                            env=cli_env(FAKE_SERVE=serve, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sweep_dirs(root: Path) -> dict[int, Path]:
    """Sweep directories under root/multirun by the pid of the sweep that claimed each."""
    found = {}
    for claim in root.glob("multirun/*/.sweep"):
        found[int(claim.read_text().split()[1])] = claim.parent
    return found


def store_runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              max_results=1000)


def check_sweep_intact(sweep_dir: Path, runs: list, finished: bool) -> None:
    """Every record of the sweep has its own FINISHED MLflow run under this sweep's parent; the
    parent's children are exactly this sweep's jobs; nothing RUNNING."""
    parent_id = json.loads((sweep_dir / "mlflow_parent.json").read_text())["run_id"]
    by_id = {run.info.run_id: run for run in runs}
    parent = by_id[parent_id]
    assert parent.info.status == ("FINISHED" if finished else "KILLED"), parent.info
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/record.json")}
    recorded_runs = {record["mlflow_run_id"] for record in records.values()}
    assert {c.info.run_id for c in children} >= recorded_runs  # a killed job has no record
    for record in records.values():
        run = by_id[record["mlflow_run_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert run.info.status == "FINISHED" and record["status"] == "ok"
    for child in children:
        assert child.info.status in ("FINISHED", "KILLED"), child.info
        assert (child.info.status == "FINISHED") == (child.info.run_id in recorded_runs)
    if finished:
        assert len(records) == len(children) and (sweep_dir / "summary.md").is_file()


@pytest.mark.integration  # two real sweeps at once (tests/test_soak.py: four, interrupted)
def test_two_sweeps_started_together_on_a_fresh_store_keep_apart(tmp_path):
    """Both finish (no `table … already exists` from racing MLflow's migrations of a fresh
    sqlite store) and, started in the same second, each has its own directory and parent run."""
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"  # not there yet: created by the sweeps
    procs = [start(tmp_path, "-m", "kernel=01_naive,06_vectorize", "size=128",
                   f"hydra.sweep.dir={SAME_TIME_DIR.format(root=tmp_path)}",
                   serve="paced_serve", MLFLOW_TRACKING_URI=uri) for _ in range(2)]
    outputs = [finish(proc) for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output
        assert "Traceback" not in output
    dirs = sweep_dirs(tmp_path)
    assert sorted(dirs) == sorted(proc.pid for proc in procs), dirs
    runs = store_runs(uri)
    for sweep_dir in dirs.values():
        check_sweep_intact(sweep_dir, runs, finished=True)
    assert len(runs) == 2 + 4 and not [r for r in runs if r.info.status == "RUNNING"]


@pytest.mark.integration  # four processes importing MLflow at once
def test_a_store_created_by_many_processes_at_once_is_whole(tmp_path):
    """The lower level of the same race: four processes open one fresh store together."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = ("import sys; from src.sweep.tracking.store import client; "
            "print(len(client(sys.argv[1]).search_experiments()))")
    procs = [subprocess.Popen([sys.executable, "-c", code, uri], cwd=ROOT, env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(4)]
    outputs = [finish(proc, 120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outputs
    assert [out.strip().splitlines()[-1] for out in outputs] == ["1"] * 4  # the Default experiment


def test_a_reused_sweep_directory_is_refused_and_the_earlier_records_kept(tmp_path):
    args = ["-m", "kernel=01_naive", "size=128", "mlflow.enabled=false",
            f"hydra.sweep.dir={tmp_path}/sweep"]
    first = start(tmp_path, *args)
    assert first.wait(240) == 0, finish(first)
    record = next((tmp_path / "sweep").glob("*/record.json"))
    before = record.read_text()
    again = start(tmp_path, *args[:2], "kernel=06_vectorize", *args[3:])
    output = finish(again)
    assert again.returncode == 1 and "error [sweep_dir_taken]" in output, output
    assert "each sweep writes to a directory of its own" in output and "Traceback" not in output
    assert record.read_text() == before and len(list((tmp_path / "sweep").glob("*/record.json"))) == 1


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_repeated_signals_leave_no_run_running(tmp_path, tracking_uri, first):
    """Ctrl-C pressed again and again (or SIGTERM repeated) while the sweep cleans up: the
    first signal interrupts, the later ones are ignored, every run ends KILLED."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_JOB, "-m", "kernel=01_naive,06_vectorize", "size=128",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=ROOT, env=cli_env(MLFLOW_TRACKING_URI=tracking_uri), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "job started in worker " in line:  # a line of the launcher may run into it
                break
        proc.send_signal(first)
        time.sleep(0.05)
        deadline = time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:  # through the whole cleanup
            proc.send_signal(signal.SIGINT if proc.pid % 2 else signal.SIGTERM)
            proc.send_signal(first)
            time.sleep(0.005)
        output = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the first signal handled decides (CPython handles SIGINT before a SIGTERM that arrived
    # within the same instant, so with both spammed either status may come)
    assert proc.returncode in (130, 143), output
    says = "interrupted: Ctrl-C" if proc.returncode == 130 else "interrupted: terminated by signal"
    assert says in output, output  # never a blank `interrupted: `
    runs = store_runs(tracking_uri)
    assert len(runs) == 2 and {r.info.status for r in runs} == {"KILLED"}, output


def test_a_sigterm_whose_exception_a_library_swallows_still_stops_the_sweep(tmp_path, tracking_uri):
    """A SIGTERM lands in code that swallows every exception (a library did, once, while Hydra
    validated the next batch): the handler has marked the process interrupted, so the next job
    does not start; the sweep exits 143 and its parent run ends KILLED."""
    proc = start(tmp_path, "-m", "kernel=01_naive,02_gmem_coalesce,03_smem_blocking", "size=128",
                 "+hydra.callbacks.swallow._target_=tests.fault_jobs.SwallowedSigterm",
                 f"hydra.sweep.dir={tmp_path}/sweep", MLFLOW_TRACKING_URI=tracking_uri)
    output = finish(proc, 120)
    assert proc.returncode == 143 and "interrupted: terminated by an earlier signal" in output, output
    assert output.count("GFLOP/s ") == 1  # only the first job ran
    runs = store_runs(tracking_uri)
    parent = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "KILLED"
    assert not [r for r in runs if r.info.status == "RUNNING"]


@pytest.mark.parametrize("uri,needle", [
    ("file:///tmp/mlruns", "sqlite:///<path>.db"),
    ("some/dir/mlruns", "sqlite:///<path>.db"),
    ("sqlite:///", "names no database file"),
    ("sqlite://", "names no database file"),
    ("sqlite:///:memory:", "names no database file"),
])
def test_a_tracking_uri_mlflow_would_refuse_or_lose_is_one_clear_error(tmp_path, uri, needle, caplog):
    """Checked by the sweep's launching process before any job (callbacks.MlflowSweep, here in
    this process; tests/test_cli.py's test_a_tracking_uri_mlflow_cannot_use_is_one_clear_error
    runs the command: the same check, its exit status and output)."""
    from tests.replay import start_sweep

    with pytest.raises(SystemExit) as exited:
        start_sweep(uri, tmp_path / "sweep", "size=128")
    output = caplog.text
    assert exited.value.code == 1 and "error [tracking_error]" in output and needle in output, output
    assert "Traceback" not in output and not list(tmp_path.rglob("record.json"))


def test_an_unreachable_tracking_server_stops_the_sweep_at_once(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = run_cli(tmp_path, "-m", "kernel=01_naive,06_vectorize", "size=128",
                   MLFLOW_TRACKING_URI=f"http://alice:s3cret@127.0.0.1:{port}")
    output = proc.stdout + proc.stderr
    assert time.monotonic() - started < 60  # was ~250 s of retries, once per job
    assert proc.returncode == 1 and output.count("error [tracking_error]") == 1, output
    assert "tracking server" in output and "unreachable" in output and "Traceback" not in output
    assert "s3cret" not in output and f"'http://127.0.0.1:{port}'" in output


def test_credentials_are_redacted_wherever_values_are_written():
    from src.sweep.tracking.credentials import redact
    from src.sweep.tracking.store import flatten

    assert redact("mlflow.tracking_uri=https://bob:pa%40ss@host:5000/x y") == \
        "mlflow.tracking_uri=https://***@host:5000/x y"
    assert redact("postgresql://u:p@db/mlflow") == "postgresql://***@db/mlflow"
    assert redact("x=http://bob:pa@ss@host/y") == "x=http://***@host/y"  # a raw @: no piece left
    assert redact("sqlite:////data/a@b/mlflow.db") == "sqlite:////data/a@b/mlflow.db"  # a path
    assert flatten({"mlflow": {"tracking_uri": "http://u:p@h"}}) == {"mlflow.tracking_uri": "http://***@h"}


def test_credentials_from_the_environment_reach_mlflow_whole(monkeypatch):
    """A raw @ or a percent-encoded character in a password (issue 35): a tracking server gets
    the whole password through MLflow's variables, a database a URI its driver reads whole."""
    from src.sweep.tracking.credentials import take_credentials

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    assert take_credentials("https://bob:pa@ss%3Aw0rd@host:5000/x") == "https://host:5000/x"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "bob"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "pa@ss:w0rd"
    assert take_credentials("postgresql+psycopg2://bob:pa@ss%3Aw0rd@db/mlflow") == \
        "postgresql+psycopg2://bob:pa%40ss%3Aw0rd@db/mlflow"


SECRET = "alice:pa@ss%40s3cret"  # a raw @ and a percent-encoded one


@pytest.mark.parametrize("args", [
    # a sweep that aborts on a bad kernel name (multirun.yaml was written before the abort), to a
    # database whose driver is missing (Hydra printed the override in its error)
    ["-m", "kernel=01_naive,no_such_kernel", f"mlflow.tracking_uri=postgresql+nodriver://{SECRET}@db.invalid/mlflow"],
    # a single run (.hydra/ was written before the run looked at the URI)
    ["kernel=01_naive", f"mlflow.tracking_uri=http://{SECRET}@127.0.0.1:9"],
])
def test_credentials_on_the_command_line_are_refused_before_anything_is_written(tmp_path, args):
    proc = run_cli(tmp_path, *args, "size=128")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [invalid_config]" in output, output
    assert "MLFLOW_TRACKING_PASSWORD" in output and "Traceback" not in output
    assert not [word for word in ("s3cret", "pa@ss", "ss%40") if word in output], output
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_credentials_in_a_config_file_are_refused_and_a_reference_is_not(tmp_path, monkeypatch):
    from src.compose import rules as compose_rules
    from tests.conftest import compose_config

    compose_rules.install()  # as src.run does
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "mlflow" / "leaky.yaml").write_text(f"enabled: true\ntracking_uri: http://{SECRET}@h:5000\n")
    with pytest.raises(compose_rules.ConfigRefused, match="mlflow.tracking_uri") as refused:
        compose_config(f"hydra.searchpath=[file://{tmp_path}]", "mlflow=leaky")
    assert "s3cret" not in str(refused.value) and "pa@ss" not in str(refused.value)
    monkeypatch.setenv("SHARED_MLFLOW", f"http://{SECRET}@h:5000")
    cfg = compose_config("mlflow.tracking_uri=${oc.env:SHARED_MLFLOW}")
    assert cfg.mlflow.tracking_uri == f"http://{SECRET}@h:5000"  # read when the store is opened


def test_a_database_store_that_cannot_open_is_one_clear_error_without_its_password(tmp_path):
    """Credentials from the environment: the store's error (here: no such driver) is one line
    with the URI redacted, not a traceback; nothing written holds the password."""
    proc = run_cli(tmp_path, "size=128",
                   MLFLOW_TRACKING_URI=f"postgresql+nodriver://{SECRET}@db.invalid/mlflow")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "error [tracking_error]" in output, output
    assert "cannot open the database store" in output and "Traceback" not in output
    assert "s3cret" not in output and "'postgresql+nodriver://***@db.invalid/mlflow'" in output
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and "s3cret" in p.read_text(errors="replace")]


def test_a_process_killed_while_creating_the_store_leaves_no_half_store(tmp_path):
    """SIGKILL (nothing can hold it) during MLflow's migrations of a fresh store: the store is
    made in a private file renamed into place when whole, so the next process starts clean
    instead of failing on a half-migrated mlflow.db for good."""
    from src.sweep.tracking.store import client

    db = tmp_path / "mlflow.db"
    code = "import sys; from src.sweep.tracking.store import client; client(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, f"sqlite:///{db}"], cwd=ROOT, env=cli_env())
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".mlflow.db.*.new")) and time.monotonic() < deadline:
        time.sleep(0.01)  # killed once the migrations have begun
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    assert not db.exists() or db.stat().st_size > 0
    assert len(client(f"sqlite:///{db}").search_experiments()) == 1  # made again, whole
    assert not list(tmp_path.glob(".mlflow.db.*"))  # the killed one's leftovers are gone


def test_runs_left_running_by_a_killed_sweep_are_closed_by_the_next_one(tmp_path, tracking_uri):
    """SIGKILL (nothing can end its runs) while a job runs leaves the sweep's run and the job's
    RUNNING; the next sweep on the same store, here with resume=true in the same directory,
    ends them KILLED with the reason, and leaves its own FINISHED."""
    sweep = f"hydra.sweep.dir={tmp_path}/sweep"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_JOB, "-m", "kernel=01_naive,06_vectorize", "size=128", sweep],
        cwd=ROOT, env=cli_env(MLFLOW_TRACKING_URI=tracking_uri), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "job started in worker " in line:  # a line of the launcher may run into it
                break
        proc.kill()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = store_runs(tracking_uri)
    assert len(left) == 2 and {r.info.status for r in left} == {"RUNNING"}
    again = start(tmp_path, "-m", "kernel=01_naive,06_vectorize", "size=128", "resume=true", sweep,
                  MLFLOW_TRACKING_URI=tracking_uri)
    output = finish(again, 180)
    assert again.returncode == 0 and "Traceback" not in output, output
    by_id = {r.info.run_id: r for r in store_runs(tracking_uri)}
    for old in left:
        run = by_id[old.info.run_id]
        assert run.info.status == "KILLED" and run.data.tags["status"] == "killed"
        assert f"its process (pid {proc.pid} on {socket.gethostname()}) ended without closing" \
            in run.data.tags["error"]
    assert len(by_id) == 2 + 3 and not [r for r in by_id.values() if r.info.status == "RUNNING"]
