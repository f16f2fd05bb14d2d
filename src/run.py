"""Entry point: `python -m src.run [-m] [overrides]`. Thin on purpose: job.run_job does the work.

A single run exits non-zero when its job fails; in a sweep (-m) a failed job is recorded and the
sweep goes on, and callbacks.SweepSummary prints the table at the end.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .job import run_job
from .tuned import explicit_params

log = logging.getLogger("sgemm")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    record = run_job(cfg, explicit_params(list(hc.overrides.task)))
    record.write(Path(hc.runtime.output_dir))
    if record.ok or hc.mode == RunMode.MULTIRUN:
        log.info(record.console_line())  # a sweep goes on; its summary lists the failures
    else:
        log.error("error [%s]: %s", record.status, record.error)
        sys.exit(1)


if __name__ == "__main__":
    main()
