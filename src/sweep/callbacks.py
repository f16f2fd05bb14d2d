"""Hydra callbacks, run in the process that launches a sweep: the sweep summary printed and
written at the end of a multirun, and the sweep's MLflow parent run."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from src.records.record import load_records
from src.records.summary import write_summary

log = logging.getLogger("sgemm")


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


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if (sweep_dir / "tune_summary.md").is_file():
            return  # a tuning sweep: its sweeper printed its own summary (tune_summary.md)
        records = load_records(sweep_dir)
        if not records:
            log.warning("no job records found under %s", sweep_dir)
            return
        table = write_summary(records, sweep_dir)
        print("\n" + table, flush=True)
        print(f"summary written to {sweep_dir / 'summary.md'} and summary.csv", flush=True)


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
        except tracking.TrackingUnavailable as exc:  # before any job runs: stop, no traceback
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        if settings.enabled:
            self.sweep = tracking.SweepRun.start(settings, sweep_dir,
                                                 list(config.hydra.overrides.task))
            log.info("MLflow: sweep run %s in %s", self.sweep.parent.run_id, settings.tracking_uri)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.sweep is not None:
            sweep, self.sweep = self.sweep, None
            sweep.finish(load_records(_sweep_dir(config)))
