"""The `sgemm-lab` command (src/cli.py) as a user meets it on a machine without a GPU, and a copied
MLflow store that still shows its files (src/sweep/tracking/portable.py). Real MLflow (sqlite)
stores in tmp dirs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src import cli
from src.sweep.tracking.portable import relocate
from tests.conftest import ROOT, load_jsonl

KERNEL_CONFS = sorted((ROOT / "conf" / "kernel").glob("*.yaml"))


def lab(cwd: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """`sgemm-lab ARGS` (as `python -m src.cli`, what the console script calls) run in `cwd`, with
    no GPU visible."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, "-m", "src.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table_rows(output: str) -> dict[str, str]:
    """The `sgemm-lab kernels` table's rows by their first column."""
    return {line.split()[0]: line for line in output.splitlines() if line[:2].isdigit()
            or line.startswith(("cublas_", "best_", "gemm_", "triton_", "cutlass_"))}


def test_kernels_lists_every_kernel_with_its_precision_and_tuned_gpus(tmp_path):
    proc = lab(tmp_path, "kernels")
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert sorted(rows) == [p.stem for p in KERNEL_CONFS]
    from src.job.config import tuned_config

    composed = {gpu.stem: tuned_config(gpu.stem) for gpu in (ROOT / "conf" / "tuned").glob("*.yaml")}
    tuned = {gpu: set(t["kernels"]) | set(t.get("dispatch") or {}) for gpu, t in composed.items()}
    assert "20_wgmma_tf32" in tuned["h200"]  # h200.yaml starts from the H100's classes
    assert tuned and any(tuned.values())
    for conf in KERNEL_CONFS:
        row = rows[conf.stem].split()
        assert row[1] == OmegaConf.load(conf).precision
        gpus = [gpu for gpu, kernels in sorted(tuned.items()) if conf.stem in kernels]
        tuned_column = row[2:2 + max(len(gpus), 1)]
        assert [g.rstrip(",") for g in tuned_column] == (gpus or ["-"]), rows[conf.stem]
    # the description is the config's own header comment, not a fixed text
    assert "float4" in rows["06_vectorize"] and "TF32" in rows["cublas_tf32"]


def test_results_without_a_gpu_shows_the_published_table(tmp_path):
    proc = lab(tmp_path, "results")
    assert proc.returncode == 0, proc.stderr
    published = (ROOT / "results" / "h100_sxm" / "progression.md").read_text()
    assert published.strip() in proc.stdout
    assert "sgemm-lab results --local" in proc.stdout


def test_results_shows_the_published_table_and_the_newest_sweep_with_local(tmp_path):
    older, newer = (tmp_path / "multirun" / "2026-01-01" / t for t in ("10-00-00", "11-00-00"))
    for sweep, kernel in ((older, "01_naive"), (newer, "17_flagship")):
        sweep.mkdir(parents=True)
        (sweep / "summary.md").write_text(f"| {kernel} | 1.0 |\n")
    os.utime(older / "summary.md", (1, 1))  # newest by time written, not by name
    os.utime(newer / "summary.md", (2, 2))
    (older / "summary.md").touch()
    # by default the published table, even with local sweeps (a sweep without a GPU holds
    # only failures); --local shows the newest sweep here
    proc = lab(tmp_path, "results")
    assert proc.returncode == 0, proc.stderr
    assert "| 01_naive | 1.0 |" not in proc.stdout and "SGEMM progression on NVIDIA H100" in proc.stdout
    proc = lab(tmp_path, "results", "--local")
    assert proc.returncode == 0, proc.stderr
    assert "| 01_naive | 1.0 |" in proc.stdout and "17_flagship" not in proc.stdout


def test_run_passes_its_arguments_to_the_runner(tmp_path):
    """`sgemm-lab run` is `python -m src.run`: same error, same record, same exit status."""
    args = ["kernel=06_vectorize", "kernel.params.bk=6", "mlflow.enabled=false",
            f"hydra.run.dir={tmp_path}/run"]
    proc = lab(tmp_path, "run", *args)
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "error [invalid_params]" in output and "bk % 4 == 0" in output
    assert "Traceback" not in output
    assert '"status": "invalid_params"' in (tmp_path / "run" / "record.json").read_text()


