"""Recheck step: does a fresh run agree with the published table? Two progression.csv files (the
contract of src/publish/table.py) compared row by row, matched by kernel, M, N and K.

A row is failed when it is not `ok` in either table; outside when its GFLOP/s, its % of cuBLAS in
its own precision or its % of the stronger cuBLAS moved by more than --within % (relative); a
disagreement when a published faster / slower (verdict, verdict_best, verdict_peer) is not the
fresh table's word too. A published tie, or no verdict, accepts anything. Rows in one table only
are listed, not counted against the run. Exit status 0 when the run agrees, 1 when it does not,
2 when a table cannot be read.

Two steps, the fresh run's table first (--ceilings is optional):
    python -m src.publish.table fresh_runs.csv --out-dir /tmp/fresh
    python -m src.publish.recheck results/h100_sxm/progression.csv /tmp/fresh/progression.csv [--within 2.0]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from src.errors import LabError, StorageError
from src.records.verdicts import FASTER, SLOWER

REQUIRED = ("kernel", "m", "n", "k", "gflops", "status")
FIGURES = ("gflops", "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_best_cublas")
VERDICTS = ("verdict", "verdict_best", "verdict_peer")
SHOWN_ONLY_IN_ONE = 10


@dataclass
class Report:
    within_pct: float
    compared: int = 0
    failed: list[str] = field(default_factory=list)         # one line per row
    outside: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    gflops_ratios: list[float] = field(default_factory=list)  # fresh / published
    pct_changes: list[float] = field(default_factory=list)    # % of cuBLAS: fresh / published - 1, in %
    best_changes: list[float] = field(default_factory=list)   # % of the stronger cuBLAS, the same
    only_published: list[str] = field(default_factory=list)
    only_fresh: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not (self.failed or self.outside or self.disagreements)

    def text(self) -> str:
        lines = [f"{self.compared} rows compared: {len(self.failed)} failed, {len(self.outside)} "
                 f"outside {self.within_pct:g}%, {len(self.disagreements)} verdict disagreements",
                 _spread("GFLOP/s fresh / published", self.gflops_ratios, "{:.3f}"),
                 _spread("% of cuBLAS, change", self.pct_changes, "{:+.2f}%"),
                 _spread("% of the stronger cuBLAS, change", self.best_changes, "{:+.2f}%")]
        for name, rows in (("only in the published table", self.only_published),
                           ("only in the fresh table", self.only_fresh)):
            if rows:
                more = f", and {len(rows) - SHOWN_ONLY_IN_ONE} more" if len(rows) > SHOWN_ONLY_IN_ONE else ""
                lines.append(f"{name}: {len(rows)} ({', '.join(rows[:SHOWN_ONLY_IN_ONE])}{more})")
        lines += [f"failed: {line}" for line in self.failed]
        lines += [f"outside: {line}" for line in self.outside]
        lines += [f"disagrees: {line}" for line in self.disagreements]
        lines.append("the fresh run agrees with the published table" if self.agrees
                     else "the fresh run does NOT agree with the published table")
        return "\n".join(lines) + "\n"


def _spread(name: str, values: list[float], form: str) -> str:
    if not values:
        return f"{name}: no figure in both tables"
    low, mid, high = (form.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{name}: min {low}, median {mid}, max {high}"


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def _own_pct_column(row: dict) -> str:
    """% of cuBLAS in the row's own precision: the point whose interval is pct_ci_low / high
    (src/job/recording.py sets both from one ratio); the other precision's column is empty."""
    preferred = "pct_of_cublas_tf32" if row.get("precision") == "tf32" else "pct_of_cublas_fp32"
    other = "pct_of_cublas_fp32" if preferred.endswith("tf32") else "pct_of_cublas_tf32"
    return preferred if row.get(preferred) or not row.get(other) else other


def _leading_word(verdict: str | None) -> str:
    """faster / slower / tie, whatever follows it ("tie (runs disagree)")."""
    match = re.match(r"[a-z]+", (verdict or "").strip().lower())
    return match.group(0) if match else ""


