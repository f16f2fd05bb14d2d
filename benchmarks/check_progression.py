"""Check the progression goals on sweeps made by `python -m src.run -m 'kernel=glob(*)' size=...`.

Usage: python benchmarks/check_progression.py SWEEP_DIR [SECOND_SWEEP_DIR]
Goals (issue 2): every job verified; at the largest size GFLOP/s strictly increase 01 < ... < 06;
06 reaches >= 55% of cuBLAS FP32 there; a second sweep reproduces every figure within 2%.
Prints a short table and exits non-zero when a goal is missed. Run on the GPU box, never in CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from src.records.record import load_records  # noqa: E402

CHAPTERS = ["01_naive", "02_gmem_coalesce", "03_smem_blocking", "04_blocktile_1d",
            "05_blocktile_2d", "06_vectorize"]
MIN_PCT_06 = 55.0
REPRO_TOLERANCE = 0.02


def main(argv: list[str]) -> int:
    runs = [load_records(Path(d)) for d in argv[1:3]]
    first = runs[0]
    failures = []
    bad = [f"{r.kernel}@{r.size_label}: {r.status}" for r in first if not r.ok]
    if bad:
        failures.append("jobs not verified: " + ", ".join(bad))
    by_key = {(r.kernel, r.size_label): r for r in first}
    largest = max((r for r in first), key=lambda r: r.m * r.n * r.k).size_label
    chain = [by_key.get((k, largest)) for k in CHAPTERS]
    gflops = [r.gflops if r is not None and r.ok else None for r in chain]
    if None in gflops or any(a >= b for a, b in zip(gflops, gflops[1:])):
        failures.append(f"GFLOP/s at {largest} do not strictly increase 01 < ... < 06: {gflops}")
    pct06 = chain[-1].pct_of_cublas_fp32 if chain[-1] is not None and chain[-1].ok else None
    if pct06 is None or pct06 < MIN_PCT_06:
        failures.append(f"06 at {largest} reaches {pct06}% of cuBLAS FP32 (goal >= {MIN_PCT_06}%)")

    print(f"{'kernel':<18} {'size':>6} {'GFLOP/s':>11} {'% cuBLAS':>9}" +
          (f" {'rerun':>11} {'diff':>7}" if len(runs) > 1 else ""))
    second = {(r.kernel, r.size_label): r for r in runs[1]} if len(runs) > 1 else {}
    for r in first:
        line = f"{r.kernel:<18} {r.size_label:>6} "
        line += f"{r.gflops:>11,.1f} {r.pct_of_cublas_fp32:>8.1f}%" if r.ok else f"{r.status:>21}"
        again = second.get((r.kernel, r.size_label))
        if again is not None and r.ok and again.ok:
            diff = again.gflops / r.gflops - 1
            line += f" {again.gflops:>11,.1f} {100 * diff:>+6.2f}%"
            if abs(diff) > REPRO_TOLERANCE:
                failures.append(f"{r.kernel}@{r.size_label} moved {100 * diff:+.2f}% between runs")
        elif second:
            failures.append(f"{r.kernel}@{r.size_label} missing or failed in the second run")
        print(line)
    for failure in failures:
        print("GOAL MISSED:", failure)
    print("all progression goals met" if not failures else f"{len(failures)} goal(s) missed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