@pytest.mark.parametrize("command", [("-m", "src.run"), ("-m", "src.cli", "run")])
def test_help_lists_what_a_user_picks_and_hides_the_tuned_group(tmp_path, command):
    """`python -m src.run --help` (= `sgemm-lab run --help`): every kernel with its precision and
    description, the gpu, bench, tune and launcher options, and the key overrides, each of
    which names a key of the composed config; `tuned` (read by src/job/config.py) is not offered."""
    from tests.conftest import compose_config

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, *command, "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=path))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    groups, overrides = text.split("== Pick one of each")[1].split("== Key overrides")
    for row in cli.kernel_rows():
        line = next(line for line in groups.splitlines() if line.split()[:1] == [row["kernel"]])
        assert line.split()[1] == row["precision"] and row["what it does"] in line
    for group in ("gpu", "bench", "tune"):
        for option in (ROOT / "conf" / group).glob("*.yaml"):
            assert option.stem in groups.replace("|", " ").split(), option
    assert "hydra/launcher=" in groups and "joblib" in groups and "slurm" in groups
    # the hidden group: neither offered (`tuned=`, `+tuned=`) nor listed as Hydra lists groups
    assert not re.search(r"(^|\s)\+?tuned=|^tuned:", text, re.MULTILINE), text
    cfg = compose_config()
    keys = [line.split("=")[0].strip() for line in overrides.splitlines()[1:]
            if "=" in line.split(" ")[0] and not line.startswith("  ")]
    keys = [k for k in keys if "." not in k or k.split(".")[-1].upper() != k.split(".")[-1]]
    for key in ("size", "alpha", "resume", "debug", "mlflow.enabled", "mlflow.tracking_uri",
                "isolation.mode", "isolation.timeout_s"):
        assert key in keys, key
    for key in keys:
        assert OmegaConf.select(cfg, key, default="missing") != "missing", key


