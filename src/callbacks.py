"""Hydra callbacks: the sweep summary printed and written at the end of a multirun."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .record import load_records
from .report import write_summary

log = logging.getLogger("sgemm")


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        records = load_records(sweep_dir)
        if not records:
            log.warning("no job records found under %s", sweep_dir)
            return
        table = write_summary(records, sweep_dir)
        print("\n" + table, flush=True)
        print(f"summary written to {sweep_dir / 'summary.md'} and summary.csv", flush=True)
