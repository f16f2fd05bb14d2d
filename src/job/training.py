"""The tuner's evidence as a job reads it (the run-time autotune, src/job/autotune.py): where a
GPU's evidence file is (results/tuning/<gpu>.csv, written by `sgemm-lab tune`), its rows, and the
training shapes nearest to a shape in log2(m, n, k). Here, below src/tune/, so that a job may read
them; src/tune/evidence.py (which writes the file), command.py and explain.py use these same ones.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from src.paths import ROOT

EVIDENCE_DIR = ROOT / "results" / "tuning"


def evidence_path(gpu_spec: str) -> Path:
    return EVIDENCE_DIR / f"{gpu_spec}.csv"


def read(path: Path) -> list[dict]:
    """The rows of an evidence file, numbers as numbers (empty cells None)."""
    def number(text, kind):
        return None if text in ("", None) else kind(text)

    rows = []
    with path.open(newline="") as handle:
        for r in csv.DictReader(handle):
            for c in ("m", "n", "k", "aligned", "from_cache"):
                r[c] = number(r[c], int)
            r["stage"] = number(r.get("stage"), int)  # None in a file from before the two stages
            for c in ("gflops", "ratio_best", "ratio_best_ci_low", "ratio_best_ci_high", "ratio"):
                r[c] = number(r[c], float)
            for c in ("same_as", "error", "best_cublas", "baseline", "timestamp"):
                r[c] = r[c] or None
            rows.append(r)
    return rows


def score(row: dict) -> float | None:
    """A row's ratio: to the stronger cuBLAS where it was measured, else to cuBLAS's default
    (None where neither is a positive number)."""
    value = row.get("ratio_best")
    if value is None:
        value = row.get("ratio")
    return None if value is None or value <= 0 else float(value)


def distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """Euclidean distance of log2 dimensions: 2x in one side is 1."""
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b)))


def nearest(rows: list[dict], dispatcher: str, shape, count: int = 3) -> list[tuple]:
    """The `count` measured training shapes nearest to `shape` (ties by the shape)."""
    shapes = sorted({(r["m"], r["n"], r["k"]) for r in rows if r["dispatcher"] == dispatcher})
    return sorted(shapes, key=lambda s: (distance(s, shape), s))[:count]
