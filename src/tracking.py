"""Tracking step: every job an MLflow run; every sweep a parent run with its jobs nested under it.

Where: `mlflow.tracking_uri` if set, else $MLFLOW_TRACKING_URI, else MLflow 3's own local default
pinned to the directory the runner was started from (Hydra's original cwd, the project root):
sqlite `mlflow.db` there, artifacts in `mlruns/` beside it. A relative sqlite path is made absolute
the same way, so every process of a sweep writes to the same file whatever its working directory.

A sweep: callbacks.MlflowSweep, in the launching process, creates the parent run (SweepRun) and
writes its id to `mlflow_parent.json` in the sweep directory; each job, in whichever process a
launcher runs it, reads that file and nests its own run under the parent (tag mlflow.parentRunId).
Jobs log themselves (job_run, around run.py's job) rather than through Hydra's on_job_start /
on_job_end, because Hydra skips on_job_end when a job is interrupted or exits.

Statuses: FINISHED for an ok job, FAILED for a failed one (error.txt holds the error), KILLED
after Ctrl-C or SIGTERM (turned into KeyboardInterrupt while runs are open); nothing is left
RUNNING. A sweep that went on to its end is FINISHED, failed jobs or not, with the counts as tags;
one that stopped early is KILLED (interrupted) or FAILED (an error), with its unfinished jobs.

Only MLflow's client API is used (MlflowClient, as in mlflow-skinny), imported when first needed
so that mlflow.enabled=false costs nothing.
"""

from __future__ import annotations

import atexit
import getpass
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from . import tuned
from .errors import LabError
from .record import Record

log = logging.getLogger("sgemm")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "sgemm-lab"
DEFAULT_DB = "mlflow.db"            # MLflow 3's default store: sqlite:///mlflow.db ...
ARTIFACTS_DIR = "mlruns"            # ... with artifacts under ./mlruns beside it
PARENT_FILE = "mlflow_parent.json"  # in the sweep directory: the parent run for the sweep's jobs
MAX_PARAM_LENGTH = 6000             # MLflow's limit on a param value
MAX_TAG_LENGTH = 8000               # and on a tag value
BATCH = 100                         # params or tags per log_batch call (MLflow's limit)

# Record fields logged as metrics (when not None).
METRICS = (
    "gflops", "time_ms_median", "time_ms_min", "time_ms_max", "time_ms_iqr", "samples",
    "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_peak",
    "cublas_fp32_gflops", "cublas_tf32_gflops", "rel_err", "tolerance",
    "registers", "static_smem_bytes", "dynamic_smem_bytes", "local_bytes", "compile_seconds",
    "sm_clock_mhz_before", "sm_clock_mhz_after", "samples_throttled",
)
# Fields of Record.device logged as tags, with the GPU's name.
DEVICE_TAGS = ("compute_capability", "driver", "cuda_runtime", "nvrtc", "cupy")

# Run statuses (mlflow.entities.RunStatus names).
FINISHED, FAILED, KILLED, RUNNING = "FINISHED", "FAILED", "KILLED", "RUNNING"


# --- where -------------------------------------------------------------------------------------

def resolve_tracking_uri(configured: str | None, root: Path) -> str:
    """The config's URI, else $MLFLOW_TRACKING_URI, else sqlite `mlflow.db` in `root`."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{DEFAULT_DB}"
    path = sqlite_path(uri)
    if path is not None and not path.is_absolute():
        uri = "sqlite:///" + str((root / path).resolve())
    return uri


# Where MLflow can keep runs: its file and database stores, a tracking server, Databricks.
SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


class TrackingUnavailable(LabError):
    status = "tracking_error"


def check_tracking_uri(uri: str) -> str:
    """`uri` if MLflow can store runs there; else TrackingUnavailable naming the rule."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme and scheme not in SCHEMES:
        raise TrackingUnavailable(
            f"MLflow cannot track runs at {uri!r}: its scheme {scheme!r} is not one MLflow stores "
            f"runs in (rule: the tracking URI's scheme is one of {', '.join(SCHEMES)}, or a "
            f"plain path). Set mlflow.tracking_uri=... or $MLFLOW_TRACKING_URI (the config wins), "
            f"or turn tracking off with mlflow.enabled=false.")
    return uri


