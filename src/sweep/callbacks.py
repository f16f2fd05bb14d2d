"""Hydra callbacks, run in the process that launches a sweep: the sweep directory claimed for this
sweep alone, the summary printed and written at the end of a multirun (and the exit status it
implies), and the sweep's MLflow parent run."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from src.errors import LabError, StorageError
from src.records.record import load_records
from src.records.summary import write_summary

log = logging.getLogger("sgemm")

CLAIM_FILE = ".sweep"  # in a sweep directory: which process's sweep it holds

# `${pid:}` in hydra.sweep.dir (conf/config.yaml): the launching process's id, so that sweeps
# started in the same second get directories of their own. Cached like Hydra's `${now:}`, so
# every job of the sweep (also those a launcher runs in other processes) sees the same value.
OmegaConf.register_new_resolver("pid", lambda: str(os.getpid()), use_cache=True, replace=True)


class SweepDirTaken(LabError):
    status = "sweep_dir_taken"


class NotRun(LabError):
    status = "not_run"


NO_GPU_MARK = ".no_gpu"  # in a sweep directory: a job of this sweep found no GPU


def note_no_gpu(sweep_dir: Path, record) -> None:
    """After a job: when it found no GPU, mark the sweep, so its later jobs are not run (each
    would start a worker only to find no GPU again)."""
    if record.status == "no_gpu" and not (sweep_dir / NO_GPU_MARK).exists():
        (sweep_dir / NO_GPU_MARK).write_text(f"{record.kernel} {record.size_label}: {record.error}\n")


def not_run_after_no_gpu(cfg: DictConfig, sweep_dir: Path):
    """Before a job: its record as `not_run` when an earlier job of the sweep found no GPU, else
    None. The mark is a file, so jobs that a launcher runs in other processes see it too."""
    mark = sweep_dir / NO_GPU_MARK
    if not mark.is_file():
        return None
    from src.records.record import mark_failed, new_record

    record = new_record(str(cfg.kernel.get("name")), str(cfg.kernel.get("precision")),
                        str(cfg.kernel.get("backend")), cfg, math=cfg.kernel.get("math"))
    first = mark.read_text().strip().splitlines()[0]
    mark_failed(record, NotRun(f"not run: an earlier job of this sweep found no GPU ({first})"))
    return record


def _sweep_dir(config: DictConfig) -> Path:
    """The sweep directory, absolute: jobs resolve it against the same original cwd."""
    return Path(config.hydra.runtime.cwd) / str(config.hydra.sweep.dir)


class SweepProgress(Callback):
    """N of M, time spent and left, ok / failed so far: a line before each job (src/sweep/progress.py)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from src.sweep import progress

        progress.current = progress.Progress(
            progress.sweep_size(config, list(config.hydra.overrides.task)))

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        from src.sweep import progress

        if progress.current is not None and config.hydra.mode == RunMode.MULTIRUN:
            progress.current.job_started(list(config.hydra.overrides.task))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        from src.sweep import progress

        if progress.current is not None and config.hydra.mode == RunMode.MULTIRUN:
            ok = job_return.status == JobStatus.COMPLETED
            progress.current.job_ended(job_return._return_value if ok else None)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from src.sweep import progress

        progress.current = None