# --- stores ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_template) -> dict:
    """A store made in one folder as the lab makes it: a failed and an ok job replayed through
    the tracking step (each failed run has error.txt among its artifacts)."""
    from tests.replay import replay_job

    folder = tmp_path_factory.mktemp("made-here")
    shutil.copy(mlflow_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mixed = load_jsonl("records_h100_mixed.jsonl")
    failed = next(r for r in mixed if not r.ok)
    ok = next(r for r in mixed if r.ok)
    runs = {"failed": replay_job(failed, uri, "failed"), "ok": replay_job(ok, uri, "ok")}
    return {"folder": folder, "runs": runs, "error": failed.error}


def locations(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for table, column in (("experiments", "artifact_location"),
                                             ("runs", "artifact_uri"))
                for row in conn.execute(f"SELECT {column} FROM {table}")]


def error_txt(db: Path, run_id: str, into: Path) -> str:
    from mlflow import MlflowClient

    into.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(f"sqlite:///{db}")
    return Path(client.download_artifacts(run_id, "error.txt", str(into))).read_text()


def test_a_copied_store_shows_its_artifacts_from_the_new_place(store, tmp_path):
    original = store["folder"]
    before = locations(original / "mlflow.db")
    copy = tmp_path / "elsewhere"
    shutil.copytree(original, copy)
    stale = [loc for loc in locations(copy / "mlflow.db") if "/mlruns/" in loc]
    # what a plain copy points at: the folder it was made in (and MLflow's experiment 0 at the
    # directory the template store was made from)
    assert sum(str(original) in loc for loc in stale) == 3  # the experiment and its two runs
    assert not [loc for loc in stale if str(copy) in loc]

    assert relocate(copy / "mlflow.db") == len(stale)
    moved = locations(copy / "mlflow.db")
    assert [loc for loc in moved if "/mlruns/" in loc] \
        and all(loc.startswith((copy / "mlruns").as_uri()) for loc in moved if "/mlruns/" in loc)
    assert relocate(copy / "mlflow.db") == 0  # once moved, nothing more to do
    assert locations(original / "mlflow.db") == before  # the original is untouched

    hidden = original.with_name(original.name + "-hidden")  # the old place gone: only the copy
    (original / "mlruns").rename(hidden)
    try:
        text = error_txt(copy / "mlflow.db", store["runs"]["failed"], tmp_path / "dl")
    finally:
        hidden.rename(original / "mlruns")
    assert text.split() == store["error"].split()
    # and the original still reads its own files
    assert error_txt(original / "mlflow.db", store["runs"]["failed"], tmp_path / "dl0") == text


def test_links_open_the_saved_views_of_the_runs_table(store, tmp_path, capsys):
    from src.sweep.tracking.store import default_experiment_name
    from src.sweep.tracking.views import SHARED_VIEW_PREFIX, VIEWS

    db = store["folder"] / "mlflow.db"
    experiment = cli.experiment_id(db, default_experiment_name(None))
    assert experiment is not None
    assert cli.print_links(5123, db) == experiment
    printed = capsys.readouterr().out
    links = cli.ui_links(experiment, 5123)
    saved = {key for (key,) in sqlite3.connect(db).execute(
        "SELECT key FROM experiment_tags WHERE experiment_id = ?", (experiment,))}
    for url in links.values():
        assert url in printed
        assert url.startswith(f"http://127.0.0.1:5123/#/experiments/{experiment}/runs?viewStateShareKey=")
        assert SHARED_VIEW_PREFIX + url.split("viewStateShareKey=")[1] in saved  # the view exists
    failed = next(url for what, url in links.items() if what.startswith("failed"))
    assert "FAILED" in VIEWS[failed.split("=")[-1]].search  # job rows, not the sweep's
    assert cli.print_links(5123, tmp_path / "none.db") is None


def test_links_to_an_experiment_made_before_the_views_set_filter_and_sort_in_the_url(store, tmp_path, capsys):
    """No saved view in the experiment: the same filter and sort as URL parameters (a view key
    that does not exist would send the UI to the bare experiment page)."""
    copy = tmp_path / "old.db"
    shutil.copy(store["folder"] / "mlflow.db", copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("DELETE FROM experiment_tags WHERE key LIKE 'mlflow.sharedViewState.%'")
    experiment = cli.print_links(5123, copy)
    printed = capsys.readouterr().out
    assert "viewStateShareKey" not in printed
    for url in cli.ui_links(experiment, 5123, with_view=False).values():
        assert url in printed and "searchFilter=" in url and "orderByKey=" in url


def served(monkeypatch) -> list:
    """Stands in for uvicorn.run: what `sgemm-lab ui` would serve, and with which environment."""
    import uvicorn
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR, REGISTRY_STORE_URI_ENV_VAR

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(
        (app, options, dict(os.environ))))
    for name in (BACKEND_STORE_URI_ENV_VAR, REGISTRY_STORE_URI_ENV_VAR,
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"):
        monkeypatch.delenv(name, raising=False)  # restored after the test (serve sets them)
    return calls


def test_ui_serves_mlflow_in_one_quiet_process_on_the_store_here(store, tmp_path, monkeypatch, capsys):
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR

    copy = tmp_path / "copied"
    shutil.copytree(store["folder"], copy)
    calls = served(monkeypatch)
    assert cli.main(["ui", "--port", "5077", "--store", str(copy / "mlflow.db")]) == 0
    [(app, options, env)] = calls
    assert app == "mlflow.server.fastapi_app:app"
    assert options == {"host": "127.0.0.1", "port": 5077, "workers": 1, "log_level": "warning"}
    assert env[BACKEND_STORE_URI_ENV_VAR] == f"sqlite:///{(copy / 'mlflow.db').resolve()}"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"  # no GenAI job runner
    out = capsys.readouterr().out
    assert "artifact locations pointed at" in out and "http://127.0.0.1:5077/#/experiments/" in out
    assert cli.main(["ui", "--store", str(tmp_path / "none.db")]) == 1  # no store: an error


def test_a_store_that_never_moved_is_not_said_to_have_moved(tmp_path, monkeypatch):
    """MLflow stores experiment 0's location as a path, the lab's as file: URIs: the same folder
    either way (`sgemm-lab ui` said "1 artifact locations ... (the store was moved)")."""
    from src.sweep.tracking.store import client, ensure_experiment

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_client = client(uri)
    mlflow_client.create_run(ensure_experiment(mlflow_client, "sgemm-lab/config", uri))
    assert any(not loc.startswith("file:") for loc in locations(tmp_path / "mlflow.db"))
    assert relocate(tmp_path / "mlflow.db") == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration  # a real `mlflow ui` server
def test_ui_serves_the_copied_store_on_localhost(store, tmp_path):
    """A real `sgemm-lab ui` on a free port: it answers on 127.0.0.1 with the experiment and the
    failed run's error.txt (from the copy's mlruns/) from one process, then stops with it."""
    copy = tmp_path / "copied"
    shutil.copytree(store["folder"], copy)
    port = free_port()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, MLFLOW_TRACKING_URI="")
    server = subprocess.Popen([sys.executable, "-m", "src.cli", "ui", "--port", str(port)],
                              cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
                    assert reply.status == 200
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "ui did not start"
                time.sleep(0.5)
        group = subprocess.run(["ps", "-o", "pid=", "-g", str(server.pid)], capture_output=True,
                               text=True).stdout.split()
        assert group == [str(server.pid)]  # no uvicorn workers, no job runner: one process
        run_id = store["runs"]["failed"]
        url = f"{base}/get-artifact?path=error.txt&run_uuid={run_id}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            assert reply.read().decode().split() == store["error"].split()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # mlflow ui's server processes are in its group
        try:
            output = server.communicate(timeout=30)[0]
        finally:  # MLflow's job consumers can outlive a SIGTERM of their group
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert f"{base}/#/experiments/" in output


def test_the_readme_links_are_the_ones_sgemm_lab_prints():
    """The docs' ready links (experiment 1, port 5000: a fresh store) are `sgemm-lab links`'s."""
    readme = (ROOT / "docs" / "tracking.md").read_text()
    in_readme = set(re.findall(r"\((http://127\.0\.0\.1:5000/#/experiments/1/runs\?[^)]+)\)", readme))
    assert in_readme == set(cli.ui_links("1", 5000).values())
