"""Compiled kernels on disk, for the compile step (src/job/compile.py): `<cache_dir>/cubin/<key>.cubin`
beside its `<key>.json` meta file. A cubin is written before its meta file, each under a private
name renamed into place, so a meta file means its cubin is whole; a cubin is served only when its
size and SHA-256 match the meta file. (The measurement cache, src/job/cache.py, is the other
cache: verified results, keyed by everything a measurement depends on.)"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def store_cubin(binary: bytes, meta: dict, meta_path: Path, cubin_path: Path) -> None:
    """Write a cubin, then its meta file (last: a meta file means its cubin is whole), each
    under a private name renamed into place. The meta file names the cubin relative to itself
    (a copied or moved cache works where it lands) with its size and SHA-256."""
    cubin_path.parent.mkdir(parents=True, exist_ok=True)
    private = f".{os.getpid()}.{id(binary)}.tmp"
    tmp = cubin_path.with_name(cubin_path.name + private)
    tmp.write_bytes(binary)
    tmp.replace(cubin_path)
    meta = {**meta, "path": cubin_path.name, "size": len(binary),
            "sha256": hashlib.sha256(binary).hexdigest()}
    tmp = meta_path.with_name(meta_path.name + private)
    tmp.write_text(json.dumps(meta) + "\n")
    tmp.replace(meta_path)


def cubin_entry(meta_path: Path, cubin_path: Path) -> dict | None:
    """The cached cubin's meta (its path made absolute) if the meta file is whole and the cubin
    beside it has the recorded size and SHA-256; None (build again) for anything else: absent,
    an older layout, an empty or truncated cubin, one swapped in from another build."""
    try:
        meta = json.loads(meta_path.read_text())
        binary = cubin_path.read_bytes()
        if (meta.pop("path") != cubin_path.name or meta.pop("size") != len(binary) or not binary
                or meta.pop("sha256") != hashlib.sha256(binary).hexdigest()):
            return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return {**meta, "path": str(cubin_path.resolve())}
