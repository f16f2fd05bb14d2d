"""Tracking store: where MLflow runs go (the tracking URI and experiment), how a run's values are
written (flattened params, batched logging), and the sweep's parent run as its jobs find it.

Where: `mlflow.tracking_uri` if set, else $MLFLOW_TRACKING_URI, else MLflow 3's own local default
pinned to the directory the runner was started from (Hydra's original cwd, the project root):
sqlite `mlflow.db` there, artifacts in `mlruns/` beside it. A relative sqlite path is made absolute
the same way, so every process of a sweep writes to the same file whatever its working directory.

Only MLflow's client API is used (MlflowClient, as in mlflow-skinny), imported when first needed
so that mlflow.enabled=false costs nothing. MLflow 3's usage telemetry is off unless
$MLFLOW_DISABLE_TELEMETRY says otherwise: a lab run sends nothing, and its calls (about 20 ms each,
profiled on the H100 box) ran beside the timing loop.
"""

from __future__ import annotations

import contextlib
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
from src.sweep.tracking.credentials import redact, take_credentials, without_credentials
from src.paths import ROOT
from src.sweep.tracking.views import view_tags

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


HOW_TO_CHOOSE = ("Set mlflow.tracking_uri=... or $MLFLOW_TRACKING_URI (the config wins), or turn "
                 "tracking off with mlflow.enabled=false.")
CONNECT_TIMEOUT_S = 5.0  # how long the check waits for a tracking server to answer


def check_tracking_uri(uri: str, connect: bool = True) -> str:
    """`uri` if MLflow can store runs there; else TrackingUnavailable naming the rule. A
    tracking server is checked by connecting to it (at most CONNECT_TIMEOUT_S), so that an
    unreachable one stops the run at once instead of after MLflow's minutes of retries."""
    shown = redact(uri)
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme and scheme not in SCHEMES:
        raise TrackingUnavailable(
            f"MLflow cannot track runs at {shown!r}: its scheme {scheme!r} is not one MLflow stores "
            f"runs in (rule: the tracking URI's scheme is one of {', '.join(SCHEMES)}). "
            f"{HOW_TO_CHOOSE}")
    if scheme in ("", "file"):
        raise TrackingUnavailable(
            f"MLflow cannot track runs at {shown!r}: a directory (file store) is refused by MLflow "
            f"3, which keeps runs in a database (rule: a local store is sqlite:///<path>.db, "
            f"e.g. sqlite:///mlflow.db). {HOW_TO_CHOOSE}")
    if scheme == "sqlite" and sqlite_path(uri) is None:
        raise TrackingUnavailable(
            f"MLflow cannot keep runs at {shown!r}: it names no database file, so the runs would "
            f"live in memory and vanish with the process (rule: sqlite:///<path>.db, three "
            f"slashes then a file path). {HOW_TO_CHOOSE}")
    if connect and scheme in ("http", "https"):
        check_reachable(uri)
    return uri


