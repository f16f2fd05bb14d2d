"""Replicates step: the records of one published row (kernel label, M, N, K, GPU spec) measured in
several independent runs (separate processes, fresh inputs; src/sweep/replicate.py makes them),
combined into what the row publishes.

- The row's figures are those of its **median run**: the run whose % of cuBLAS is the median of
  the runs' (the lower of the two middle ones for an even count: the conservative choice), so
  the published % stays exactly the ratio of the published GFLOP/s. A cuBLAS row (its own
  baseline) takes the run with the median GFLOP/s.
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
    record: Record           # the median run (or, with no ok run, the first failed one)
    runs: tuple[Record, ...]  # every ok run of the row
    failed: tuple[Record, ...]  # the row's failed runs
    pct: Spread | None       # against cuBLAS in the kernel's precision (paired rows)
    best: Spread | None      # against the stronger cuBLAS (bench.best_cublas)

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


def _median_run(runs: list[Record]) -> Record:
    def key(r: Record) -> float:
        own = r.backend == "cublas" or r.pct_of_cublas is None
        return (r.gflops or 0.0) if own else r.pct_of_cublas
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


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
        rows.append((names[key], Row(
            record=_median_run(ok), runs=tuple(ok), failed=failed,
            pct=_spread(ok, "pct_of_cublas", "pct_ci_low", "pct_ci_high", "verdict"),
            best=_spread(ok, "pct_of_best_cublas", "pct_best_ci_low", "pct_best_ci_high",
                         "verdict_best"))))
    return rows
