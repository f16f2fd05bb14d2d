"""Replicate step: the rows of a finished sweep that a claim rests on, measured again in fresh
processes on fresh inputs, so the table can show the spread across runs (src/records/replicates.py).

`python -m src.sweep.replicate SWEEP_DIR --runs 2 --headline K1,K2 --within 5 [-- OVERRIDES...]`

Which rows (`select`): every ok row of a `--headline` kernel, every ok row whose paired
interval (against cuBLAS, or against the stronger cuBLAS) comes within `--within` % of 100%, i.e.
whose verdict one more run could turn, and with `--baseline-drift P` every ok row whose paired
baseline ran more than P % away from that baseline's median over the sweep's rows of the same
problem: its % of cuBLAS carries the baseline's luck of that job (cuBLAS FP32 at 2048 moved 4%
from job to job on one H100), and more runs let the table take the median run. Failed rows are
not replicated (they have no verdict).
How: for each replicate number from `--first` (2) to `--runs`, one `python -m src.run -m` per
problem (M, N, K, alpha, beta) with that problem's selected kernels and `replicate=<number>`,
into SWEEP_DIR/replicates/run<number>/<M>x<N>x<K>/: a new launcher and worker process each time
(a separate process, a new CUDA context), inputs drawn afresh (bench.seed stays null). OVERRIDES
after `--` go to every one (the protocol the first sweep ran with). src.records.collect reads
these nested sweeps with SWEEP_DIR's own jobs. To add a run on another machine, run the same
command there with `--first 3 --runs 3` on a copy of SWEEP_DIR and collect both directories.

Exit status 1 when a replicate sweep had no ok job (the GPU is gone: `dvc repro` stops); a
replicate job that fails is recorded, and the table lists it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from src.records.record import REPLICATES_DIR, Record, load_records


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    alpha: float
    beta: float

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


def _close(low: float | None, high: float | None, within: float) -> bool:
    return low is not None and high is not None and low < 100 + within and high > 100 - within


def _baseline_medians(records: list[Record]) -> dict[tuple, float]:
    """(problem, baseline) -> the median GFLOP/s of that baseline over the rows paired with it."""
    figures: dict[tuple, list[float]] = {}
    for r in records:
        if r.ok and r.backend != "cublas" and r.baseline and r.baseline_gflops:
            key = (Problem(r.m, r.n, r.k, r.alpha, r.beta), r.baseline)
            figures.setdefault(key, []).append(r.baseline_gflops)
    return {key: statistics.median(values) for key, values in figures.items()}


def select(records: list[Record], headline: set[str], within: float,
           drift: float | None = None) -> dict[Problem, list[str]]:
    """Problem -> the kernels to run again there (see the module docstring), in record order."""
    medians = _baseline_medians(records) if drift is not None else {}
    chosen: dict[Problem, list[str]] = {}
    for r in records:
        problem = Problem(r.m, r.n, r.k, r.alpha, r.beta)
        if not r.ok or r.kernel in chosen.get(problem, []):
            continue
        close = r.backend != "cublas" and (
            _close(r.pct_ci_low, r.pct_ci_high, within)
            or _close(r.pct_best_ci_low, r.pct_best_ci_high, within))
        median = medians.get((problem, r.baseline))
        drifted = (median is not None and r.backend != "cublas" and r.baseline_gflops is not None
                   and abs(r.baseline_gflops - median) > median * drift / 100)
        if r.kernel in headline or close or drifted:
            chosen.setdefault(problem, []).append(r.kernel)
    return chosen


def commands(sweep_dir: Path, chosen: dict[Problem, list[str]], number: int,
             overrides: list[str]) -> list[tuple[Path, list[str]]]:
    """(sweep directory, command) of each fresh-process sweep of replicate `number`."""
    out = []
    for problem, kernels in chosen.items():
        where = sweep_dir / REPLICATES_DIR / f"run{number}" / problem.label
        out.append((where, [
            sys.executable, "-m", "src.run", "-m", "kernel=" + ",".join(kernels),
            f"m={problem.m}", f"n={problem.n}", f"k={problem.k}",
            f"alpha={problem.alpha!r}", f"beta={problem.beta!r}", f"replicate={number}",
            *overrides, f"hydra.sweep.dir={where}"]))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m src.sweep.replicate",
        description="Run the headline rows of a sweep, and those whose verdict is close, again in "
                    "fresh processes (replicate=2, 3, ...), into SWEEP_DIR/replicates/.")
    parser.add_argument("sweep_dir", type=Path, help="the finished sweep (its record.json files)")
    parser.add_argument("--runs", type=int, required=True,
                        help="replicates per selected row, the first sweep included (1: none)")
    parser.add_argument("--first", type=int, default=2, help="the first replicate number to run")
    parser.add_argument("--headline", default="", help="comma-separated kernels always replicated")
    parser.add_argument("--within", type=float, default=5.0,
                        help="also replicate rows whose interval comes within this %% of 100%%")
    parser.add_argument("--baseline-drift", type=float, default=None, metavar="P",
                        help="also replicate rows whose paired baseline ran more than P %% from its "
                             "median over the sweep's rows of the same problem")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.first < 2 or args.within < 0 or (args.baseline_drift or 0) < 0:
        parser.exit(2, f"error: --runs {args.runs}, --first {args.first}, --within {args.within}, "
                       f"--baseline-drift {args.baseline_drift} (rule: runs >= 1, first >= 2: "
                       f"replicate 1 is the sweep itself, within >= 0, baseline drift >= 0)\n")
    records = load_records(args.sweep_dir)
    if not records:
        parser.exit(1, f"error: no record.json under {args.sweep_dir} (did the sweep run?)\n")
    chosen = select(records, {k for k in args.headline.split(",") if k}, args.within,
                    args.baseline_drift)
    jobs = sum(len(kernels) for kernels in chosen.values())
    numbers = range(args.first, args.runs + 1)
    print(f"replicating {jobs} rows ({len(chosen)} problems) x {len(numbers)} more runs: "
          + "; ".join(f"{p.label}: {','.join(k)}" for p, k in chosen.items()), flush=True)
    failed = []
    for number in numbers:
        for where, cmd in commands(args.sweep_dir, chosen, number, overrides):
            if subprocess.run(cmd).returncode != 0:
                failed.append(str(where))
    if failed:
        print(f"error: replicate sweeps with no ok job (or that could not start): "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