def check_reachable(uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """For a tracking server (http, https): TrackingUnavailable unless it answers MLflow's
    GET /health within `timeout_s` (asked once, before a sweep or a single run starts: MLflow's
    client retries a refused connection with back-off for minutes). 401 or 403 (an auth layer in
    front of the server) count as up. Later requests to a server that goes away cost seconds,
    not minutes (MLflow's retry and timeout variables, unless set)."""
    import urllib.error
    import urllib.request

    if not uri.lower().startswith(("http://", "https://")):
        return
    shown = redact(uri)
    try:
        with urllib.request.urlopen(without_credentials(uri).rstrip("/") + "/health",
                                    timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403):
            raise TrackingUnavailable(
                f"no MLflow tracking server answers at {shown!r}: GET /health answered HTTP "
                f"{exc.code} (rule: the tracking server answers before any job runs). Start it "
                f"(docs/scaling.md) or check the host and port. {HOW_TO_CHOOSE}") from None
    except (OSError, ValueError) as exc:
        raise TrackingUnavailable(
            f"the MLflow tracking server at {shown!r} is unreachable within {timeout_s:g} s "
            f"({type(exc).__name__}: {getattr(exc, 'reason', None) or exc}) (rule: the tracking "
            f"server answers before any job runs). Start it (docs/scaling.md) or check the "
            f"host and port. {HOW_TO_CHOOSE}") from None
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


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
        uri = take_credentials(resolve_tracking_uri(block.get("tracking_uri"), root))
        return cls(
            enabled=enabled,
            tracking_uri=check_tracking_uri(uri) if enabled else uri,
            experiment_name=block.get("experiment_name") or default_experiment_name(config_name),
            log_ptx=bool(block.get("log_ptx", False)),
        )


def client(uri: str):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when MLflow first starts it
    from mlflow import MlflowClient

    _ready(uri)
    _database_opened(uri)
    return MlflowClient(tracking_uri=uri)


DATABASES = ("postgresql", "mysql", "mssql")  # stores whose URI keeps its credentials


@lru_cache(maxsize=None)
def _database_opened(uri: str) -> None:
    """A database store is opened once per process, and an error doing so (no driver, a wrong
    host or password) is TrackingUnavailable with the URI and the driver's message redacted,
    not a traceback that could quote the URI."""
    from mlflow import MlflowClient

    if uri.split(":", 1)[0].split("+", 1)[0].lower() not in DATABASES:
        return
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:
        raise TrackingUnavailable(
            f"MLflow cannot open the database store at {redact(uri)!r} ({type(exc).__name__}: "
            f"{redact(first_line(str(exc)))}) (rule: the tracking store opens before any job "
            f"runs). Check the URI's driver (installed?), host and database, and the credentials. "
            f"{HOW_TO_CHOOSE}") from None


@lru_cache(maxsize=None)
def _ready(uri: str) -> None:
    """A local sqlite store is created (MLflow's schema migrations, seconds) by one process at
    a time, and atomically: under a lock file beside it, into a private file renamed into place
    when whole. Two sweeps started together on a fresh store raced to create the same tables
    (one died with `table ... already exists`), and a process stopped mid-migration left a
    half-migrated file that every later run failed on. Once per process and store."""
    import fcntl

    from mlflow import MlflowClient

    from src.sweep.tracking.signals import shielded

    db = sqlite_path(uri)
    if db is None:
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = open(db.with_name(db.name + ".lock"), "a")
    except OSError as exc:
        raise _unusable(db, exc) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if db.is_file() and db.stat().st_size > 0:
                _check_usable(db)  # made before (MLflow refuses an old schema with its own message)
                return
            for stale in db.parent.glob(f".{db.name}.*.new*"):  # of a process killed here
                stale.unlink(missing_ok=True)
            fresh = db.with_name(f".{db.name}.{os.getpid()}.new")
            with shielded():  # Ctrl-C here is held until the store is whole
                try:
                    MlflowClient(tracking_uri=f"sqlite:///{fresh}").search_experiments(max_results=1)
                    fresh.replace(db)
                except BaseException as exc:  # a full disk, a read-only directory: no half store left
                    for leftover in db.parent.glob(f".{db.name}.{os.getpid()}.new*"):
                        leftover.unlink(missing_ok=True)
                    if isinstance(exc, Exception):
                        raise _unusable(db, exc) from None
                    raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unusable(db: Path, exc: BaseException) -> TrackingUnavailable:
    reason = getattr(exc, "strerror", None) or first_line(str(getattr(exc, "orig", None) or exc))
    if isinstance(exc, ImportError):  # MLflow's store code short of a package: not the file's fault
        rule = "MLflow's SQLite store imports packages MLflow depends on; the file is not at fault"
        fix = f"Install {exc.name or 'the missing package'} (`pip install -e .` installs MLflow's needs)."
    else:
        rule = ("a local tracking store is a SQLite database that MLflow made, readable and "
                "writable, in a writable directory with free space")
        fix = ("Move a damaged file away (a new store is made in its place), free space or fix "
               "the permissions.")
    return TrackingUnavailable(f"MLflow cannot keep runs in {db}: {reason} ({type(exc).__name__}) "
                               f"(rule: {rule}). {fix} {HOW_TO_CHOOSE}")


def _check_usable(db: Path) -> None:
    """TrackingUnavailable unless `db` is a SQLite database this process can write: a damaged
    or foreign file, or a read-only one, fails here in one paragraph instead of as a traceback
    from deep in SQLAlchemy at the first run."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(db, timeout=60)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            conn.execute("BEGIN IMMEDIATE")  # takes the write lock: refused if read-only
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise _unusable(db, exc) from None


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
                                                   tags={**EXPERIMENT_TAGS, **view_tags()})
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
            text = redact(value if isinstance(value, str) else json.dumps(value))
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
    """The sweep's parent run, as its jobs find it in the sweep directory (`tracking_uri`: where it
    is, without credentials: a job whose own URI reads the same keeps its own)."""

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
