"""Build step of the CUTLASS peer: src/job/cutlass_3xtf32.cu compiled by nvcc, against the C++
headers the `nvidia-cutlass` wheel ships (cutlass_library/source/include), into a shared library
that src/job/cutlass_gemm.py loads with ctypes.

Built once per machine into `<cache_dir>/peers/cutlass_3xtf32_<key>.so`, the key being the
SHA-256 of the source, the CUTLASS headers' version, nvcc's version, the architecture and the
options; written under a private name and renamed into place, with a JSON beside it that keeps
how long nvcc took (a cache hit keeps that figure, as cubins do, and says it was `reused`). The
build runs under a lock file beside the library (src/job/file_lock.py): a second worker asking
meanwhile (another GPU's slot) waits for the first's build and loads its library, rather than
running nvcc a second time. The library links the CUDA runtime statically: it loads without a
GPU and needs nothing at run time that the GPU machine lacks.

Without the wheel or without nvcc the peer is `skipped_missing_peer` (PeerMissing).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from src.errors import CompileFailed, PeerMissing
from src.job.file_lock import held, write_atomically
from src.job.toolchain import nvcc_arch_options, nvcc_path

SOURCE = Path(__file__).with_name("cutlass_3xtf32.cu")
PACKAGE = "nvidia-cutlass"
EXTRA = "pip install -e '.[peers]'"
# CUTLASS's own CMake builds with --expt-relaxed-constexpr; -fPIC and -shared make the library.
OPTIONS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-shared")
BUILD_TIMEOUT_S = 900


@dataclass(frozen=True)
class Library:
    """The built shared library: its path, nvcc's wall seconds when it was built, its key, and
    whether it was found in the cache (built by another process or an earlier run: `reused`)."""

    path: str
    compile_seconds: float
    key: str
    reused: bool = False


def _missing(name: str, what: str) -> PeerMissing:
    return PeerMissing(
        f"peer {name} is skipped: {what} (rule: the CUTLASS peer is built on this machine with "
        f"nvcc from the C++ headers of the `{PACKAGE}` wheel; it needs the optional extra `peers`, "
        f"installed with {EXTRA}, and the CUDA toolkit's nvcc on PATH). The other kernels and "
        f"baselines are not affected; the peer's rows and comparisons are left out.")


def include_dir(name: str = "cutlass_3xtf32") -> Path:
    """The wheel's CUTLASS include folder, found without importing cutlass_library (its import
    pulls networkx, scipy and more; the build needs only the headers)."""
    try:
        found = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):  # ValueError: a module entry without a spec
        found = None
    roots = list(found.submodule_search_locations or ()) if found else []
    for root in roots:
        include = Path(root) / "source" / "include"
        if (include / "cutlass" / "gemm" / "device" / "gemm.h").is_file():
            return include
    raise _missing(name, f"the CUTLASS headers are not installed (the `{PACKAGE}` package: "
                         f"cutlass_library/source/include/cutlass/gemm/device/gemm.h is not found)")


def _nvcc(name: str) -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise _missing(name, "nvcc (the CUDA toolkit's compiler) is not on PATH")
    return nvcc


def require_tools(name: str = "cutlass_3xtf32") -> None:
    """PeerMissing unless the wheel's headers and nvcc are both here (checked before a build)."""
    include_dir(name)
    _nvcc(name)


@lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout else "?"


def cutlass_version() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def described(arch: str, name: str = "cutlass_3xtf32") -> dict:
    """Everything the library depends on (its cache key; also the job cache's compiler entry)."""
    nvcc = _nvcc(name)
    return {"source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
            "cutlass": cutlass_version(), "include": str(include_dir(name)),
            "nvcc": _nvcc_version(nvcc), "arch": arch, "options": list(OPTIONS)}


def build_library(arch: str, cache_dir: Path | str, name: str = "cutlass_3xtf32") -> Library:
    """The library for `arch` ("sm_90"), built with nvcc or found in the cache. Raises
    PeerMissing without the wheel or nvcc, CompileFailed with nvcc's messages."""
    what = described(arch, name)
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    directory = Path(cache_dir) / "peers"
    library = directory / f"cutlass_3xtf32_{key[:16]}.so"
    meta = library.with_suffix(".json")
    if library.is_file():
        return Library(str(library.resolve()), _seconds(meta), key, reused=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with held(library.with_suffix(".lock")):  # one nvcc per library: the others wait here
            if library.is_file():  # built by whoever held the lock before us
                return Library(str(library.resolve()), _seconds(meta), key, reused=True)
            return _build(what, key, library, meta)
    except OSError as exc:  # a read-only or full cache: build for this process only
        scratch = Path(tempfile.mkdtemp(prefix="sgemm-cutlass-")) / library.name
        logging.getLogger("sgemm").warning("peer cache: cannot write %s (%s: %s); building into %s",
                                           directory, type(exc).__name__, exc, scratch)
        return _build(what, key, scratch, scratch.with_suffix(".json"))


def build_for(kernel: dict, arch: str, cache_dir: Path | str) -> Library:
    """build_library for a kernel config of backend `cutlass` (conf/kernel/*.yaml): what a sweep's
    launcher builds ahead on its CPU (src/sweep/prebuild.py) for the jobs that will load it."""
    return build_library(arch, cache_dir, str(kernel.get("name") or "cutlass_3xtf32"))


def _build(what: dict, key: str, library: Path, meta: Path) -> Library:
    cmd = [_nvcc("cutlass_3xtf32"), *OPTIONS, *nvcc_arch_options(what["arch"]),
           f"-I{what['include']}"]
    fd, private = tempfile.mkstemp(dir=library.parent, prefix=f".{library.name}.", suffix=".tmp")
    os.close(fd)
    try:
        started = time.perf_counter()
        try:
            proc = subprocess.run([*cmd, "-o", private, str(SOURCE)], capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CompileFailed(f"peer cutlass_3xtf32: nvcc did not finish building {SOURCE.name} "
                                f"in {BUILD_TIMEOUT_S} s (rule: a peer's build ends within that)."
                                ) from None
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "error" in line]
            raise CompileFailed(
                f"peer cutlass_3xtf32: nvcc could not build {SOURCE.name} for {what['arch']} "
                f"against CUTLASS {what['cutlass']} ({what['include']}): "
                f"{errors[0].strip() if errors else 'exit ' + str(proc.returncode)}\n"
                f"nvcc's messages:\n{proc.stderr.strip()[-4000:]}")
        built = Library(str(library.resolve()), seconds, key)
        write_atomically(meta, json.dumps({**asdict(built), "described": what}, indent=1))
        os.replace(private, library)  # last: a library in place always has its JSON
    finally:
        if os.path.exists(private):
            os.unlink(private)
    return built


def _seconds(meta: Path) -> float | None:
    """nvcc's seconds when the cached library was built (None if its JSON is unreadable)."""
    try:
        return float(json.loads(meta.read_text())["compile_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
