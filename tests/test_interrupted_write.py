"""A Ctrl-C that lands inside a write to MLflow's sqlite store (the soak's runs left RUNNING,
tests/test_soak.py): SQLAlchemy had written several rows in one INSERT and was setting up its
result when the interrupt was raised, and the write's transaction stayed open on a connection
that only the interrupt's frames still held. The store stayed locked for every process: the
next write, the interrupted job's own end KILLED too, waited sqlite's 20 s and failed.
signals.let_go drops those frames before the runs are ended.

The interrupt is raised where a signal handler would raise it, between two bytecodes: from a
trace function, at the first result SQLAlchemy sets up while another connection finds the
store locked (a probe with a 0.1 s timeout)."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from src.sweep import tracking
from src.sweep.tracking import signals
from src.sweep.tracking.store import log_batch
from tests.conftest import ROOT
from tests.replay import composed

ROWS = {f"kernel.params.p{i}": str(i) for i in range(5)}  # several rows in one INSERT


def locked(db: Path) -> bool:
    """Whether another connection finds the store's write lock taken."""
    probe = sqlite3.connect(db, timeout=0.1)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.rollback()
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return True
    finally:
        probe.close()


def interrupted_while_locked(db: Path, write) -> None:
    """`write()` with a KeyboardInterrupt raised as SQLAlchemy sets up a statement's result while
    the store is locked (the write under way), as a Ctrl-C's handler would raise it there."""
    def interrupt(frame, event, arg):  # the frame's first line: where the handler would raise
        sys.settrace(None)
        raise KeyboardInterrupt

    def tracer(frame, event, arg):
        code = frame.f_code
        if (event == "call" and code.co_name == "__init__" and code.co_filename.endswith(
                str(Path("sqlalchemy", "engine", "cursor.py"))) and locked(db)):
            return interrupt
        return None

    sys.settrace(tracer)
    try:
        write()
    finally:
        sys.settrace(None)
    pytest.fail("the write ended without the store locked at any result it set up")


def _store(uri: str) -> Path:
    return Path(uri.removeprefix("sqlite:///"))


def test_an_interrupted_write_keeps_the_store_locked_until_its_frames_go(tracking_uri):
    """The mechanism, on the store alone: locked while the interrupt is held, free after let_go."""
    db, client = _store(tracking_uri), MlflowClient(tracking_uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    try:
        interrupted_while_locked(db, lambda: log_batch(client, run_id, params=ROWS))
    except KeyboardInterrupt as exc:
        assert locked(db), ("the interrupted write no longer holds the lock: this MLflow and "
                            "SQLAlchemy do not leak it, and the test below proves nothing")
        signals.let_go(exc)
        assert not locked(db)
    client.set_terminated(run_id, "KILLED")  # the store takes writes again


def test_a_job_interrupted_inside_a_store_write_ends_killed_at_once(tracking_uri):
    """Through job_run: the run ends KILLED with the store free, not after sqlite's timeout."""
    cfg = composed("06_vectorize", (), tracking_uri)
    settings = tracking.Settings.from_cfg(cfg, ROOT, "config")
    db = _store(tracking_uri)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with tracking.job_run(settings, cfg, "ctrl-c mid-write") as job:
            interrupted_while_locked(db, lambda: log_batch(job.client, job.run_id, params=ROWS))
    signals.reset()
    assert time.monotonic() - started < 10  # sqlite's busy timeout is 20 s
    assert not locked(db)
    run = MlflowClient(tracking_uri).get_run(job.run_id)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "killed"


def test_let_go_keeps_the_frames_of_an_error_that_is_no_interrupt():
    """An error's traceback is its report: only an interrupt's frames are dropped."""
    try:
        raise RuntimeError("cuda fault")
    except RuntimeError as exc:
        signals.let_go(exc)
        assert exc.__traceback__ is not None
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        signals.let_go(exc)
        assert exc.__traceback__ is None
