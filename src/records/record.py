"""Record step: everything one job produced, as one flat JSON-able object, and its console line.

A record with a status other than "ok" never carries gflops or timing: a kernel that failed
verification has no figure anywhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

from src.errors import StorageError

log = logging.getLogger("sgemm")

RECORD_FILE = "record.json"
REPLICATES_DIR = "replicates"  # under a sweep: the sweeps of its replicate runs (src.sweep.replicate)
STATUS_OK = "ok"


@dataclass
class Record:
    kernel: str
    precision: str
    backend: str
    m: int
    n: int
    k: int
    alpha: float
    beta: float
    status: str = STATUS_OK
    error: str | None = None
    params: dict = field(default_factory=dict)
    tuned_from: str | None = None     # the conf/tuned/<gpu>.yaml size class the params came from
    dispatched_to: str | None = None  # best_*: the chapter that ran this shape...
    dispatch_rule: str | None = None  # ...and the dispatch rule (or default) that chose it, and why
    math: str | None = None           # ffma, 3xtf32 or tf32: what the chapter that ran computes on (src/records/math_units.py)
    entry: str | None = None
    grid: list | None = None
    block: list | None = None
    # verification
    rel_err: float | None = None
    tolerance: float | None = None
    seed: int | None = None
    # timing (ok records only)
    gflops: float | None = None
    time_ms_median: float | None = None
    time_ms_min: float | None = None
    time_ms_max: float | None = None
    time_ms_iqr: float | None = None
    samples: int | None = None
    sm_clock_mhz_before: int | None = None
    sm_clock_mhz_after: int | None = None
    timer: str | None = None               # the samples' clock: cupti (GPU kernel stamps), events
    timer_resolution_ns: float | None = None  # its resolution: the % interval is widened by it
    samples_throttled: int | None = None   # rounds left out: a slowdown, or a clock below the floor
    samples_slowdown: int | None = None    # of those, for an NVML thermal/hardware slowdown
    sustained_clock_mhz: list | None = None  # per arm (kernel, baselines), the median SM clock: the floor's reference
    clock_range_mhz: list | None = None    # min and max SM clock of the kept samples
    power_capped_share: float | None = None  # share of kept rounds under sw_power_cap (a condition)
    sample_clock_mhz: list | None = None   # the SM clock during each kept sample (clock64 / globaltimer)
    # against the baselines measured in the same process, same shape and protocol
    cublas_fp32_gflops: float | None = None
    cublas_tf32_gflops: float | None = None
    pct_of_cublas_fp32: float | None = None
    pct_of_cublas_tf32: float | None = None
    pct_of_peak: float | None = None
    # the paired comparison: kernel and baseline timed interleaved (src/job/paired.py)
    baseline: str | None = None            # the baseline it was paired with (its own precision's)
    baseline_gflops: float | None = None   # that baseline's GFLOP/s in the same rounds
    pct_of_cublas: float | None = None     # 100 x gflops / baseline_gflops (ratio of the medians)
    pct_ci_low: float | None = None        # bootstrap 95% interval of pct_of_cublas, over the pairs
    pct_ci_high: float | None = None
    verdict: str | None = None             # faster / slower only if the interval excludes 100%; else tie
    kernel_time_ms: list | None = None     # the kept paired samples, kernel and baseline
    baseline_time_ms: list | None = None
    # against the stronger of cuBLAS's default and the autotuned cuBLASLt (bench.best_cublas)
    cublaslt_gflops: float | None = None   # the autotuned cuBLASLt's GFLOP/s in the same rounds
    best_cublas: str | None = None         # which of the two was faster here
    pct_of_best_cublas: float | None = None
    pct_best_ci_low: float | None = None
    pct_best_ci_high: float | None = None
    verdict_best: str | None = None
    # checks of the timed launches (src/job/measure.py)
    checked_sample: int | None = None      # the timed sample whose output was checked (C poisoned first)
    rel_err_timed: float | None = None     # worst rel_err of that sample and of the last timed launch
    rel_err_fresh: float | None = None     # rel_err of a launch on fresh inputs after the timing
    check_seconds: float | None = None     # wall time of those two checks (their overhead per job)
    throttle_reasons: list | None = None   # NVML power/thermal throttle reasons seen while timing
    # compile report
    registers: int | None = None
    static_smem_bytes: int | None = None
    dynamic_smem_bytes: int | None = None
    local_bytes: int | None = None
    compile_seconds: float | None = None
    source_sha256: str | None = None
    # where it ran
    gpu: str | None = None
    gpu_spec: str | None = None
    device: dict = field(default_factory=dict)
    bench: dict = field(default_factory=dict)
    timestamp: str | None = None
    replicate: int | None = None      # which independent run of this row (1: the sweep; 2...: src.sweep.replicate)
    from_cache: bool = False          # resume=true reused this verified measurement (same key)
    mlflow_run_id: str | None = None  # the MLflow run of the job that measured it
    # against the strongest peer a user would pick instead (best_*: its config's `peers`, timed
    # in the same interleaved rounds): Triton, and why any other peer was not compared
    peer_name: str | None = None           # the peer with the shortest median in these rounds
    peer_gflops: float | None = None
    pct_of_peer: float | None = None       # 100 x gflops / peer_gflops (ratio of the medians)
    pct_peer_ci_low: float | None = None   # bootstrap 95% interval, over the pairs
    pct_peer_ci_high: float | None = None
    verdict_peer: str | None = None
    peers_skipped: list | None = None      # "name: why" of each listed peer not compared
    peer_compile_s: float | None = None    # a Triton peer's compile + autotune at this shape (the
                                           # job's own, or best_*'s strongest peer's), untimed
    peer_config: str | None = None         # the config Triton's autotune chose
    peer_setup_reused: bool | None = None  # that setup read from cache_dir, done by another process
                                           # (another GPU's slot, an earlier sweep): its seconds
    # best_* with dispatch.autotune on (the default; src/job/autotune.py): the candidates measured at a shape
    # no dispatch rule covers well, before (and apart from) the timed measurement
    autotuned: str | None = None           # measured, reused (from cache_dir), not_needed (covered
                                           # well), all_failed (the rule's choice ran); None: off
    autotune_why: str | None = None        # why the shape is or is not covered well
    autotune_candidates: list | None = None  # "kernel {params}: GFLOP/s (where from)" or "...: left
                                           # out (where from): status: why"; "<- runs" marks the winner
    autotune_s: float | None = None        # the candidates' brief measurement, untimed (reused: the
                                           # seconds of the job that measured them)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def size_label(self) -> str:
        return str(self.m) if self.m == self.n == self.k else f"{self.m}x{self.n}x{self.k}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Record":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, directory: Path) -> Path:
        """Write atomically: a reader sees the old file or the whole new one, never half. A
        directory that cannot take it (full, read-only) raises StorageError and leaves no
        temporary file; the record itself (and so the job's result) is unchanged."""
        path = directory / RECORD_FILE
        tmp = path.with_suffix(".json.tmp")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
            tmp.replace(path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StorageError(
                f"could not write the record of {self.kernel} {self.size_label} to {path}: "
                f"{exc.strerror or exc} (rule: a record is written whole or not at all; no "
                f"partial file was left). The job's result ({self.status}) stands in its console "
                f"line and MLflow run; free space or make {directory} writable, then rerun it "
                f"(resume=true reuses a verified measurement).") from None
        return path

    def console_line(self) -> str:
        head = f"{self.kernel:<18} {self.size_label:>14}"
        if not self.ok:
            first = (self.error or "").splitlines()[0] if self.error else ""
            return f"{head}  {self.status.upper():<20} {first}"
        parts = [f"{self.gflops:>10,.1f} GFLOP/s", f"{self.time_ms_median:9.4f} ms"]
        if self.samples_throttled:
            parts.append(f"{self.samples_throttled} throttled samples left out")
        which = "TF32" if self.precision == "tf32" else "FP32"
        if self.pct_ci_low is not None and self.backend != "cublas":  # paired: with its interval
            parts.append(f"{self.pct_of_cublas:6.1f}% of cuBLAS {which} "
                         f"[{self.pct_ci_low:.1f}, {self.pct_ci_high:.1f}] {self.verdict}")
        elif self.precision == "tf32" and self.pct_of_cublas_tf32 is not None:
            parts.append(f"{self.pct_of_cublas_tf32:6.1f}% of cuBLAS TF32")  # same precision
        elif self.pct_of_cublas_fp32 is not None:
            parts.append(f"{self.pct_of_cublas_fp32:6.1f}% of cuBLAS FP32")
        parts.append(f"rel_err {self.rel_err:.1e}")
        if self.registers is not None:
            parts.append(f"{self.registers} regs, {self.local_bytes} B local")
        if self.from_cache:
            parts.append(f"(cached, measured {self.timestamp})")
        return head + "  " + "  ".join(parts)


def record_paths(root: Path) -> list[Path]:
    """Every record.json under `root` (a sweep directory), in job order."""
    return sorted(root.glob(f"*/{RECORD_FILE}"), key=lambda p: _job_num(p.parent.name))


def read_record(path: Path) -> Record:
    """The record in `path`; StorageError naming the file when it is unreadable or not a
    record (truncated, edited, another file)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        return Record.from_dict(data)
    except (OSError, ValueError, TypeError) as exc:
        raise StorageError(
            f"{path} is not a readable job record ({type(exc).__name__}: {exc}) (rule: a "
            f"record.json holds one JSON object with the fields of a Record, as a job writes "
            f"it). Rerun that job, or move the file away.") from None


def load_records(root: Path) -> list[Record]:
    """Every readable record under `root` (a sweep directory), in job order; a broken one is
    left out with a warning naming it (a sweep's summary still shows the others)."""
    records = []
    for path in record_paths(root):
        try:
            records.append(read_record(path))
        except StorageError as exc:
            log.warning("left out of the summary: %s", exc)
    return records


def _job_num(name: str) -> float:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else math.inf


def new_record(kernel: str, precision: str, backend: str, problem, **extra) -> Record:
    """A job's record before it runs. `problem` holds m, n, k, alpha, beta as given (possibly
    invalid: they are recorded as is)."""
    return Record(kernel=kernel, precision=precision, backend=backend,
                  **{key: problem[key] for key in ("m", "n", "k", "alpha", "beta")},
                  timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra)


# A failed record carries none of these: a kernel that failed anything has no figure anywhere.
FIGURES = ("gflops", "time_ms_median", "time_ms_min", "time_ms_max", "time_ms_iqr", "samples",
           "pct_of_cublas_fp32", "pct_of_cublas_tf32", "pct_of_peak", "cublas_fp32_gflops",
           "cublas_tf32_gflops", "baseline_gflops", "pct_of_cublas", "pct_ci_low", "pct_ci_high",
           "verdict", "kernel_time_ms", "baseline_time_ms", "cublaslt_gflops", "best_cublas",
           "pct_of_best_cublas", "pct_best_ci_low", "pct_best_ci_high", "verdict_best",
           "peer_gflops", "pct_of_peer", "pct_peer_ci_low", "pct_peer_ci_high", "verdict_peer")


def mark_failed(record: Record, exc) -> None:
    """End a record with an expected failure (an errors.LabError): its status and message."""
    record.status = exc.status
    record.error = str(exc)
    if getattr(exc, "rel_err", None) is not None:  # a verification failure says by how much
        setattr(record, getattr(exc, "rel_err_field", "rel_err"), exc.rel_err)
    for name in FIGURES:
        setattr(record, name, None)
