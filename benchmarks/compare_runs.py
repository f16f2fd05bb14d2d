"""Compare two runs.csv files of the bench stage row by row (kernel, size): the GFLOP/s change of
every job that is ok in both, the largest one, and whether all are within a tolerance.

    python benchmarks/compare_runs.py results/runs.csv /tmp/first/runs.csv [--tolerance 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("new", type=Path)
    ap.add_argument("old", type=Path)
    ap.add_argument("--tolerance", type=float, default=3.0, help="percent")
    args = ap.parse_args()
    key = ["kernel", "m", "n", "k"]
    new, old = (pd.read_csv(p)[key + ["status", "gflops"]] for p in (args.new, args.old))
    both = new.merge(old, on=key, suffixes=("_new", "_old"))
    ok = both[(both.status_new == "ok") & (both.status_old == "ok")].copy()
    ok["change_pct"] = 100.0 * (ok.gflops_new / ok.gflops_old - 1.0)
    print(ok.sort_values("change_pct", key=abs, ascending=False).head(8).to_string(index=False))
    worst = ok.change_pct.abs().max()
    status_changed = both[both.status_new != both.status_old]
    print(f"{len(ok)} jobs ok in both, {len(status_changed)} changed status; "
          f"largest |change| {worst:.2f}% (tolerance {args.tolerance}%)")
    within = worst <= args.tolerance and status_changed.empty and len(ok) == len(new)
    print("all ok rows reproduce within tolerance" if within else "NOT within tolerance")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
