"""Does a heavy job's figure depend on what ran before it, and does a timed warm-up fix that?

`python -m benchmarks.clock_settle [--size 8192] [--settings 0:0.75,1000:0.75,1000:0.5] [--repeats 2]`

1. The clock's course: cuBLAS TF32 at SIZE launched back to back for 2 s from an idle card, the
   SM clock of each launch (clock64 over %globaltimer, the runner's probe) in 100 ms windows.
2. The figure under two histories: each job (cuBLAS TF32 alone, chapter 20 paired with cuBLAS
   TF32) through the runner's own path (run_job) after the card idled for 8 s ("cold") and after
   4 s of back-to-back cuBLAS TF32 at 16384 ("hot"), for each pair of bench.warmup_ms and
   bench.throttle_threshold. A protocol that makes the figure independent of the history shows
   equal cold and hot figures.
Prints a table last.
"""

from __future__ import annotations

import argparse
import time


from src.job.config import compose
from src.job.cublas import CublasGemm
from src.job.pipeline import run_job
from src.job.prepare import prepare
from src.job.timing import ClockProbe


def tf32_matmul(size: int):
    """A closure launching the runner's cuBLAS TF32 baseline at size^3 on random inputs."""
    import cupy as cp

    spec = prepare(compose("kernel=cublas_tf32", f"size={size}")).spec
    gemm = CublasGemm(spec)
    rng = cp.random.default_rng(1)
    a, b = (rng.standard_normal((size, size), dtype=cp.float32) for _ in range(2))
    c = cp.empty((size, size), dtype=cp.float32)
    return lambda: gemm.launch(a, b, c, 1.0, 0.0)


def clock_course(size: int, seconds: float) -> list[tuple[float, float]]:
    """(time in s, median SM clock in MHz) per 100 ms window of back-to-back launches."""
    import cupy as cp
    import numpy as np

    launch = tf32_matmul(size)
    batch = 16
    probe = ClockProbe(batch)
    time.sleep(8)
    windows, started = [], time.perf_counter()
    current, current_start = [], 0.0
    while time.perf_counter() - started < seconds:
        for i in range(batch):
            probe.before(i)
            launch()
            probe.after(i)
        cp.cuda.get_current_stream().synchronize()
        now = time.perf_counter() - started
        current.extend(probe.read(batch))
        if now - current_start >= 0.1:
            windows.append((round(current_start, 2), float(np.median(current))))
            current, current_start = [], now
    return windows


def heat(seconds: float) -> None:
    import cupy as cp

    launch = tf32_matmul(16384)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(4):
            launch()
        cp.cuda.get_current_stream().synchronize()


def job(kernel: str, size: int, warmup_ms: float, threshold: float) -> dict:
    import numpy as np

    record = run_job(compose(f"kernel={kernel}", f"size={size}", f"bench.warmup_ms={warmup_ms}",
                             f"bench.throttle_threshold={threshold}"))
    clocks = record.sample_clock_mhz or [float("nan")]
    return {"status": record.status, "gflops": record.gflops, "pct": record.pct_of_cublas,
            "baseline": record.baseline_gflops, "clock": float(np.median(clocks)),
            "throttled": record.samples_throttled, "error": record.error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--settings", default="0:0.75,1000:0.75,1000:0.5",
                        help="bench.warmup_ms:bench.throttle_threshold pairs, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--course-seconds", type=float, default=2.0)
    args = parser.parse_args()
    print("clock course from idle, cuBLAS TF32 at", args.size)
    for t, mhz in clock_course(args.size, args.course_seconds):
        print(f"  t={t:5.2f} s  SM {mhz:7.1f} MHz")
    rows = []
    settings = [tuple(map(float, item.split(":"))) for item in args.settings.split(",")]
    for warmup_ms, threshold in settings:
        for repeat in range(args.repeats):
            for history in ("cold", "hot"):
                if history == "cold":
                    time.sleep(8)
                else:
                    heat(4.0)
                for kernel in ("cublas_tf32", "20_wgmma_tf32"):
                    r = job(kernel, args.size, warmup_ms, threshold)
                    rows.append((f"{warmup_ms:.0f} / {threshold}", repeat, history, kernel, r))
                    print(warmup_ms, threshold, repeat, history, kernel, r, flush=True)
    print("\n| warmup_ms / throttle_threshold | run | history | kernel | status | GFLOP/s | paired cuBLAS | % | median SM MHz | throttled |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for setting, repeat, history, kernel, r in rows:
        g = f"{r['gflops']:,.0f}" if r["gflops"] else "-"
        b = f"{r['baseline']:,.0f}" if r["baseline"] else "-"
        p = f"{r['pct']:.1f}" if r["pct"] else "-"
        print(f"| {setting} | {repeat} | {history} | {kernel} | {r['status']} | {g} | {b} | {p} "
              f"| {r['clock']:.0f} | {r['throttled']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
