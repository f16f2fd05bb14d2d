"""Cards step: a new runs CSV keeps the earlier runs of the same jobs made on other cards, as
replicates, so a published row is measured on more than one machine whenever the GPU box has
lent more than one card.

`python -m src.records.cards NEW_RUNS.csv --earlier results/<gpu>/runs.csv`

The bench stage collects its sweep into NEW_RUNS.csv, then this step appends the rows of the
published runs.csv (the earlier run) that are replicates of a new row:
- made on another card (the card's UUID; else host and PCI bus id): this card's earlier rows are
  superseded by its new ones;
- the same job: the same kernel, size, α, β and GPU spec, the same kernel source (source_sha256)
  and tile parameters, and the same protocol (every `bench.*` column but the seed);
- renumbered after the new row's replicates (src/records/replicates.py refuses two records of one
  row with one number), their `job` prefixed with the card they ran on.
Anything else in the earlier file is dropped (other code, another protocol, a row this run does
not publish), and the count of each is printed. NEW_RUNS.csv is rewritten whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

_SAME_JOB = ("kernel", "m", "n", "k", "alpha", "beta", "gpu_spec", "source_sha256", "params",
             "precision", "backend")


def card(row: dict) -> tuple:
    """Which card a row ran on: its UUID, else host and PCI bus id (lent VMs share those)."""
    if row.get("device.uuid"):
        return (row["device.uuid"],)
    return row.get("device.host", ""), row.get("device.pci_bus_id", "")


def _job(row: dict, bench_columns: list[str]) -> tuple:
    return tuple(row.get(c, "") for c in _SAME_JOB) + tuple(row.get(c, "") for c in bench_columns)


def _replicate(row: dict) -> int:
    return int(row["replicate"]) if row.get("replicate") else 1


def keep_other_cards(new: list[dict], earlier: list[dict]) -> tuple[list[dict], dict]:
    """The new rows followed by the earlier rows that replicate them on other cards (renumbered),
    and the counts {kept, same_card, other_job} of the earlier rows."""
    bench_columns = sorted({c for row in new for c in row
                            if c.startswith("bench.") and c != "bench.seed"})
    new_cards = {card(r) for r in new}
    last = {}
    for r in new:
        key = _job(r, bench_columns)
        last[key] = max(last.get(key, 0), _replicate(r))
    kept, counts = [], {"kept": 0, "same_card": 0, "other_job": 0}
    for r in sorted(earlier, key=_replicate):
        key = _job(r, bench_columns)
        if card(r) in new_cards:
            counts["same_card"] += 1
        elif key not in last:
            counts["other_job"] += 1
        else:
            last[key] += 1
            label = card(r)[0] if len(card(r)) == 1 else "/".join(card(r))
            job = r.get("job", "")
            job = job if job.startswith(f"{label}: ") else f"{label}: {job}"  # kept once before
            kept.append({**r, "replicate": str(last[key]), "job": job})
            counts["kept"] += 1
    return new + kept, counts


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m src.records.cards",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the new runs CSV (src.records.collect), rewritten")
    parser.add_argument("--earlier", type=Path, required=True,
                        help="the published runs CSV; a missing file keeps nothing")
    args = parser.parse_args(argv)
    columns, new = _read(args.runs)
    if not args.earlier.exists():
        print(f"no {args.earlier}: no earlier card's runs to keep")
        return 0
    earlier_columns, earlier = _read(args.earlier)
    rows, counts = keep_other_cards(new, earlier)
    columns += [c for c in earlier_columns if c not in columns]
    tmp = args.runs.with_name(args.runs.name + ".cards")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, args.runs)
    cards = len({card(r) for r in rows})
    print(f"{args.runs}: {len(new)} new rows + {counts['kept']} from earlier cards "
          f"({cards} card(s) in all); dropped {counts['same_card']} of this card's earlier rows "
          f"and {counts['other_job']} of other jobs (code, parameters or protocol changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