SERVER_TIMEOUT_S = 10  # a tracking server that does not answer this soon is unreachable


def check_reachable(uri: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """For a tracking server (http, https): TrackingUnavailable unless it answers within
    `timeout_s` (the launching process asks before a sweep or a single run starts).
    MLflow's client retries a refused connection with back-off for minutes; this asks once,
    so that a sweep stops before submitting any job. An MLflow server answers GET /health
    with 200; 401 or 403 (an auth layer in front of it) also counts as up."""
    import urllib.error
    import urllib.request

    if not uri.lower().startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return
        reason = f"GET /health answered HTTP {exc.code}: no MLflow tracking server there"
    except (OSError, ValueError) as exc:
        reason = f"{getattr(exc, 'reason', None) or exc}; waited at most {timeout_s:g} s"
    raise TrackingUnavailable(
        f"MLflow cannot track runs at {uri!r}: the tracking server is unreachable ({reason}) "
        f"(rule: a tracking server must answer before any job starts). Start it (see README, "
        f"Scaling out), check the host and port, or set mlflow.tracking_uri=... or "
        f"$MLFLOW_TRACKING_URI to another store, or turn tracking off with mlflow.enabled=false.")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local sqlite URI (as written: maybe relative), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def default_experiment_name(config_name: str | None) -> str:
    return f"{PROJECT}/{config_name or 'config'}"


@dataclass(frozen=True)
class Settings:
    enabled: bool
    tracking_uri: str
    experiment_name: str
    log_ptx: bool = False

    @classmethod
    def from_cfg(cls, cfg: DictConfig, root: Path, config_name: str | None = None) -> "Settings":
        """From the config's `mlflow` block; `root` anchors the default store (the original cwd)."""
        block = cfg.get("mlflow") or {}
        enabled = bool(block.get("enabled", True))
        uri = resolve_tracking_uri(block.get("tracking_uri"), root)
        return cls(
            enabled=enabled,
            tracking_uri=check_tracking_uri(uri) if enabled else uri,
            experiment_name=block.get("experiment_name") or default_experiment_name(config_name),
            log_ptx=bool(block.get("log_ptx", False)),
        )


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_experiment(mlflow_client, name: str, uri: str) -> str:
    """The id of experiment `name`, created if missing. In a local sqlite store its artifacts go
    to `mlruns/` beside the database file, wherever this process runs."""
    from mlflow.exceptions import MlflowException

    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is None:
        location = None
        db = sqlite_path(uri)
        if db is not None:
            slug = re.sub(r"[^\w.-]+", "_", name).strip("_") or "experiment"
            location = (db.parent / ARTIFACTS_DIR / slug).as_uri()
        try:
            return mlflow_client.create_experiment(name, artifact_location=location)
        except MlflowException:  # made meanwhile by another process of the sweep
            experiment = mlflow_client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise RuntimeError(
            f"MLflow experiment {name!r} (id {experiment.experiment_id}) is deleted in {uri}: "
            f"restore it (mlflow experiments restore --experiment-id {experiment.experiment_id}) "
            f"or choose another name with mlflow.experiment_name=...")
    return experiment.experiment_id


# --- what: params, tags, metrics ------------------------------------------------------------------

def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"kernel.params.bm": "128", ...}; lists and scalars as JSON, values cut
    to MLflow's length limit (the whole config is also logged as config.yaml)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            if len(text) > MAX_PARAM_LENGTH:
                text = text[:MAX_PARAM_LENGTH - 1] + "…"
            out[name] = text
    return out


