"""Tracking step: every job an MLflow run; every sweep a parent run with its jobs nested under it.

store: where runs go and how values are written; job_run: a job's run; sweep_run: a sweep's parent
run; signals: SIGTERM and Ctrl-C while runs are open. This package's public names are below.
"""

from src.sweep.tracking.job_run import JobRun, NoTracking, hydra_job_run, job_run, run_name
from src.sweep.tracking import signals
from src.sweep.tracking.signals import Terminated
from src.sweep.tracking.store import (
    ARTIFACTS_DIR, DEFAULT_DB, MAX_PARAM_LENGTH, PARENT_FILE, Parent, Settings, TrackingUnavailable,
    check_reachable, check_tracking_uri, client, ensure_experiment, flatten, log_batch, resolve_tracking_uri)
from src.sweep.tracking.sweep_run import SweepRun

__all__ = [
    "ARTIFACTS_DIR", "DEFAULT_DB", "MAX_PARAM_LENGTH", "PARENT_FILE", "JobRun", "NoTracking", "Parent",
    "Settings", "SweepRun", "Terminated", "TrackingUnavailable", "check_reachable", "check_tracking_uri", "client",
    "ensure_experiment", "flatten", "hydra_job_run", "job_run", "log_batch", "resolve_tracking_uri", "run_name",
    "signals",
]
