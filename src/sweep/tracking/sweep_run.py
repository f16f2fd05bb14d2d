"""A sweep's MLflow run: the parent of its jobs' runs, created in the launching process
(callbacks.MlflowSweep), which writes its id to `mlflow_parent.json` in the sweep directory.

A sweep that went on to its end is FINISHED, failed jobs or not, with the counts as tags; one that
stopped early is KILLED (interrupted) or FAILED (an error), with its unfinished jobs.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import socket
import time
from pathlib import Path

from src.records.record import Record
from src.sweep.tracking.signals import (
    install_signal_handlers, let_go, restore_signal_handlers, shielded, was_interrupted)
from src.sweep.tracking.store import (
    FAILED, FINISHED, KILLED, RUNNING, Parent, Settings, client, context_tags, ensure_experiment,
    flatten, log_batch, redact)
from src.tune.trials import trials_frame, tuning_tags

log = logging.getLogger("sgemm")

MAX_NOTE = 7000  # characters of the summary kept in the run's description (a tag: 8000 at most)


def sweep_name(overrides: list[str]) -> str:
    """The sweep's command line, which says what it swept: `kernel=glob(*) size=1024,4096`
    (where runs are tracked is no part of it, and a URI's password is never shown)."""
    swept = [item for item in overrides if not item.lstrip("+~").startswith("mlflow.tracking_uri=")]
    return redact(" ".join(swept)) or "(config defaults)"


def counted_name(name: str, counts: dict[str, str]) -> str:
    """The name with the outcome, so the runs table shows it beside the status icon (a sweep
    that went on past failed jobs is FINISHED): `size=1024 (5 jobs: 2 ok, 3 failed)`."""
    outcome = f"{counts['jobs']} jobs: {counts['jobs_ok']} ok"
    for key in ("jobs_failed", "jobs_killed"):
        if counts[key] != "0":
            outcome += f", {counts[key]} {key[5:]}"
    return f"{name} ({outcome})"


def sweep_note(summary: str) -> str:
    """The run's description: the sweep's summary, as its summary.md holds it."""
    if len(summary) > MAX_NOTE:
        summary = summary[:MAX_NOTE].rsplit("\n", 1)[0] + "\n\n(cut here: the whole table is " \
                  "the summary file in Artifacts)\n"
    return summary


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


def _process_gone(pid: str) -> bool:
    """Whether no process `pid` runs on this host (a live one, maybe a later process given the
    same number, is left alone: a run is never closed under a sweep that may still own it)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OverflowError):
        return False
    return False


def close_abandoned(mlflow_client, closer_run_id: str) -> None:
    """Runs of the store left RUNNING by a process of this host that is gone (SIGKILL, a crash,
    the OOM killer: nothing could end them) end KILLED, with the reason as their error. Runs of
    other hosts are left alone (whether their process lives cannot be seen from here). A store
    that refuses is a warning: closing old runs never stops a sweep."""
    host = socket.gethostname()
    try:
        experiments = [e.experiment_id for e in mlflow_client.search_experiments()]
        running = mlflow_client.search_runs(experiments, filter_string="attributes.status = 'RUNNING'",
                                            max_results=1000)
        for run in running:
            tags = run.data.tags
            if tags.get("host") != host or not tags.get("pid") or not _process_gone(tags["pid"]):
                continue
            reason = (f"killed: its process (pid {tags['pid']} on {host}) ended without closing "
                      f"this run (SIGKILL, a crash or the OOM killer); closed by the sweep run "
                      f"{closer_run_id}")
            log_batch(mlflow_client, run.info.run_id, tags={
                "status": "killed", "error": reason, "mlflow.note.content": f"**killed**\n\n{reason}\n"})
            mlflow_client.set_terminated(run.info.run_id, KILLED)
            log.warning("MLflow: run %s (%s) was left RUNNING by pid %s, which is gone: ended KILLED",
                        run.info.run_id, run.info.run_name, tags["pid"])
    except Exception as exc:  # MLflow's and SQLAlchemy's errors: no common base
        log.warning("MLflow: runs left RUNNING by killed processes could not be closed (%s: %s)",
                    type(exc).__name__, exc)


TERMINATE_TRIES = 5  # a store busy with other sweeps' writes (sqlite: "database is locked")
TERMINATE_PAUSE_S = 0.5  # times the try's number, between tries


def _terminate(mlflow_client, run_id: str, status: str) -> None:
    """End the run, trying again while the store refuses (several sweeps write one sqlite file;
    under load a write can wait past its lock timeout): a run left RUNNING is a lost result."""
    for attempt in range(TERMINATE_TRIES):
        try:
            mlflow_client.set_terminated(run_id, status)
            return
        except Exception:  # MLflow's and SQLAlchemy's errors: no common base
            if attempt == TERMINATE_TRIES - 1:
                raise
            time.sleep(TERMINATE_PAUSE_S * (attempt + 1))


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
        # Before MLflow's import (seconds): an interrupt that lands in it is remembered, not lost
        # to a library that turns it into its own error (pydantic-core does), and no run is left
        # RUNNING. Measured: such a lost Ctrl-C let the sweep go on with MLflow half-imported.
        installed = install_signal_handlers()
        sweep = None
        try:
            mlflow_client = client(settings.tracking_uri)
            experiment_id = ensure_experiment(mlflow_client, settings.experiment_name,
                                              settings.tracking_uri)
            # a signal meanwhile is held until the run exists with its parent file (so that its
            # jobs can find it), and is ended at exit
            with shielded():
                run = mlflow_client.create_run(
                    experiment_id, run_name=sweep_name(overrides),
                    tags={**context_tags(), "kind": "sweep", "sweep_dir": str(sweep_dir)})
                sweep = cls(settings, sweep_dir,
                            Parent(run.info.run_id, experiment_id, redact(settings.tracking_uri)))
                sweep._signals = installed
                atexit.register(sweep.close_unfinished)
                log_batch(mlflow_client, sweep.parent.run_id,
                          params=flatten({"overrides": redact(" ".join(overrides))}))
                sweep.parent.write(sweep_dir)
            close_abandoned(mlflow_client, sweep.parent.run_id)
        except BaseException as exc:
            let_go(exc)  # an interrupt: a store write it cut short may hold the store's lock
            if sweep is not None:
                sweep.close_unfinished()
            elif installed:
                restore_signal_handlers()
            raise
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
        from src.records.summary import gflops_figure, summary_frame, summary_markdown

        run_id = self.parent.run_id
        try:
            mlflow_client = client(self.settings.tracking_uri)
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
            self._log_outcome(mlflow_client, counts, records)
        except BaseException as exc:
            let_go(exc)  # an interrupt: a store write it cut short may hold the store's lock
            self.close_unfinished()
            raise
        _terminate(mlflow_client, run_id, FINISHED)
        self._close()

    def _log_outcome(self, mlflow_client, counts: dict[str, str], records: list[Record]) -> None:
        """Counts as tags and as metrics (columns to sort and filter by), the outcome in the
        run's name, and the summary as its description."""
        from src.records.summary import summary_markdown

        tuning = self.sweep_dir / "tune_summary.md"
        if tuning.is_file():
            note = tuning.read_text()
        elif records:
            note = summary_markdown(records)
        else:
            note = "no job left a record"
        run = mlflow_client.get_run(self.parent.run_id)
        log_batch(mlflow_client, self.parent.run_id, tags={**counts, "mlflow.note.content": sweep_note(note)},
                  metrics={key: float(value) for key, value in counts.items()
                           if key in ("jobs", "jobs_ok", "jobs_failed", "jobs_killed")})
        mlflow_client.update_run(self.parent.run_id, name=counted_name(run.info.run_name, counts))

    def close_unfinished(self) -> None:
        """The sweep stopped before its end (at exit, or on an error while finishing): KILLED
        if it was interrupted, FAILED otherwise; children left RUNNING end KILLED."""
        if self.closed:
            return
        try:
            with shielded():  # Ctrl-C again while the runs are being ended: held until they are
                self._end_unfinished()
        finally:
            self._close()

    def _end_unfinished(self) -> None:
        gc.collect()  # at exit: an interrupted store write's connection, unreachable, closed first (signals.let_go)
        mlflow_client = client(self.settings.tracking_uri)
        killed = was_interrupted()
        try:
            counts = self._count(mlflow_client)
            killed = killed or int(counts["jobs_killed"]) > 0
            why = ("interrupted (Ctrl-C or SIGTERM)" if killed else
                   "stopped by an error (a job raised, see the FAILED runs, or the sweep's log)")
            mlflow_client.log_text(self.parent.run_id, f"the sweep did not finish: {why}\n",
                                   "error.txt")
            log_batch(mlflow_client, self.parent.run_id, tags=counts,
                      metrics={key: float(value) for key, value in counts.items()})
        except Exception as exc:  # the counts and note are lost; the run's end must not be
            log.warning("MLflow: the unfinished sweep run %s could not be described (%s: %s); "
                        "ending it anyway", self.parent.run_id, type(exc).__name__, exc)
        finally:
            _terminate(mlflow_client, self.parent.run_id, KILLED if killed else FAILED)

    def _close(self) -> None:
        self.closed = True
        atexit.unregister(self.close_unfinished)
        if self._signals:
            restore_signal_handlers()
