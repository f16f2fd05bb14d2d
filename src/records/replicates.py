"""Replicates step: the records of one published row (kernel label, M, N, K, GPU spec) measured in
several independent runs (separate processes, fresh inputs; src/sweep/replicate.py makes them),
combined into what the row publishes.

- Each figure is its own **median run**'s (the lower of the two middle runs for an even count:
  the conservative choice): the % of cuBLAS and the paired cuBLAS figure of the run whose % is
  the median, the % of the stronger cuBLAS and its cuBLASLt figure of the run whose % of that
  is the median, the GFLOP/s of the run whose GFLOP/s is the median. One run chosen by % and
  shown whole let its other figures carry that run's luck: under the power cap a TF32 row's
  GFLOP/s spans 7% across runs while its % holds within 1%, and cuBLASLt autotuned at 1024
  moved 7% from job to job, so a republished row moved 2.5% and 6.4% with its own % unchanged.
  Each % is still exactly its run's kernel over its run's baseline (a row of one run: exactly
  the ratio of the figures shown). A cuBLAS row (its own baseline) takes the median GFLOP/s.
- Beside it, the spread: the runs' lowest and highest %, the union of their 95% intervals, the
  number of runs and of distinct cards (the card's UUID; else host and PCI bus id).
- The verdict is faster / slower only when every run's interval is on that side of 100%
  (verdicts.replicated_verdict); otherwise a tie. A row of one run says so ("(1 run)").

Two records of one row with the same replicate number are stale or repeated records, not
replicates: refused (the table has one row per kernel and size).
"""

from __future__ import annotations

from dataclasses import dataclass

from src.records.verdicts import replicated_verdict
from src.records.record import Record


@dataclass(frozen=True)
class Spread:
    """One ratio (to cuBLAS, or to the stronger cuBLAS) across a row's runs, in %."""

    low: float               # the lowest run's %
    high: float              # the highest run's %
    ci_low: float            # the union of the runs' 95% intervals
    ci_high: float
    verdict: str             # faster / slower only if every run's interval agrees, else tie


@dataclass(frozen=True)
class Row:
    record: Record           # the median run by % of cuBLAS (or, with no ok run, the first failed one)
    runs: tuple[Record, ...]  # every ok run of the row
    failed: tuple[Record, ...]  # the row's failed runs
    pct: Spread | None       # against cuBLAS in the kernel's precision (paired rows)
    best: Spread | None      # against the stronger cuBLAS (bench.best_cublas)
    gflops_run: Record | None = None  # the median run by GFLOP/s (None: `record`)
    best_run: Record | None = None    # the median run by % of the stronger cuBLAS (None: `record`)

    @property
    def gflops(self) -> float | None:
        """The row's published GFLOP/s: its median run's by GFLOP/s."""
        return (self.gflops_run or self.record).gflops

    @property
    def against_best(self) -> Record:
        """The run whose figures the row shows against the stronger cuBLAS."""
        return self.best_run or self.record

    @property
    def replicates(self) -> int:
        return len(self.runs)

    @property
    def machines(self) -> int:
        """Distinct cards the ok runs ran on (the card's UUID, else host and PCI bus id; unknown
        counts as one)."""
        return len({machine(r) for r in self.runs})


def machine(record: Record) -> tuple:
    device = record.device or {}
    if device.get("uuid"):
        return (device["uuid"],)
    return device.get("host"), device.get("pci_bus_id")


def replicate_number(record: Record) -> int:
    return record.replicate if record.replicate is not None else 1


def _spread(runs: list[Record], pct: str, low: str, high: str, verdict: str) -> Spread | None:
    paired = [r for r in runs if getattr(r, low) is not None and getattr(r, pct) is not None]
    if not paired or len(paired) != len(runs):
        return None
    values = [getattr(r, pct) for r in paired]
    intervals = [(getattr(r, low) / 100.0, getattr(r, high) / 100.0) for r in paired]
    combined = (replicated_verdict(intervals) if len(paired) > 1 else getattr(paired[0], verdict))
    return Spread(low=min(values), high=max(values), ci_low=min(getattr(r, low) for r in paired),
                  ci_high=max(getattr(r, high) for r in paired), verdict=combined)


def _median_run(runs: list[Record], key) -> Record:
    ordered = sorted(runs, key=key)  # stable: equal figures keep the runs' order
    return ordered[(len(ordered) - 1) // 2]


def _by_pct(r: Record) -> float:
    own = r.backend == "cublas" or r.pct_of_cublas is None
    return (r.gflops or 0.0) if own else r.pct_of_cublas


def _by_gflops(r: Record) -> float:
    return r.gflops or 0.0


def _by_best(r: Record) -> float:
    return r.pct_of_best_cublas if r.pct_of_best_cublas is not None else 0.0


def combine(records: list[Record], labels: list[str]) -> list[tuple[str, Row]]:
    """(label, row) per published row, in the order each row first appears in `records`.
    Raises ValueError for a row with two records of one replicate number."""
    groups: dict[tuple, list[Record]] = {}
    names: dict[tuple, str] = {}
    for label, r in zip(labels, records):
        key = (label, r.size_label)
        groups.setdefault(key, []).append(r)
        names[key] = label
    repeated = []
    for (label, size), group in groups.items():
        numbers = [replicate_number(r) for r in group]
        if len(set(numbers)) != len(numbers):
            repeated.append(f"{label} at {size} ({len(group)} jobs)")
        specs = {r.gpu_spec for r in group if r.gpu_spec}
        if len(specs) > 1:
            raise ValueError(f"{label} at {size} was measured on different GPU specs "
                             f"({', '.join(sorted(specs))}): replicates of a row must describe "
                             f"one GPU (publish each GPU's runs in a table of their own)")
    if repeated:
        raise ValueError("more than one job for " + ", ".join(repeated) + ": the table has one "
                         "row per kernel and size, and several jobs of one row only as numbered "
                         "replicates (clear the sweep directory and run it again)")
    rows = []
    for key, group in groups.items():
        ok = [r for r in group if r.ok]
        failed = tuple(r for r in group if not r.ok)
        if not ok:
            rows.append((names[key], Row(group[0], (), failed, None, None)))
            continue
        best_paired = all(r.pct_of_best_cublas is not None for r in ok)
        rows.append((names[key], Row(
            record=_median_run(ok, _by_pct), runs=tuple(ok), failed=failed,
            gflops_run=_median_run(ok, _by_gflops),
            best_run=_median_run(ok, _by_best) if best_paired else None,
            pct=_spread(ok, "pct_of_cublas", "pct_ci_low", "pct_ci_high", "verdict"),
            best=_spread(ok, "pct_of_best_cublas", "pct_best_ci_low", "pct_best_ci_high",
                         "verdict_best"))))
    return rows
