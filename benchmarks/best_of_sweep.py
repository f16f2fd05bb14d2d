"""Print the best verified configurations of a tuning sweep: per kernel and size, the top N by
GFLOP/s with their parameters, and how many jobs were pruned, failed or ok.

    python benchmarks/best_of_sweep.py multirun/tune/17_4096 [--top 5]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from src.records.record import load_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    for sweep in args.sweeps:
        records = load_records(sweep)
        statuses = Counter(r.status for r in records)
        print(f"== {sweep}: {len(records)} jobs, " + ", ".join(f"{s} {c}" for s, c in sorted(statuses.items())))
        groups = defaultdict(list)
        for r in records:
            if r.ok:
                groups[(r.kernel, r.m, r.n, r.k)].append(r)
        for (kernel, m, n, k), rows in sorted(groups.items()):
            rows.sort(key=lambda r: -r.gflops)
            print(f"  {kernel} {m}x{n}x{k} (cuBLAS FP32 {rows[0].cublas_fp32_gflops:,.0f})")
            for r in rows[: args.top]:
                print(f"    {r.gflops:>9,.0f} GFLOP/s {r.pct_of_cublas_fp32:6.1f}%  regs {r.registers:>3} "
                      f"local {r.local_bytes} clk {r.sm_clock_mhz_before}->{r.sm_clock_mhz_after}  "
                      f"{' '.join(f'{p}={v}' for p, v in r.params.items())}")


if __name__ == "__main__":
    main()