def job_params(cfg: DictConfig) -> dict[str, str]:
    """The composed config, flattened, plus `kernel` (the kernel's name) for the runs table;
    without a tuned kernel's kernel.params.* (chosen in the job, see src/tuned.py)."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    if tuned.applies(cfg):  # decided in the job: logged with the result, as used
        params = {k: v for k, v in params.items() if not k.startswith("kernel.params.")}
    params["kernel"] = str(cfg.kernel.name)
    return params


def record_metrics(record: Record) -> dict[str, float]:
    metrics = {}
    for name in METRICS:
        value = getattr(record, name)
        if value is not None and not isinstance(value, bool):
            metrics[name] = float(value)
    return metrics


def record_tags(record: Record) -> dict[str, str]:
    tags = {"status": record.status}
    if record.entry:
        tags["entry"] = record.entry  # the instantiated template, e.g. sgemm_vectorize<128, ...>
    if record.seed is not None:
        tags["seed"] = str(record.seed)  # the inputs' seed (bench.seed=... reproduces them)
    if record.gpu:
        tags["gpu"] = record.gpu
    if record.gpu_spec:
        tags["gpu_spec"] = record.gpu_spec
    for name in DEVICE_TAGS:
        if (record.device or {}).get(name) is not None:
            tags[name] = str(record.device[name])
    return tags


@lru_cache(maxsize=None)
def git_state(root: Path = ROOT) -> dict[str, str]:
    """Commit and dirty flag of the code that ran ({} outside a git checkout)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {}
        status = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": head.stdout.strip(),
            "git_dirty": "true" if status.stdout.strip() else "false"}


# Where SLURM ran a job: tag <- the job's environment variable.
SLURM_TAGS = {"slurm_job_id": "SLURM_JOB_ID", "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
              "slurm_array_task_id": "SLURM_ARRAY_TASK_ID", "slurm_partition": "SLURM_JOB_PARTITION",
              "slurm_node": "SLURMD_NODENAME"}


def context_tags() -> dict[str, str]:
    """Where and from which code a run was made."""
    tags = {"host": socket.gethostname(), "pid": str(os.getpid()), "mlflow.source.name": "src.run",
            "mlflow.source.type": "LOCAL", **git_state()}
    if "git_commit" in tags:
        tags["mlflow.source.git.commit"] = tags["git_commit"]
    for tag, variable in SLURM_TAGS.items():  # a job SLURM ran (hydra/launcher=slurm)
        if os.environ.get(variable):
            tags[tag] = os.environ[variable]
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # a container user with no passwd entry
        pass
    return tags


def _first_line(text: str, limit: int = 500) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first if len(first) <= limit else first[:limit - 1] + "…"


def _log_batch(mlflow_client, run_id: str, params=None, metrics=None, tags=None) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in (params or {}).items()]
    tags = [RunTag(k, v[:MAX_TAG_LENGTH]) for k, v in (tags or {}).items()]
    metrics = [Metric(k, v, now, 0) for k, v in (metrics or {}).items()]
    for start in range(0, max(len(params), len(tags), len(metrics)), BATCH):
        mlflow_client.log_batch(run_id, metrics=metrics[start:start + BATCH],
                                params=params[start:start + BATCH], tags=tags[start:start + BATCH])


# --- signals: SIGTERM -> KeyboardInterrupt ---------------------------------------------------------

class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that open runs end KILLED on the way out."""


_interrupted = False  # set once this process is interrupted: its unfinished sweep ends KILLED
_DEFAULT_HANDLERS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def _on_signal(signum, frame):
    global _interrupted
    _interrupted = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"terminated by signal {signum} (SIGTERM)")


def install_signal_handlers() -> bool:
    """While runs are open: SIGTERM raises Terminated, and both it and Ctrl-C mark the process
    interrupted. Signals that something else (a launcher) already handles are left alone, and so
    is everything outside the main thread. True if installed (undo: restore_signal_handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    installed = False
    for signum, default in _DEFAULT_HANDLERS.items():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _on_signal)
            installed = True
    return installed


def restore_signal_handlers() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum, default in _DEFAULT_HANDLERS.items():
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, default)


