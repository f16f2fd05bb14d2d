"""Entry point: `python -m src.run [-m] [overrides]`. Thin on purpose: job.run_job does the work.

A single run exits non-zero when its job fails; in a sweep (-m) a failed job is recorded and the
sweep goes on, and callbacks.SweepSummary prints the table at the end. Each job is an MLflow run
(tracking.hydra_job_run), nested under the sweep's run (callbacks.MlflowSweep) in a sweep.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .job import JobOutputs, run_job
from .tracking import Terminated, hydra_job_run
from .tuned import explicit_params

log = logging.getLogger("sgemm")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    with hydra_job_run(cfg) as tracked:
        outputs = JobOutputs()
        record = run_job(cfg, outputs, explicit_params(list(hc.overrides.task)))
        record.write(Path(hc.runtime.output_dir))
        tracked.log_result(record, outputs)
    if record.ok or hc.mode == RunMode.MULTIRUN:
        log.info(record.console_line())  # a sweep goes on; its summary lists the failures
    else:
        log.error("error [%s]: %s", record.status, record.error)
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (tracking.Terminated): runs end KILLED
        print(f"interrupted: {exc or 'Ctrl-C'}", file=sys.stderr)
        sys.exit(143 if isinstance(exc, Terminated) else 130)