def _name(row: dict) -> str:
    return f"{row['kernel']} {row['m']}x{row['n']}x{row['k']}"


def compare(published_rows: list[dict], fresh_rows: list[dict], within_pct: float) -> Report:
    """The fresh table against the published one (rows as read_table gives them)."""
    report = Report(within_pct=within_pct)
    fresh = {(r["kernel"], r["m"], r["n"], r["k"]): r for r in fresh_rows}
    published_keys = set()
    for pub in published_rows:
        key = (pub["kernel"], pub["m"], pub["n"], pub["k"])
        published_keys.add(key)
        new = fresh.get(key)
        if new is None:
            report.only_published.append(_name(pub))
            continue
        report.compared += 1
        if pub["status"] != "ok" or new["status"] != "ok":  # no figure to compare
            report.failed.append(f"{_name(pub)}: published {pub['status']}, fresh {new['status']}")
            continue
        moved = []
        for label, column, changes in (("GFLOP/s", "gflops", None),
                                       ("% of cuBLAS", _own_pct_column(pub), report.pct_changes),
                                       ("% of the stronger cuBLAS", "pct_of_best_cublas", report.best_changes)):
            before, after = _number(pub.get(column)), _number(new.get(column))
            if before is None or after is None or before == 0:  # a figure only one run has
                continue
            change = 100 * (after / before - 1)
            if changes is None:
                report.gflops_ratios.append(after / before)
            else:
                changes.append(change)
            if abs(change) > within_pct:
                moved.append(f"{label} {pub[column]} -> {new[column]} ({change:+.2f}%)")
        if moved:
            report.outside.append(f"{_name(pub)}: " + "; ".join(moved))
        for column in VERDICTS:
            if column not in pub or column not in new:  # a table without peers has no verdict_peer
                continue
            said, now = _leading_word(pub[column]), _leading_word(new[column])
            if said in (FASTER, SLOWER) and now != said:
                report.disagreements.append(f"{_name(pub)}: {column} published {pub[column]}, "
                                            f"fresh {new[column] or '(none)'}")
    report.only_fresh = [_name(r) for key, r in fresh.items() if key not in published_keys]
    return report


def read_table(path: Path) -> list[dict]:
    """A progression.csv's rows, M, N and K as integers' text and the figures checked to be
    numbers, so that compare() meets no surprise; StorageError names the rule a file breaks."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise StorageError(f"{path} cannot be read ({exc}): give the progression.csv that "
                           f"`python -m src.publish.table` wrote.") from exc
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise StorageError(f"{path} is not a progression table written by src.publish.table: no "
                           f"column(s) {', '.join(missing)}; a table needs {', '.join(REQUIRED)}.")
    seen = set()
    for line, row in enumerate(rows, start=2):
        try:
            row["m"], row["n"], row["k"] = (str(int(float(row[c]))) for c in ("m", "n", "k"))
            for column in FIGURES:
                _number(row.get(column))
        except (TypeError, ValueError) as exc:
            raise StorageError(f"{path}, line {line}: sizes and figures must be numbers ({exc}); "
                               f"the file is damaged or not a progression table.") from exc
        key = (row["kernel"], row["m"], row["n"], row["k"])
        if key in seen:
            raise StorageError(f"{path}, line {line}: {_name(row)} appears twice; a progression "
                               f"table has one row per kernel and size.")
        seen.add(key)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.publish.recheck",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("published", type=Path, help="the published progression.csv")
    parser.add_argument("fresh", type=Path, help="the fresh run's progression.csv (src.publish.table)")
    parser.add_argument("--within", type=float, default=2.0,
                        help="how far, in % (relative), a figure may move (default 2.0)")
    args = parser.parse_args(argv)
    if args.within < 0:
        parser.error("--within is a tolerance in %: it cannot be negative")
    try:
        report = compare(read_table(args.published), read_table(args.fresh), args.within)
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.fresh} (fresh) against {args.published} (published), within {args.within:g}%")
    print(report.text(), end="")
    return 0 if report.agrees else 1


if __name__ == "__main__":
    sys.exit(main())
