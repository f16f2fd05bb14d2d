"""Paired comparisons, repeated: how stable the % of cuBLAS and its interval are (issue 18).

`python3 benchmarks/paired_demo.py [--rounds 2] [--bench default]`

Each pair is timed interleaved (A B A B ..., the L2 flushed before each launch) by the measure
step itself (src/job/measure.verify_and_time with a paired baseline), so the timed launches are
checked and the figure passes plausibility as in a job. cuBLAS TF32 against itself at 1024 (a
~17 us kernel) shows the noise floor: its ratio should be a tie near 100%. Chapter 22 against
cuBLAS FP32 at 1024 is the published claim. Then one healthy job through the runner's own path
(src.job.pipeline.run_job) per kernel, with its wall time and the share the checks of the timed
launches took (the checks' overhead per job).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from src.job.baselines import Baselines  # noqa: E402
from src.job.config import compose, kernel_config  # noqa: E402
from src.job.measure import verify_and_time  # noqa: E402
from src.job.pipeline import run_job  # noqa: E402
from src.job.prepare import prepare_kernel, target  # noqa: E402
from src.job.problem import Problem  # noqa: E402
from src.records.record import new_record  # noqa: E402

PAIRS = [("cublas_tf32", "cublas_tf32", 1024), ("22_ffma_warp_specialized", "cublas_fp32", 1024),
         ("20_wgmma_tf32", "cublas_tf32", 1024)]
# the same kernels also against cuBLASLt autotuned per shape (nvmath-python): % of the stronger
BEST = [("22_ffma_warp_specialized", "cublas_fp32", 1024), ("22_ffma_warp_specialized", "cublas_fp32", 4096),
        ("20_wgmma_tf32", "cublas_tf32", 4096)]
JOBS = [("06_vectorize", 4096), ("22_ffma_warp_specialized", 4096), ("22_ffma_warp_specialized", 1024),
        ("cublas_tf32", 1024)]


def paired_row(kernel: str, baseline: str, size: int, bench: dict, where, best=False) -> dict:
    prepared = prepare_kernel(kernel_config(kernel), Problem(size, size, size, 1.0, 0.0), where, bench)
    record = new_record(kernel, prepared.spec.precision, prepared.spec.backend, vars(prepared.problem))
    baselines = Baselines()
    paired = baselines.paired(baseline, prepared)  # a second, separate instance of the baseline
    stronger = baselines.autotuned(prepared.spec.precision, prepared) if best else None
    verify_and_time(prepared, record, baseline=paired, stronger=stronger)
    if best:
        return {"kernel": kernel, "size": size, "gflops": record.gflops,
                "default": record.baseline_gflops, "autotuned": record.cublaslt_gflops,
                "best": record.best_cublas, "pct": record.pct_of_best_cublas,
                "low": record.pct_best_ci_low, "high": record.pct_best_ci_high,
                "verdict": record.verdict_best}
    return {"kernel": kernel, "baseline": baseline, "size": size, "gflops": record.gflops,
            "baseline_gflops": record.baseline_gflops, "pct": record.pct_of_cublas,
            "low": record.pct_ci_low, "high": record.pct_ci_high, "verdict": record.verdict,
            "pairs": record.samples, "median_us": 1e3 * record.time_ms_median}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", default="default")
    args = parser.parse_args()
    cfg = compose(f"bench={args.bench}")
    from omegaconf import OmegaConf

    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    where = target(cfg.gpu)
    rows = []
    for round_no in range(1, args.rounds + 1):
        for kernel, baseline, size in PAIRS:
            row = paired_row(kernel, baseline, size, bench, where)
            rows.append({"round": round_no, **row})
            print(f"round {round_no}: {kernel} vs {baseline} at {size}: {row['gflops']:,.0f} vs "
                  f"{row['baseline_gflops']:,.0f} GFLOP/s = {row['pct']:.1f}% "
                  f"[{row['low']:.1f}, {row['high']:.1f}] {row['verdict']} ({row['pairs']} pairs, "
                  f"{row['median_us']:.1f} us)", flush=True)
    print("\nAgainst the stronger of cuBLAS's default and cuBLASLt autotuned (nvmath-python):")
    for kernel, baseline, size in BEST:
        try:
            r = paired_row(kernel, baseline, size, bench, where, best=True)
        except Exception as exc:  # report and go on: the demo's other rows stand
            print(f"  {kernel} at {size}: {type(exc).__name__}: {exc}")
            continue
        if r["autotuned"] is None:
            print(f"  {kernel} at {size}: cuBLASLt autotuned not available (see the warning above)")
            continue
        print(f"  {kernel} at {size}: {r['gflops']:,.0f} GFLOP/s; cuBLAS default {r['default']:,.0f}, "
              f"cuBLASLt autotuned {r['autotuned']:,.0f}; stronger {r['best']}: {r['pct']:.1f}% "
              f"[{r['low']:.1f}, {r['high']:.1f}] {r['verdict']}", flush=True)
    print("\nOverhead per job (run_job, default protocol): wall time, and the checks of the timed "
          "launches (poisoned sample + last launch + fresh inputs)")
    for kernel, size in JOBS:
        started = time.perf_counter()
        record = run_job(compose(f"kernel={kernel}", f"size={size}", f"bench={args.bench}"))
        wall = time.perf_counter() - started
        checks = record.check_seconds or 0.0
        print(f"  {kernel} at {size}: {record.status}, job {wall:.2f} s, checks {checks:.3f} s "
              f"({100 * checks / wall:.1f}%), {record.samples} pairs, throttle reasons "
              f"{record.throttle_reasons}", flush=True)
    print("\n| round | kernel | baseline | size | GFLOP/s | baseline GFLOP/s | % | 95% interval | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['kernel']} | {r['baseline']} | {r['size']} | {r['gflops']:,.0f} | "
              f"{r['baseline_gflops']:,.0f} | {r['pct']:.1f} | [{r['low']:.1f}, {r['high']:.1f}] | "
              f"{r['verdict']} |")
    for kernel, baseline, size in PAIRS:
        mine = [r for r in rows if r["kernel"] == kernel and r["baseline"] == baseline]
        if len(mine) >= 2:
            gf = [r["gflops"] for r in mine]
            pct = [r["pct"] for r in mine]
            print(f"{kernel} vs {baseline} at {size}: GFLOP/s spread between rounds "
                  f"{100 * (max(gf) / min(gf) - 1):.2f}%, % spread {max(pct) - min(pct):.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
