"""Measurement cache: every verified result, keyed by what determines it, so that a sweep run
again with `resume=true` (an interrupted sweep, a tuning sweep re-run) reuses what is already
measured instead of running it again.

The key is everything a measurement depends on: the GPU (name, driver, CUDA runtime, NVRTC,
CuPy), the kernel (name, backend, the SHA-256 of the exact source handed to NVRTC, its entry
with the tile parameters, the launch geometry, the cuBLAS compute type), the problem (m, n, k,
alpha, beta) and the protocol (every `bench.*` value). Change any of them and the job runs.

Only verified (ok) records are stored, one JSON file per key under `<cache_dir>/measurements/`,
written atomically (a reader sees the whole file or none), so an interrupted sweep never leaves
an entry that looks complete and is not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from src.records.record import Record

SUBDIR = "measurements"
DEVICE_FIELDS = ("name", "compute_capability", "driver", "cuda_runtime", "nvrtc", "cupy")


def key(prepared) -> str:
    """The cache key of one prepared job (a prepare.PreparedJob on a device): hex SHA-256 of its
    canonical JSON description."""
    spec, problem, bench = prepared.spec, prepared.problem, prepared.bench
    source_sha256 = prepared.source_sha256
    device = prepared.require_device()
    device_data = device if isinstance(device, dict) else vars(device)
    described = {
        "device": {f: device_data.get(f) for f in DEVICE_FIELDS},
        "kernel": {
            "name": spec.name, "backend": spec.backend, "precision": spec.precision,
            "source_sha256": source_sha256, "entry": spec.entry, "grid": list(spec.grid),
            "block": list(spec.block), "dynamic_smem_bytes": spec.dynamic_smem_bytes,
            "workspace_bytes": spec.workspace_bytes, "compute_type": spec.compute_type,
        },
        "problem": {"m": problem.m, "n": problem.n, "k": problem.k, "alpha": problem.alpha,
                    "beta": problem.beta},
        "bench": bench,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Cache:
    def __init__(self, root: Path | str):
        self.dir = Path(root) / SUBDIR

    def _path(self, digest: str) -> Path:
        return self.dir / digest[:2] / f"{digest}.json"

    def get(self, digest: str) -> Record | None:
        path = self._path(digest)
        try:
            record = Record.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None  # absent or unreadable: measure again
        return record if record.ok else None

    def put(self, digest: str, record: Record) -> Path | None:
        if not record.ok:
            return None
        path = self._path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{id(record)}.tmp")
        tmp.write_text(json.dumps(record.to_dict(), indent=1, default=str) + "\n")
        tmp.replace(path)
        return path

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("*/*.json")) if self.dir.is_dir() else 0
