"""Plausibility: a figure beyond what the GPU can do is a bug (in the kernel or the timing), so
it fails as implausible and is never published.

Two bounds, both for the precision and math units the kernel uses:
- the math ceiling: FP32 on the SIMT cores is bounded by the measured FFMA throughput
  (results/<gpu>/ceilings.json, when measured on a GPU of this name; else the datasheet FP32 peak); TF32 on
  tensor cores by the datasheet dense TF32 peak; FP32 as three TF32 products (3xTF32, kernel
  config `math: 3xtf32`) by a third of it;
- the memory floor: with the L2 flushed before every timed launch, A, B and C (read too when
  beta != 0) must cross from device memory at least once, which takes bytes / bandwidth at the
  higher of the measured and the datasheet bandwidth.
A figure is implausible when it beats either bound by more than `margin` (bench.plausibility_margin,
default 5%: room for clock and measurement noise, far below what a cheating kernel shows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from src.errors import Implausible
from src.paths import published_sets

DEFAULT_MARGIN = 1.05


@dataclass(frozen=True)
class Ceiling:
    math_gflops: float | None    # the most the kernel's math units can do
    math_source: str             # where that figure comes from
    bandwidth_gbs: float | None  # device-memory bandwidth for the memory floor


def load_measured(device_name: str | None, path: Path | None = None) -> dict | None:
    """The ceilings measured on a GPU of this name: `path`, or the published set's that names it
    (results/<gpu>/ceilings.json); None when there are none (datasheet figures are used)."""
    paths = [Path(path)] if path is not None else [s / "ceilings.json" for s in published_sets()]
    for candidate in paths:
        try:
            data = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if data.get("measured") and device_name and data.get("gpu") == device_name:
            return data
    return None


def ceiling(precision: str, math: str | None, gpu_spec, measured: dict | None) -> Ceiling:
    """The bounds for a kernel of `precision` on `math` units (None: SIMT for fp32, tensor
    cores for tf32) on the GPU `gpu_spec` describes, with `measured` ceilings if any."""
    bandwidths = [b for b in (gpu_spec.mem_bandwidth_gbs, (measured or {}).get("dram_gbs")) if b]
    bandwidth = max(bandwidths) if bandwidths else None
    tf32 = gpu_spec.tf32_tflops * 1e3 if gpu_spec.tf32_tflops else None
    if math == "3xtf32":
        return Ceiling(tf32 / 3 if tf32 else None, "datasheet dense TF32 peak / 3", bandwidth)
    if precision == "tf32":
        return Ceiling(tf32, "datasheet dense TF32 peak", bandwidth)
    if measured and measured.get("ffma_gflops"):
        return Ceiling(float(measured["ffma_gflops"]), "measured FFMA throughput", bandwidth)
    fp32 = gpu_spec.fp32_tflops * 1e3 if gpu_spec.fp32_tflops else None
    return Ceiling(fp32, "datasheet FP32 peak", bandwidth)


def bytes_moved(problem) -> int:
    """Bytes that must cross from device memory at least once: A, B, C written (and read)."""
    c_passes = 2 if problem.beta != 0.0 else 1
    return 4 * (problem.m * problem.k + problem.k * problem.n + c_passes * problem.m * problem.n)


def check(name: str, problem, time_ms: float, bound: Ceiling,
          margin: float = DEFAULT_MARGIN, l2_flushed: bool = True) -> None:
    """Raise Implausible when `time_ms` for `problem` beats the math ceiling or (when the L2
    was flushed before each launch, so nothing could be served from it) the memory floor by
    more than `margin`."""
    gflops = problem.flops / (time_ms * 1e-3) / 1e9
    if bound.math_gflops and gflops > margin * bound.math_gflops:
        raise Implausible(
            f"kernel {name} measured {gflops:,.0f} GFLOP/s at {problem.label}, "
            f"{gflops / bound.math_gflops:.2f}x the GPU's ceiling for its math "
            f"({bound.math_source}: {bound.math_gflops:,.0f} GFLOP/s) (rule: a figure may beat "
            f"the ceiling by at most {margin - 1:.0%}, bench.plausibility_margin). No figure is "
            f"published: the kernel does less work than the problem asks, or the timing is wrong.")
    if bound.bandwidth_gbs and l2_flushed:
        floor_ms = bytes_moved(problem) / (bound.bandwidth_gbs * 1e9) * 1e3
        if time_ms * margin < floor_ms:
            raise Implausible(
                f"kernel {name} took {time_ms * 1e3:.2f} us at {problem.label}, less than the "
                f"{floor_ms * 1e3:.2f} us that its {bytes_moved(problem) / 2**20:.1f} MiB of A, B "
                f"and C take to cross from device memory at {bound.bandwidth_gbs:,.0f} GB/s (rule: "
                f"with the L2 flushed every input must be read once, bench.plausibility_margin). "
                f"No figure is published.")


def check_recorded(name: str, problem, gflops, time_ms, bound: Ceiling,
                   margin: float = DEFAULT_MARGIN, l2_flushed: bool = True) -> None:
    """The checks of `check` for a figure read back (the measurement cache), not just measured:
    its GFLOP/s is what its median time gives for the problem (an edited figure is not), and
    that time is plausible."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  and v > 0 for v in (gflops, time_ms))
    if not numbers or not math.isclose(gflops, problem.flops / (time_ms * 1e-3) / 1e9, rel_tol=1e-9):
        raise Implausible(
            f"kernel {name} at {problem.label} has a recorded {gflops!r} GFLOP/s that its median "
            f"time {time_ms!r} ms does not give (rule: a figure is the problem's FLOPs over its "
            f"median time, both finite and > 0). The entry was edited or damaged.")
    check(name, problem, time_ms, bound, margin, l2_flushed)
