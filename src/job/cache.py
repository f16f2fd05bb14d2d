"""Measurement cache: every verified result, keyed by what determines it, so that a sweep run
again with `resume=true` (an interrupted sweep, a tuning sweep re-run) reuses what is already
measured instead of running it again.

The key is everything a measurement (and its record) depends on: the GPU (name, compute
capability, driver, CUDA runtime, NVRTC, CuPy) and the datasheet its % of peak is taken against
(`gpu=`); the kernel (name, backend, precision, the SHA-256 of the exact source handed to NVRTC,
its entry with the tile parameters, the target architecture, the NVRTC options and the toolkit
header it may include, the launch geometry, the tensor maps, the cuBLAS compute type); the
problem (m, n, k, alpha, beta) and the protocol (every `bench.*` value). Change any of them and
the job runs.

Only verified (ok) records are stored, one JSON file per key under `<cache_dir>/measurements/`,
holding the key, the description it was made from and the record, written atomically (a reader
sees the whole file or none). An entry is served only when it is whole and belongs to the job:
its key and description are this job's and its record names this job's kernel (a best_* run's:
its dispatcher), entry and problem; anything else (another format, a copied or edited file) is
measured again, with a warning. A cache that cannot be written (a read-only directory, a full
disk) costs the reuse, never the measurement: a warning, and the job keeps its figure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

from src.job import compile as compile_step
from src.job import gpu as gpu_mod
from src.records.record import Record

log = logging.getLogger("sgemm")

SUBDIR = "measurements"
FORMAT = 2  # entries of an older layout are not served
DEVICE_FIELDS = ("name", "compute_capability", "driver", "cuda_runtime", "nvrtc", "cupy")
GPU_SPEC_FIELDS = ("name", "sms", "fp32_tflops", "tf32_tflops", "mem_bandwidth_gbs")


@dataclass(frozen=True)
class Key:
    """A job's cache key: the hex SHA-256 of `described`, its canonical description."""

    digest: str
    described: dict


def _compiler(spec) -> dict | None:
    """How NVRTC builds the chapter: its options and the toolkit header it may include; for a
    Triton peer, its kernel's source, tl.dot's input_precision and Triton's version; for the
    CUTLASS peer, what its library's key holds (source, CUTLASS and nvcc versions, arch)."""
    if spec.backend == "triton":
        from importlib import metadata

        source = Path(__file__).with_name("triton_matmul.py").read_bytes()
        try:
            version = metadata.version("triton")
        except metadata.PackageNotFoundError:
            version = None
        return {"triton": version, "input_precision": spec.input_precision,
                "source_sha256": hashlib.sha256(source).hexdigest()}
    if spec.backend == "cutlass":
        from src.job.cutlass_build import described

        return described(spec.arch or gpu_mod.device_arch(), spec.name)
    if spec.backend != "nvrtc":
        return None
    header_sha = None
    for option in compile_step.cuda_include_options():
        header = Path(option[2:]) / "mma.h"
        if header.is_file():
            header_sha = hashlib.sha256(header.read_bytes()).hexdigest()
    return {"options": list(compile_step.BUILD_OPTIONS), "mma_h_sha256": header_sha}


def key(prepared) -> Key:
    """The cache key of one prepared job (a prepare.PreparedJob on a device): everything its
    measurement depends on, the GPU's datasheet (pct_of_peak) included."""
    spec, problem, bench = prepared.spec, prepared.problem, prepared.bench
    source_sha256 = prepared.source_sha256
    device = prepared.require_device()
    gpu_spec = prepared.target.gpu_spec
    device_data = device if isinstance(device, dict) else vars(device)
    spec_data = (asdict(gpu_spec) if is_dataclass(gpu_spec) else dict(gpu_spec or {}))
    described = {
        "device": {f: device_data.get(f) for f in DEVICE_FIELDS},
        "gpu_spec": {f: spec_data.get(f) for f in GPU_SPEC_FIELDS},
        "kernel": {
            "name": spec.name, "backend": spec.backend, "precision": spec.precision,
            "source_sha256": source_sha256, "entry": spec.entry, "grid": list(spec.grid),
            "block": list(spec.block), "dynamic_smem_bytes": spec.dynamic_smem_bytes,
            "workspace_bytes": spec.workspace_bytes, "compute_type": spec.compute_type,
            "arch": spec.arch, "tensor_maps": [asdict(tm) for tm in spec.tensor_maps],
            "compiler": _compiler(spec),
            # a split tail's launch (named only where there is one: other keys stay as they were)
            **({"tail": [spec.tail.entry, list(spec.tail.grid)]} if spec.tail else {}),
        },
        "problem": {"m": problem.m, "n": problem.n, "k": problem.k, "alpha": problem.alpha,
                    "beta": problem.beta},
        "bench": dict(bench.settings),
    }
    if prepared.dispatched is not None:
        # a best_* run's record names the dispatcher and times its peers too: not the record of a
        # direct run of the kernel it chose (those keys stay as they were without this field)
        described["dispatcher"] = {"name": prepared.dispatched.dispatcher,
                                   "peers": list(prepared.peers)}
    described = json.loads(json.dumps(described, sort_keys=True, default=str))  # canonical
    return Key(_digest(described), described)


def _digest(described: dict) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _mismatch(entry: dict, job: Key) -> str | None:
    """Why `entry` (a cache file's content) is not this job's measurement, or None."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return "an entry of another format"
    if entry.get("key") != job.digest or entry.get("described") != job.described:
        return "an entry made for another job"
    if _digest(entry["described"]) != job.digest:
        return "an entry whose description does not give its key (edited)"
    record, kernel, problem = entry.get("record"), job.described["kernel"], job.described["problem"]
    if not isinstance(record, dict):
        return "an entry without a record"
    # a best_* run's record names its dispatcher; a direct run's, its kernel
    named = (job.described.get("dispatcher") or {}).get("name") or kernel["name"]
    expected = {"kernel": named, "entry": kernel["entry"], **problem,
                "gpu_spec": job.described["gpu_spec"]["name"] or record.get("gpu_spec"),
                "status": "ok"}
    wrong = [name for name, value in expected.items() if record.get(name) != value]
    return f"an entry whose record is another job's ({', '.join(wrong)} differ)" if wrong else None


class Cache:
    def __init__(self, root: Path | str):
        self.dir = Path(root) / SUBDIR

    def _path(self, digest: str) -> Path:
        return self.dir / digest[:2] / f"{digest}.json"

    def get(self, job: Key) -> Record | None:
        """This job's verified record, or None (absent, or not trusted: measure again)."""
        path = self._path(job.digest)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("measurement cache: %s is unreadable (%s); measuring again", path, exc)
            return None
        why = _mismatch(entry, job)
        if why is None:
            try:
                return Record.from_dict(entry["record"])
            except Exception as exc:  # a record this version cannot read
                why = f"a record that cannot be read ({type(exc).__name__}: {exc})"
        log.warning("measurement cache: %s is %s; measuring again", path, why)
        return None

    def put(self, job: Key, record: Record) -> Path | None:
        """Store a verified record; None (with a warning) when it is not ok or cannot be written."""
        if not record.ok:
            return None
        path = self._path(job.digest)
        entry = {"format": FORMAT, "key": job.digest, "described": job.described,
                 "record": record.to_dict()}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(record)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entry, indent=1, default=str) + "\n")
            tmp.replace(path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("measurement cache: could not store this result in %s (%s: %s); the "
                        "measurement stands, but resume=true will not find it", self.dir,
                        type(exc).__name__, exc)
            return None
        return path

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("*/*.json")) if self.dir.is_dir() else 0