# --- a job ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parent:
    """The sweep's parent run, as its jobs find it in the sweep directory."""

    run_id: str
    experiment_id: str
    tracking_uri: str

    def write(self, sweep_dir: Path) -> Path:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        path = sweep_dir / PARENT_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, sweep_dir: Path) -> "Parent | None":
        path = sweep_dir / PARENT_FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    @staticmethod
    def forget(sweep_dir: Path) -> None:
        """Remove a parent file left by an earlier sweep in the same directory."""
        (sweep_dir / PARENT_FILE).unlink(missing_ok=True)


class JobRun:
    """One job's open MLflow run: job_run logs the config, log_result the record and files."""

    def __init__(self, mlflow_client, run_id: str, settings: Settings):
        self.client = mlflow_client
        self.run_id = run_id
        self.settings = settings
        self.record: Record | None = None
        self.tile_params_deferred = False

    def log_config(self, cfg: DictConfig) -> None:
        self.tile_params_deferred = tuned.applies(cfg)
        _log_batch(self.client, self.run_id, params=job_params(cfg))
        self.client.log_text(self.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")

    def log_result(self, record: Record, outputs=None) -> None:
        """Metrics, tags and files of a finished job (`outputs`: a job.JobOutputs, optional)."""
        self.record = record
        params = {"gpu_spec": record.gpu_spec} if record.gpu_spec else {}
        if self.tile_params_deferred:  # the tile parameters the job used, and where from
            params.update(flatten({"kernel": {"params": record.params}}))
            params["kernel.tuned_from"] = record.tuned_from or "none (config defaults)"
        _log_batch(self.client, self.run_id, params=params, metrics=record_metrics(record),
                   tags=record_tags(record))
        self.client.log_text(self.run_id, json.dumps(record.to_dict(), indent=2, default=str) + "\n",
                             "record.json")
        source = getattr(outputs, "source", None)
        resources = getattr(outputs, "resources", None)
        if source is not None:
            self.client.log_text(self.run_id, source, "kernel.cu")
        if resources is not None:
            self.client.log_text(self.run_id, json.dumps(asdict(resources), indent=2) + "\n",
                                 "resources.json")
        cc = (record.device or {}).get("compute_capability")
        if self.settings.log_ptx and source is not None and record.entry and cc:
            from .compile import nvrtc_ptx

            try:
                self.client.log_text(self.run_id, nvrtc_ptx(source, record.entry, cc), "kernel.ptx")
            except Exception as exc:  # PTX is optional: say why it is missing, keep the run
                log.warning("no PTX logged for %s: %s: %s", record.kernel, type(exc).__name__, exc)

    def end(self, status: str, error: str | None = None, status_tag: str | None = None) -> None:
        tags = {"status": status_tag} if status_tag else {}
        if error:
            self.client.log_text(self.run_id, error if error.endswith("\n") else error + "\n",
                                 "error.txt")
            tags["error"] = _first_line(error)
        if tags:
            _log_batch(self.client, self.run_id, tags=tags)
        self.client.set_terminated(self.run_id, status)

    def end_from_record(self) -> None:
        if self.record is None:
            self.end(FAILED, "the job ended without a record", status_tag="failed_internal")
        elif self.record.ok:
            self.end(FINISHED)
        else:
            self.end(FAILED, self.record.error or self.record.status)


class NoTracking:
    """What job_run gives when tracking is off: log_result does nothing."""

    run_id = None

    def log_result(self, record: Record, outputs=None) -> None:
        pass


@contextmanager
def job_run(settings: Settings, cfg: DictConfig, run_name: str,
            parent: Parent | None = None) -> Iterator[JobRun]:
    """An MLflow run around one job: params and config.yaml at the start; the caller logs the
    record with log_result. On the way out the run ends FINISHED (record ok), FAILED (record
    failed, or an exception: error.txt has the traceback) or KILLED (Ctrl-C, SIGTERM)."""
    global _interrupted
    mlflow_client = client(settings.tracking_uri)
    if parent is not None:
        experiment_id = parent.experiment_id
    else:
        experiment_id = ensure_experiment(mlflow_client, settings.experiment_name,
                                          settings.tracking_uri)
    tags = {**context_tags(), "kind": "job", "status": "running"}
    if parent is not None:
        tags["mlflow.parentRunId"] = parent.run_id
    installed = install_signal_handlers()
    try:
        run = mlflow_client.create_run(experiment_id, run_name=run_name, tags=tags)
        job = JobRun(mlflow_client, run.info.run_id, settings)
        try:
            job.log_config(cfg)
            yield job
        except KeyboardInterrupt as exc:
            _interrupted = True
            job.end(KILLED, f"killed: {type(exc).__name__} {exc}".rstrip(), status_tag="killed")
            raise
        except BaseException:
            job.end(FAILED, traceback.format_exc(), status_tag="failed_internal")
            raise
        job.end_from_record()
    finally:
        if installed:
            restore_signal_handlers()


@contextmanager
def hydra_job_run(cfg: DictConfig) -> Iterator[JobRun | NoTracking]:
    """job_run for the Hydra job in progress (run.py): settings from its config, anchored to the
    original cwd; in a sweep, the parent run from the sweep directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    root = Path(hc.runtime.cwd)
    settings = Settings.from_cfg(cfg, root, hc.job.config_name)
    if not settings.enabled:
        yield NoTracking()
        return
    parent = None
    if hc.mode != RunMode.MULTIRUN:
        check_reachable(settings.tracking_uri)  # a sweep's callback asked before any job
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = root / str(hc.sweep.dir)
        parent = Parent.read(sweep_dir)
        if parent is None:
            log.warning("no MLflow parent run in %s (see the warnings at the start of the sweep); "
                        "this job is tracked as a run of its own", sweep_dir / PARENT_FILE)
        else:
            settings = replace(settings, tracking_uri=parent.tracking_uri)
    with job_run(settings, cfg, Path(hc.runtime.output_dir).name, parent) as job:
        yield job


# --- a sweep --------------------------------------------------------------------------------------

def child_runs(mlflow_client, parent: Parent) -> list:
    runs, token = [], None
    while True:
        page = mlflow_client.search_runs(
            [parent.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'",
            max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def tuning_tags(summaries: list[dict]) -> dict[str, str]:
    """A tuning sweep's counts and best result, as tags of its run (summed over its problems;
    the best is the first problem's)."""
    tags = {f"tune_{name}": str(sum(s[name] for s in summaries))
            for name in ("pruned", "measured", "from_cache", "ok", "failed_compile",
                         "failed_verification", "failed_other")}
    if summaries:
        tags["tune_strategy"] = summaries[0]["strategy"]
        best = summaries[0].get("best")
        if best:
            tags["tune_best_gflops"] = f"{best['gflops']:.1f}"
            tags["tune_best_params"] = json.dumps(best["params"], sort_keys=True)
    return tags


def trials_frame(records: list[Record]):
    """One row per trial of a tuning sweep: its tile parameters, status, figures, whether it was
    reused from the cache, and the MLflow run that measured it (this sweep's child, or the
    earlier sweep's run for a reused measurement)."""
    import pandas as pd

    rows = []
    for r in records:
        rows.append({**{f"param.{k}": v for k, v in r.params.items()}, "status": r.status,
                     "gflops": r.gflops, "pct_of_cublas_fp32": r.pct_of_cublas_fp32,
                     "registers": r.registers, "from_cache": r.from_cache,
                     "measured_at": r.timestamp, "mlflow_run_id": r.mlflow_run_id})
    return pd.DataFrame(rows)


class SweepRun:
    """The parent run of a sweep, in the launching process. Holds plain data only: launchers
    that run jobs in other processes pickle Hydra's callbacks, and this with them."""

    def __init__(self, settings: Settings, sweep_dir: Path, parent: Parent):
        self.settings = settings
        self.sweep_dir = sweep_dir
        self.parent = parent
        self._signals = False  # whether this sweep installed the signal handlers
        self.closed = False

    @classmethod
    def start(cls, settings: Settings, sweep_dir: Path, overrides: list[str]) -> "SweepRun":
        mlflow_client = client(settings.tracking_uri)
        experiment_id = ensure_experiment(mlflow_client, settings.experiment_name,
                                          settings.tracking_uri)
        run = mlflow_client.create_run(
            experiment_id, run_name=f"sweep {sweep_dir.parent.name} {sweep_dir.name}",
            tags={**context_tags(), "kind": "sweep", "sweep_dir": str(sweep_dir)})
        parent = Parent(run.info.run_id, experiment_id, settings.tracking_uri)
        sweep = cls(settings, sweep_dir, parent)
        try:
            sweep._signals = install_signal_handlers()
            _log_batch(mlflow_client, parent.run_id, params=flatten({"overrides": " ".join(overrides)}))
            parent.write(sweep_dir)
        except BaseException:
            sweep.close_unfinished()
            raise
        atexit.register(sweep.close_unfinished)
        return sweep

    def _count(self, mlflow_client) -> dict[str, str]:
        """Ends children left RUNNING (their process died) KILLED; returns the counts as tags."""
        statuses = []
        for run in child_runs(mlflow_client, self.parent):
            if run.info.status == RUNNING:
                mlflow_client.set_tag(run.info.run_id, "status", "killed")
                mlflow_client.set_terminated(run.info.run_id, KILLED)
            statuses.append(KILLED if run.info.status == RUNNING else run.info.status)
        return {"jobs": str(len(statuses)), "jobs_ok": str(statuses.count(FINISHED)),
                "jobs_failed": str(statuses.count(FAILED)),
                "jobs_killed": str(statuses.count(KILLED))}

    def finish(self, records: list[Record]) -> None:
        """The sweep went to its end: summary table and figure, counts, FINISHED."""
        from .report import gflops_figure, summary_frame, summary_markdown

        mlflow_client = client(self.settings.tracking_uri)
        run_id = self.parent.run_id
        try:
            counts = self._count(mlflow_client)
            tuning = self.sweep_dir / "tune_summary.json"
            if tuning.is_file():  # a tuning sweep (hydra_plugins/sgemm_lab/tune_sweeper.py):
                # its own summary stands for the kernel x size table and figure
                mlflow_client.log_text(run_id, (self.sweep_dir / "tune_summary.md").read_text(),
                                       "tune_summary.md")
                summaries = json.loads(tuning.read_text())
                mlflow_client.log_dict(run_id, summaries, "tune_summary.json")
                if records:  # every trial, measured now (a child run) or reused from the cache
                    mlflow_client.log_table(run_id, trials_frame(records), "tune_trials.json")
                counts.update(tuning_tags(summaries))
            elif records:
                mlflow_client.log_table(run_id, summary_frame(records), "summary_table.json")
                mlflow_client.log_text(run_id, summary_markdown(records), "summary.md")
                mlflow_client.log_figure(run_id, gflops_figure(records), "gflops.png")
            else:
                log.warning("no job records under %s: no summary logged to MLflow", self.sweep_dir)
            _log_batch(mlflow_client, run_id, tags=counts)
        except BaseException:
            self.close_unfinished()
            raise
        mlflow_client.set_terminated(run_id, FINISHED)
        self._close()

    def close_unfinished(self) -> None:
        """The sweep stopped before its end (at exit, or on an error while finishing): KILLED
        if it was interrupted, FAILED otherwise; children left RUNNING end KILLED."""
        if self.closed:
            return
        mlflow_client = client(self.settings.tracking_uri)
        try:
            counts = self._count(mlflow_client)
            killed = _interrupted or int(counts["jobs_killed"]) > 0
            why = ("interrupted (Ctrl-C or SIGTERM)" if killed else
                   "stopped by an error (a job raised, see the FAILED runs, or the sweep's log)")
            mlflow_client.log_text(self.parent.run_id, f"the sweep did not finish: {why}\n",
                                   "error.txt")
            _log_batch(mlflow_client, self.parent.run_id, tags=counts)
            mlflow_client.set_terminated(self.parent.run_id, KILLED if killed else FAILED)
        finally:
            self._close()

    def _close(self) -> None:
        self.closed = True
        atexit.unregister(self.close_unfinished)
        if self._signals:
            restore_signal_handlers()
