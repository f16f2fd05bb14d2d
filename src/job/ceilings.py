"""Ceilings step: this GPU's measured FP32 FMA throughput and device-memory bandwidth, for the
roofline and % of peak (results/ceilings.json).

`python -m src.job.ceilings -o results/ceilings.json [--warmup 10 --samples 100 --copy-mib 1024]`

- FFMA: a register-only kernel (NVRTC through CuPy's RawKernel) in which every thread runs
  CHAINS independent `fmaf` chains, UNROLL steps per loop trip, over ITERS trips, launched as one
  full wave (every SM at its maximum resident threads). Nothing touches memory but one store per
  thread at the end. FLOP per launch = 2 * CHAINS * UNROLL * ITERS * threads.
- Device-memory bandwidth: a grid-stride float4 copy between two buffers of --copy-mib MiB each
  (far larger than L2, so the copy streams from and to DRAM); bytes per launch = 2 * buffer
  (one read, one write), reported in GB/s (1e9 bytes).

Both are timed with src.job.timing.measure (CUDA events around each launch, after `--warmup`
launches); the median of `--samples` samples is reported, with min, max, IQR and the SM clock
before and after. The GPU's datasheet figures (conf/gpu/) are written alongside for reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from src.job import gpu as gpu_mod
from src.errors import NoGPU
from src.job.timing import Timing, measure

CHAINS = 8       # independent accumulators per thread: instruction-level parallelism
UNROLL = 64      # FMA steps per chain per loop trip, so loop overhead is under 1% of instructions
ITERS = 1024     # loop trips: about 4 ms per launch on an H100 SXM
THREADS_PER_BLOCK = 256
COPY_THREADS_PER_BLOCK = 256

FFMA_SOURCE = r"""
extern "C" __global__ void ffma_throughput(float* out, float a, float b, int iters) {
    float x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], a, b);
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps every chain live
}
"""

COPY_SOURCE = r"""
extern "C" __global__ void copy_float4(const float4* __restrict__ src, float4* __restrict__ dst,
                                       unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = src[i];
}
"""


def ffma_source() -> str:
    return f"#define CHAINS {CHAINS}\n#define UNROLL {UNROLL}\n" + FFMA_SOURCE


def ffma_flops(threads: int, iters: int = ITERS) -> int:
    """FLOP per launch of the FFMA kernel: one FMA is two floating-point operations."""
    return 2 * CHAINS * UNROLL * iters * threads


def _timing_dict(t: Timing) -> dict:
    return {"time_ms_median": t.median_ms, "time_ms_min": t.min_ms, "time_ms_max": t.max_ms,
            "time_ms_iqr": t.iqr_ms, "samples": t.samples,
            "sm_clock_mhz_before": t.sm_clock_mhz_before, "sm_clock_mhz_after": t.sm_clock_mhz_after}


def _time(launch, device, warmup: int, samples: int) -> Timing:
    """Exactly `samples` timed launches after `warmup` untimed ones (no early stop)."""
    return measure(launch, warmup=warmup, min_samples=samples, max_samples=samples,
                   target_rel_iqr=0.0, max_seconds=float("inf"),
                   read_clock=lambda: gpu_mod.sm_clock_mhz(device))


def measure_ffma(device, warmup: int, samples: int) -> dict:
    import cupy as cp
    import numpy as np

    kernel = cp.RawKernel(ffma_source(), "ffma_throughput", options=("-std=c++17",))
    per_sm = int(cp.cuda.Device().attributes["MaxThreadsPerMultiProcessor"])
    blocks = device.sms * max(1, per_sm // THREADS_PER_BLOCK)
    threads = blocks * THREADS_PER_BLOCK
    out = cp.empty(threads, dtype=cp.float32)
    args = (out, np.float32(0.999), np.float32(1e-3), np.int32(ITERS))
    timing = _time(lambda: kernel((blocks,), (THREADS_PER_BLOCK,), args), device, warmup, samples)
    if not bool(cp.isfinite(out).all()):
        raise RuntimeError("the FFMA kernel produced non-finite values; its figure is not trusted")
    flops = ffma_flops(threads)
    return {"gflops": flops / (timing.median_ms * 1e-3) / 1e9, "flops_per_launch": flops,
            "blocks": blocks, "threads_per_block": THREADS_PER_BLOCK, "chains": CHAINS,
            "unroll": UNROLL, "iters": ITERS, "registers": int(kernel.num_regs),
            **_timing_dict(timing)}


def measure_dram(device, warmup: int, samples: int, copy_mib: int) -> dict:
    import cupy as cp
    import numpy as np

    kernel = cp.RawKernel(COPY_SOURCE, "copy_float4", options=("-std=c++17",))
    nbytes = copy_mib << 20
    if nbytes < 8 * device.l2_bytes:
        raise ValueError(f"--copy-mib {copy_mib} is not much larger than this GPU's L2 "
                         f"({device.l2_bytes >> 20} MiB): use at least {8 * device.l2_bytes >> 20}")
    n4 = nbytes // 16
    src = cp.ones(n4 * 4, dtype=cp.float32)
    dst = cp.zeros_like(src)
    per_sm = int(cp.cuda.Device().attributes["MaxThreadsPerMultiProcessor"])
    blocks = device.sms * max(1, per_sm // COPY_THREADS_PER_BLOCK)
    args = (src, dst, np.uint64(n4))
    timing = _time(lambda: kernel((blocks,), (COPY_THREADS_PER_BLOCK,), args), device, warmup, samples)
    if not bool((dst[:: max(1, dst.size // 4096)] == 1).all()):
        raise RuntimeError("the copy kernel did not copy; its figure is not trusted")
    moved = 2 * n4 * 16
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return {"gbs": moved / (timing.median_ms * 1e-3) / 1e9, "bytes_per_launch": moved,
            "buffer_bytes": n4 * 16, "blocks": blocks, "threads_per_block": COPY_THREADS_PER_BLOCK,
            **_timing_dict(timing)}


def measure_ceilings(warmup: int, samples: int, copy_mib: int) -> dict:
    device = gpu_mod.detect()  # raises NoGPU
    spec = gpu_mod.resolve_spec({"name": "auto"}, device)
    ffma = measure_ffma(device, warmup, samples)
    dram = measure_dram(device, warmup, samples, copy_mib)
    return {
        "measured": True,
        "provenance": "measured on this GPU by `python -m src.job.ceilings` (CUDA events, median "
                      "of the samples after warm-up)",
        "gpu": device.name,
        "gpu_spec": spec.name,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ffma_gflops": ffma["gflops"],
        "dram_gbs": dram["gbs"],
        "ffma": ffma,
        "dram": dram,
        "datasheet": {
            "fp32_gflops": spec.fp32_tflops * 1e3 if spec.fp32_tflops else None,
            "tf32_gflops": spec.tf32_tflops * 1e3 if spec.tf32_tflops else None,
            "mem_bandwidth_gbs": spec.mem_bandwidth_gbs,
        },
        "device": asdict(device),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m src.job.ceilings",
        description="Measure this GPU's FP32 FFMA throughput and device-memory bandwidth.")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--warmup", type=int, default=10, help="untimed launches first (10)")
    parser.add_argument("--samples", type=int, default=100, help="timed launches; the median is reported (100)")
    parser.add_argument("--copy-mib", type=int, default=1024, help="size of each copy buffer in MiB (1024)")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.warmup < 0:
        parser.error("--samples must be at least 1 and --warmup at least 0")
    try:
        result = measure_ceilings(args.warmup, args.samples, args.copy_mib)
    except (NoGPU, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sheet = result["datasheet"]
    note = (f" ({100 * result['ffma_gflops'] / sheet['fp32_gflops']:.1f}% of the datasheet FP32 "
            f"peak)" if sheet["fp32_gflops"] else "")
    print(f"{result['gpu']}: FFMA {result['ffma_gflops']:,.0f} GFLOP/s{note}, "
          f"device memory {result['dram_gbs']:,.0f} GB/s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
