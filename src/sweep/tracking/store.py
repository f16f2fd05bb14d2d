"""Tracking store: where MLflow runs go (the tracking URI and experiment), how a run's values are
written (flattened params, batched logging), and the sweep's parent run as its jobs find it.

Where: `mlflow.tracking_uri` if set, else $MLFLOW_TRACKING_URI, else MLflow 3's own local default
pinned to the directory the runner was started from (Hydra's original cwd, the project root):
sqlite `mlflow.db` there, artifacts in `mlruns/` beside it. A relative sqlite path is made absolute
the same way, so every process of a sweep writes to the same file whatever its working directory.

Only MLflow's client API is used (MlflowClient, as in mlflow-skinny), imported when first needed
so that mlflow.enabled=false costs nothing.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig

from src.errors import LabError
from src.paths import ROOT

PROJECT = "sgemm-lab"


DEFAULT_DB = "mlflow.db"            # MLflow 3's default store: sqlite:///mlflow.db ...


ARTIFACTS_DIR = "mlruns"            # ... with artifacts under ./mlruns beside it


# MLflow 3's UI opens an experiment of no declared kind on its GenAI (traces) page; this kind opens
# it on the runs table.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


PARENT_FILE = "mlflow_parent.json"  # in the sweep directory: the parent run for the sweep's jobs


MAX_PARAM_LENGTH = 6000             # MLflow's limit on a param value


MAX_TAG_LENGTH = 8000               # and on a tag value


BATCH = 100                         # params or tags per log_batch call (MLflow's limit)


# Run statuses (mlflow.entities.RunStatus names).
FINISHED, FAILED, KILLED, RUNNING = "FINISHED", "FAILED", "KILLED", "RUNNING"


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
            return mlflow_client.create_experiment(name, artifact_location=location,
                                                   tags=EXPERIMENT_TAGS)
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


def first_line(text: str, limit: int = 500) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first if len(first) <= limit else first[:limit - 1] + "…"


def log_batch(mlflow_client, run_id: str, params=None, metrics=None, tags=None) -> None:
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in (params or {}).items()]
    tags = [RunTag(k, v[:MAX_TAG_LENGTH]) for k, v in (tags or {}).items()]
    metrics = [Metric(k, v, now, 0) for k, v in (metrics or {}).items()]
    for start in range(0, max(len(params), len(tags), len(metrics)), BATCH):
        mlflow_client.log_batch(run_id, metrics=metrics[start:start + BATCH],
                                params=params[start:start + BATCH], tags=tags[start:start + BATCH])


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