def _claim_alive(text: str) -> bool:
    """Whether the sweep that wrote a claim ("pid N on HOST") is still running on this host."""
    parts = text.split()
    if len(parts) < 4 or parts[0] != "pid" or parts[3] != os.uname().nodename:
        return False
    try:
        os.kill(int(parts[1]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def claim_sweep_dir(sweep_dir: Path, resume: bool = False) -> None:
    """Make `sweep_dir` this sweep's alone (its claim file created exclusively), or raise
    SweepDirTaken when another sweep holds it or has left its job records there: two sweeps in
    one directory overwrite each other's records and mix their summaries and MLflow runs. With
    `resume=true` a sweep takes over the directory of an earlier sweep that is no longer running
    (re-running what it did not finish, the rest from the measurement cache)."""
    claim = sweep_dir / CLAIM_FILE
    if resume and claim.is_file() and not _claim_alive(claim.read_text()):
        claim.write_text(f"pid {os.getpid()} on {os.uname().nodename} (resumed)\n")
        return
    if resume and not claim.exists():
        sweep_dir.mkdir(parents=True, exist_ok=True)
        claim.write_text(f"pid {os.getpid()} on {os.uname().nodename} (resumed)\n")
        return

    sweep_dir.mkdir(parents=True, exist_ok=True)
    rule = ("(rule: each sweep writes to a directory of its own). Choose another "
            "hydra.sweep.dir, or move or remove that one.")
    try:
        fd = os.open(sweep_dir / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        owner = (sweep_dir / CLAIM_FILE).read_text().strip() or "?"
        raise SweepDirTaken(f"the sweep directory {sweep_dir} already holds another sweep "
                            f"({owner}): this sweep would overwrite its records {rule}") from None
    with os.fdopen(fd, "w") as claim:
        claim.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    earlier = sorted(sweep_dir.glob("*/record.json"))
    if earlier:
        (sweep_dir / CLAIM_FILE).unlink()
        raise SweepDirTaken(f"the sweep directory {sweep_dir} already holds {len(earlier)} job "
                            f"records of an earlier sweep (e.g. {earlier[0].parent.name}): this "
                            f"sweep would overwrite them and mix them into its summary {rule}")


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from src.sweep.tracking.credentials import redact_console

        redact_console()  # Hydra prints each job's overrides, which may hold a tracking URI's password
        sweep_dir = _sweep_dir(config)
        try:
            claim_sweep_dir(sweep_dir, resume=bool(config.get("resume")))
        except OSError as exc:  # a read-only or full disk, a file in the way
            exc = StorageError(
                f"the sweep directory {sweep_dir} cannot be made or written: {exc.strerror or exc} "
                f"(rule: a sweep writes its jobs' records into a directory of its own). Choose "
                f"another hydra.sweep.dir, or free space or fix the permissions there.")
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        except SweepDirTaken as exc:  # before any job runs: stop, no traceback
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = _sweep_dir(config)
        records = load_records(sweep_dir)
        if not (sweep_dir / "tune_summary.md").is_file():  # a tuning sweep printed its own
            if not records:
                log.warning("no job records found under %s", sweep_dir)
            else:
                try:
                    table = write_summary(records, sweep_dir)
                except OSError as exc:  # the jobs' records and runs stand; only the summary is lost
                    log.error("error [storage_error]: the sweep's summary could not be written to "
                              "%s: %s (rule: a storage fault costs the file, never a result: the "
                              "records and MLflow runs stand; python -m src.records.collect "
                              "gathers them later).", sweep_dir, exc.strerror or exc)
                else:
                    print("\n" + table, flush=True)
                    print(f"summary written to {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        exit_if_nothing_succeeded(records)


def exit_if_nothing_succeeded(records) -> None:
    """A sweep in which no job succeeded ends with exit status 1 (scripts and `dvc repro` stop),
    after its summary and MLflow run are written. Hydra ends callbacks in reverse order, so
    this one, listed first in conf/config.yaml, runs last."""
    if any(record.ok for record in records):
        return
    statuses = sorted({record.status for record in records})
    log.error("error [no_job_succeeded]: none of the sweep's %d jobs succeeded (%s); exit status 1.",
              len(records), ", ".join(statuses) or "no job records")
    raise SystemExit(1)


class MlflowSweep(Callback):
    """The sweep's parent run (src/sweep/tracking/): created at the start, its id written to the
    sweep directory for the jobs, which nest their own runs under it wherever they run; at the
    end the summary table, the GFLOP/s figure and the job counts, and FINISHED. A sweep that
    stops early (Ctrl-C, SIGTERM, an error) is ended KILLED or FAILED at exit."""

    def __init__(self) -> None:
        self.sweep = None  # tracking.SweepRun while a sweep is open

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from src.sweep import tracking

        sweep_dir = _sweep_dir(config)
        tracking.Parent.forget(sweep_dir)  # never let jobs find an earlier sweep's parent
        try:
            settings = tracking.Settings.from_cfg(config, Path(config.hydra.runtime.cwd),
                                                  config.hydra.job.config_name)
            if settings.enabled:  # a server that is down: say so now, not after MLflow's retries
                tracking.check_reachable(settings.tracking_uri)
                self.sweep = tracking.SweepRun.start(settings, sweep_dir,
                                                     list(config.hydra.overrides.task))
        except tracking.TrackingUnavailable as exc:  # before any job runs: stop, no traceback
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        if self.sweep is not None:
            log.info("MLflow: sweep run %s in %s", self.sweep.parent.run_id,
                     self.sweep.parent.tracking_uri)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.sweep is not None:
            sweep, self.sweep = self.sweep, None
            sweep.finish(load_records(_sweep_dir(config)))
