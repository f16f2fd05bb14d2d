"""Builds tests/data/runs_h100.csv, the recorded `runs.csv` the table and plots tests run on.

Provenance: every row is a real H100 job record from tests/data/ (written by
the issue-2 acceptance run, benchmarks/progression.sh, since retired, on an NVIDIA H100 80GB HBM3), passed through src.records.collect unchanged:

- all 16 jobs of records_h100_progression.jsonl (kernels 01-06 and both cuBLAS baselines at 1024
  and 4096, all ok), and
- the jobs of records_h100_mixed.jsonl that ran with the kernel's default tile parameters
  (conf/kernel/) at a size the progression does not cover: 04_blocktile_1d and 05_blocktile_2d at
  1000, both `unsupported_size`. These are the failures the bench stage itself records when a
  size in params.yaml does not suit a kernel.

Regenerate with `python -m tests.runs_fixture`; tests/test_collect.py checks the committed file
is exactly what this builds.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from src.records.collect import write_runs
from src.records.record import Record

DATA_DIR = Path(__file__).resolve().parent / "data"
CONF_KERNEL = Path(__file__).resolve().parent.parent / "conf" / "kernel"
RUNS_FIXTURE = DATA_DIR / "runs_h100.csv"


def jsonl_jobs(name: str) -> list[tuple[str, Record]]:
    lines = (DATA_DIR / name).read_text().splitlines()
    return [(f"{name}:{n}", Record.from_dict(json.loads(line)))
            for n, line in enumerate(lines, start=1) if line.strip()]


def fixture_jobs() -> list[tuple[str, Record]]:
    progression = jsonl_jobs("records_h100_progression.jsonl")
    covered = {(r.kernel, r.m, r.n, r.k) for _, r in progression}

    def default_params(kernel: str) -> dict:
        return OmegaConf.to_container(OmegaConf.load(CONF_KERNEL / f"{kernel}.yaml").params)

    extra = [(job, r) for job, r in jsonl_jobs("records_h100_mixed.jsonl")
             if r.params == default_params(r.kernel) and (r.kernel, r.m, r.n, r.k) not in covered]
    return progression + extra


def build(path: Path) -> Path:
    write_runs(fixture_jobs(), path)
    return path


# Real H100 records of the suite exploration (conf/suite/, 2026-11-25): 22, 23 and 20 on every
# shape, alpha 0.5, beta 3, each paired with cuBLAS; columns trimmed to what the tables read.
SUITE_EXPLORATION = DATA_DIR / "suite_h100_exploration.csv"


def as_dispatched(directory: Path) -> Path:
    """The exploration records as if 23 had run every shape as best_fp32 and 20 as best_tf32 (a
    dispatch table of one rule each): a runs CSV for the suite's publication step."""
    import pandas as pd

    frame = pd.read_csv(SUITE_EXPLORATION, dtype=str)
    frame = frame[frame.kernel.isin(["23_wgmma_3xtf32", "20_wgmma_tf32"])].copy()
    frame["dispatched_to"] = frame.kernel
    frame["dispatch_rule"] = "recorded"
    frame["kernel"] = frame.kernel.map({"23_wgmma_3xtf32": "best_fp32", "20_wgmma_tf32": "best_tf32"})
    path = directory / "suite_runs_recorded.csv"
    frame.to_csv(path, index=False)
    return path


if __name__ == "__main__":
    print(build(RUNS_FIXTURE))
