"""Rows measured again through today's dispatch, put in place of their published rows.

A re-fit of conf/tuned/<gpu>.yaml moves some published rows' launch (src/publish/dispatched.py
lists them as sweeps); measuring those sweeps again costs minutes where the whole set costs a
GPU session. This step replaces each such row of a published runs CSV (suite_runs.csv,
heldout_runs.csv) with its new measurement, whole, failed or not (a figure from a kernel that
failed appears nowhere), and refuses rows that would make the file say what was not measured: a
row with no published row to replace (the set's shapes are the suite's), one from another GPU
spec or timed otherwise than its protocol asked (src.records.collect.runs_refusal), one that did
not run today's dispatch, or two for one row. Nothing is written unless every row passes; the
file is replaced whole (src/publish/staged.py). The report and its tables are then rebuilt from
the file as the stage builds them (`python -m src.publish.heldout` / `dvc repro`).

`python -m src.publish.splice RUNS_CSV --gpu GPU NEW_RUNS_CSV [NEW_RUNS_CSV ...]`
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from src.errors import ConfigError
from src.publish.dispatched import dispatched_today, refusal
from src.publish.staged import staged
from src.records.collect import read_runs, runs_refusal

RULE = ("rule: a spliced row replaces the published row of its kernel and problem, measured on "
        "the set's GPU through today's dispatch, one row each")


def _key(row: dict) -> tuple:
    return (str(row["kernel"]), int(float(row["m"])), int(float(row["n"])), int(float(row["k"])),
            float(row["alpha"]), float(row["beta"]))


def _named(keys) -> str:
    return ", ".join(f"{k[0]} {k[1]}x{k[2]}x{k[3]}" for k in sorted(keys))


def _rows(path: Path) -> tuple[list[str], list[dict], pd.DataFrame]:
    """(the columns, the rows as read, text for text, the frame src.records.collect reads: a
    ValueError where the file is no runs CSV)."""
    frame = read_runs(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader), frame


def spliced(runs_csv: Path, gpu_spec: str, new_csvs: list[Path]) -> tuple[list[str], list[dict], list[str]]:
    """(the columns, the rows of `runs_csv` with each row of `new_csvs` in place of the published
    row of its kernel and problem, a line per replaced row: its launch and ratio before and
    after). Rows kept are kept as read, text for text; a column only the new rows record is
    added, empty elsewhere. A row that breaks the module's rules is a ConfigError naming the rows
    and the rule."""
    columns, base, _ = _rows(runs_csv)
    published = Counter(_key(r) for r in base)
    where = {_key(r): i for i, r in enumerate(base)}
    new, frames = [], []
    for path in new_csvs:
        refused = refusal(path, gpu_spec) or runs_refusal(gpu_spec, path)
        if refused:
            raise ConfigError(f"not spliced into {runs_csv}: {refused}")
        more, rows, frame = _rows(path)
        columns += [c for c in more if c not in columns]
        new += rows
        frames.append(frame)
    keys = [_key(r) for r in new]
    twice = {k for k, n in Counter(keys).items() if n > 1}
    shared = {k for k in keys if published[k] > 1}  # two published rows: neither is "its" row
    moved = {key: now for key, now in dispatched_today(pd.concat(frames), gpu_spec).items() if now}
    broken = [text for text, bad in (
        (f"no published row to replace ({_named(set(keys) - set(where))})", set(keys) - set(where)),
        (f"more than one new row for {_named(twice)}", twice),
        (f"more than one published row for {_named(shared)}", shared),
        (f"measured through another dispatch than today's ({_named(moved)}; today runs "
         f"{'; '.join(sorted(set(moved.values())))})", moved)) if bad]
    if broken:
        raise ConfigError(f"not spliced into {runs_csv}: " + "; ".join(broken) + f" ({RULE}).")
    out, lines = list(base), []
    for key, row in zip(keys, new):
        before = out[where[key]]
        out[where[key]] = row
        lines.append(f"{_named([key])}: {_launch(before)} {_ratio(before)} -> {_launch(row)} {_ratio(row)}")
    return columns, out, lines


def _launch(row: dict) -> str:
    return f"{row['dispatched_to']} {row.get('params', '')}" if row.get("dispatched_to") else "(no dispatch recorded)"


def _ratio(row: dict) -> str:
    if row.get("status") != "ok":
        return str(row.get("status"))
    value = row.get("pct_of_best_cublas") or ""  # a percentage of the stronger cuBLAS
    return f"{float(value) / 100:.3f}x" if value else "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the published runs CSV whose rows are replaced")
    parser.add_argument("--gpu", required=True, help="the GPU spec the set and the new rows are measured on")
    parser.add_argument("new", type=Path, nargs="+", help="runs CSVs (src.records.collect) measured again")
    args = parser.parse_args(argv)
    try:
        refused = refusal(args.runs, args.gpu)
        if refused:
            raise ConfigError(refused)
        columns, rows, lines = spliced(args.runs, args.gpu, args.new)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with staged(args.runs.parent) as new_path, new_path(args.runs.name).open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"spliced {len(lines)} rows into {args.runs}:")
    print("\n".join(f"  {line}" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
