"""The timing protocol (conf/bench/) as a typed object, checked once before any GPU work, and
what NVML says about throttling while a job is timed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from src.errors import ConfigError

COUNTS = ("warmup", "min_samples", "max_samples")        # integers >= 1 (warmup >= 0)
POSITIVE = ("max_seconds", "target_rel_iqr")             # finite numbers > 0
OPTIONAL_COUNTS = ("short_min_samples",)
OPTIONAL_POSITIVE = ("short_kernel_ms", "plausibility_margin")
OPTIONAL_NON_NEGATIVE = ("warmup_ms",)                   # null or a finite number >= 0
SWITCHES = ("flush_l2", "best_cublas")                   # true or false (not "maybe", not 1)
PRECISIONS = ("fp32", "tf32")                            # each has a tolerance: finite, > 0


def _bad(key: str, value, rule: str) -> ConfigError:
    return ConfigError(f"invalid timing protocol: bench.{key}={value!r} (rule: {rule}). Set it "
                       f"on the command line, e.g. bench.{key}=..., or in conf/bench/.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


TIMERS = ("cupti", "events")  # src/job/kernel_clock.py says why CUPTI is the default


def check_bench(bench: dict) -> None:
    """Raise ConfigError naming the first bench.* value that breaks its rule."""
    for key in COUNTS:
        low = 0 if key == "warmup" else 1
        if not _is_int(bench.get(key)) or bench[key] < low:
            raise _bad(key, bench.get(key), f"an integer >= {low}")
    if bench["max_samples"] < bench["min_samples"]:
        raise _bad("max_samples", bench["max_samples"], "max_samples >= min_samples")
    for key in POSITIVE:
        if not _is_number(bench.get(key)) or bench[key] <= 0:
            raise _bad(key, bench.get(key), "a finite number > 0")
    for key in OPTIONAL_COUNTS:
        if bench.get(key) is not None and (not _is_int(bench[key]) or bench[key] < 1):
            raise _bad(key, bench[key], "null or an integer >= 1")
    for key in OPTIONAL_POSITIVE:
        if bench.get(key) is not None and (not _is_number(bench[key]) or bench[key] <= 0):
            raise _bad(key, bench[key], "null or a finite number > 0")
    for key in OPTIONAL_NON_NEGATIVE:
        if bench.get(key) is not None and (not _is_number(bench[key]) or bench[key] < 0):
            raise _bad(key, bench[key], "null or a finite number >= 0")
    if bench.get("timer", "cupti") not in TIMERS:
        raise _bad("timer", bench.get("timer"), f"one of {', '.join(TIMERS)}")
    if bench.get("plausibility_margin") is not None and bench["plausibility_margin"] < 1:
        raise _bad("plausibility_margin", bench["plausibility_margin"], "a factor >= 1")
    threshold = bench.get("throttle_threshold")
    if threshold is not None and (not _is_number(threshold) or not 0 < threshold <= 1):
        # a fraction of the maximum SM clock: above 1 every sample counts as throttled
        raise _bad("throttle_threshold", bench["throttle_threshold"],
                   "null or a fraction of the maximum SM clock, in (0, 1]")
    for key in SWITCHES:
        if key in bench and not isinstance(bench[key], bool):
            raise _bad(key, bench[key], "true or false")
    if bench.get("seed") is not None and (not _is_int(bench["seed"]) or bench["seed"] < 0):
        raise _bad("seed", bench["seed"], "null or an integer >= 0")
    tolerance = bench.get("tolerance")
    if not isinstance(tolerance, Mapping):
        raise _bad("tolerance", tolerance, f"a tolerance for each of {', '.join(PRECISIONS)}")
    for precision in PRECISIONS:
        # inf would pass any finite wrong result, nan every comparison
        value = tolerance.get(precision)
        if not _is_number(value) or value <= 0:
            raise _bad(f"tolerance.{precision}", value, "a finite number > 0")



@dataclass(frozen=True)
class BenchProtocol:
    """The timing and verification protocol (conf/bench/), checked once where it is built
    (`from_config`) and read by attribute from there on."""

    warmup: int
    min_samples: int
    max_samples: int
    target_rel_iqr: float
    max_seconds: float
    tolerance: Mapping[str, float]              # by precision (fp32, tf32): normwise, > 0
    warmup_ms: float = 0.0
    timer: str = "cupti"
    flush_l2: bool = True
    best_cublas: bool = False
    throttle_threshold: float | None = None
    short_kernel_ms: float | None = None
    short_min_samples: int | None = None
    plausibility_margin: float | None = None    # None: plausibility.DEFAULT_MARGIN
    seed: int | None = None
    # the bench.* values as configured: what the measurement cache keys on
    settings: Mapping = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_config(cls, bench: Mapping) -> BenchProtocol:
        """The protocol of a bench.* mapping; ConfigError naming the first value that breaks its
        rule (check_bench)."""
        check_bench(bench)
        return cls(
            warmup=bench["warmup"], min_samples=bench["min_samples"],
            max_samples=bench["max_samples"], target_rel_iqr=float(bench["target_rel_iqr"]),
            max_seconds=float(bench["max_seconds"]),
            tolerance=MappingProxyType(dict(bench["tolerance"])),
            warmup_ms=float(bench.get("warmup_ms") or 0.0), timer=bench.get("timer", "cupti"),
            flush_l2=bench.get("flush_l2", True), best_cublas=bench.get("best_cublas", False),
            throttle_threshold=bench.get("throttle_threshold"),
            short_kernel_ms=bench.get("short_kernel_ms"),
            short_min_samples=bench.get("short_min_samples"),
            plausibility_margin=bench.get("plausibility_margin"), seed=bench.get("seed"),
            settings=MappingProxyType(dict(bench)))


# NVML clock-event (throttle) reason bits, named as nvidia-smi -q -d PERFORMANCE names them.
POWER_CAP = 0x4   # sw_power_cap: the card holding its power limit, its normal state under load
THROTTLE_REASONS = {
    POWER_CAP: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
}
# A fault, not a load: overheating, or the board pulling the clock down (HW_SLOWDOWN, which
# NVML also sets with either of the next two), HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE. A round in
# which NVML reports one of these is left out (timing.select_rounds).
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def throttle_mask(device) -> int | None:
    """The clock-event reasons NVML reports now, as its bit mask (None: NVML not available)."""
    from src.job import gpu as gpu_mod

    handle = gpu_mod.nvml_handle(getattr(device, "pci_bus_id", None))
    if handle is None:
        return None
    import pynvml

    read = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    try:
        return int(read(handle))
    except Exception:  # an NVML without the call, or one that refuses: unknown, not guessed
        return None


def throttle_reasons(device) -> list[str] | None:
    """The power and thermal throttle reasons NVML reports now (None: NVML not available)."""
    mask = throttle_mask(device)
    return None if mask is None else reason_names(mask)
