"""Compile step: a KernelSpec becomes something that can be launched, plus its resource report.

Hand-written kernels are compiled by NVRTC straight to a cubin for the device's architecture
(`build_cubin`), with the template instantiated through a name expression, and the cubin is
loaded with CuPy (RawModule(path=...)). The source handed to NVRTC is the chapter with
kernels/common.cuh pasted in (with #line directives, so compiler messages still point at the
original file and line). The options are the ones CuPy's RawModule passes (ours plus -ftz=true),
so the SASS is the same as through CuPy.

Cubins are cached on disk (`<cache_dir>/cubin/`, keyed by the SHA-256 of the source, entry,
options, architecture and NVRTC version) and modules per process. Compiling needs NVRTC, not a
GPU, and NVRTC works on one program per thread without holding the GIL, so `precompile` builds
many candidates at once on CPU threads (a tuning sweep does that while the GPU times the
previous candidates); a job then finds its cubin ready.

`nvcc.compile_offline` builds the same text with nvcc for a named architecture, with no GPU, and
reads ptxas's resource report: the CPU tests use it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from src.errors import CompileFailed, ConfigError, LaunchFailed, OutOfMemory
from src.job.cubin_store import cubin_entry, store_cubin
from src.job.directives import include_of, logical_lines
from src.job.gpu import device_arch
from src.job.spec import KernelSpec
from src.paths import KERNELS_DIR, kernel_file

NVRTC_OPTIONS = ("-std=c++17",)
# What CuPy's RawModule adds to them (17's device lambdas need the execution-space default), then
# build_cubin's -arch: the same SASS as through CuPy.
BUILD_OPTIONS = (*NVRTC_OPTIONS, "-ftz=true", "--device-as-default-execution-space")
DEFAULT_CACHE_DIR = ".sgemm_cache"
STATIC_SMEM_LIMIT = 48 * 1024       # above this a kernel must opt in to dynamic shared memory


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(KERNELS_DIR.parent))
    except ValueError:
        return str(path)


def expand_source(path: Path, _pasted: set | None = None) -> str:
    """The kernel source with its "..." includes pasted in, once each in the whole text (a
    header two others include is pasted at its first include), with #line marks. Includes are
    found as the preprocessor finds them (src/job/directives.py); an include of another form
    (a macro, an absolute or `..` <header>, #include_next, #import, #embed) is a ConfigError."""
    pasted = {path.resolve()} if _pasted is None else _pasted
    physical = path.read_text().splitlines()
    out = [f'#line 1 "{_rel(path)}"']
    for line in logical_lines("\n".join(physical)):
        include = include_of(line)
        if include is None:
            out.extend(physical[line.first - 1:line.last])
            continue
        kind, name = _header(include, path, line)
        if kind == "<":  # a toolkit header, found by NVRTC in -I's folder only
            out.extend(physical[line.first - 1:line.last])
            continue
        header = kernel_file(path.parent / name, path.stem)
        if header not in pasted:
            pasted.add(header)
            out.append(expand_source(header, pasted))
        out.append(f'#line {line.last + 1} "{_rel(path)}"')
    return "\n".join(out) + "\n"


INCLUDE_RULE = ('rule: a kernel source includes by a literal name, "file" for a file of the kernel '
                "folders (pasted in) or <header> for a CUDA toolkit header, a relative path without "
                "`..`; no other directive reads a file")


def _header(include, path: Path, line) -> tuple[str, str]:
    """('"', name) or ('<', name) of an include the rule allows; else ConfigError."""
    header = include.header() if include.name == "include" else None
    if header is not None and header[0] == "<":
        parts = Path(header[1]).parts
        if header[1].startswith(("/", "\\", "~")) or ".." in parts or "\\" in header[1]:
            header = None
    if header is None:
        where = f"{_rel(path)}:{line.first}"
        raise ConfigError(
            f"kernel {path.stem}: {where} reads a file in a way the lab does not allow "
            f"(#{include.name}{include.operand.rstrip()}) ({INCLUDE_RULE}).")
    return header


@dataclass(frozen=True)
class ResourceReport:
    registers: int
    static_smem_bytes: int
    dynamic_smem_bytes: int
    local_bytes: int          # per-thread local memory: register spills and stack arrays
    max_threads_per_block: int | None
    compile_seconds: float
    source_sha256: str


class NvrtcKernel:
    """A compiled chapter kernel: launch(a, b, c, alpha, beta) runs it once on the current stream.

    A kernel whose config names `launch.workspace_bytes` takes one more argument, a zeroed
    device buffer of that size (split-K partials and tickets), allocated once per job; the
    kernel leaves its tickets zeroed for the next launch. A kernel whose config lists
    `launch.tensor_maps` takes one TMA descriptor per entry after that, encoded for the arrays
    of the launch (and kept for the next launch on the same arrays). A `launch.prepass` entry
    (`prepass`, its loaded function) runs first, on the arguments up to the workspace; a
    `launch.tail` entry (`tail`) last, on all of them (a split tail's last tiles).
    """

    def __init__(self, spec: KernelSpec, function, report: ResourceReport, prepass=None, tail=None):
        self.spec = spec
        self.function = function
        self.prepass, self.tail = prepass, tail
        self.report = report
        self.workspace = None
        self._maps: dict[tuple, tuple] = {}
        if spec.workspace_bytes is not None:
            import cupy as cp

            try:
                self.workspace = cp.zeros(max(spec.workspace_bytes, 16), dtype=cp.uint8)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise OutOfMemory(
                    f"kernel {spec.name} needs a {spec.workspace_bytes / 2**20:.1f} MiB workspace "
                    f"(launch.workspace_bytes) and the device cannot allocate it (rule: working "
                    f"set <= free device memory): {exc}") from exc

    def launch(self, a, b, c, alpha: float, beta: float) -> None:
        import numpy as np

        m, k = a.shape
        n = b.shape[1]
        args = (np.int32(m), np.int32(n), np.int32(k), np.float32(alpha), a, b, np.float32(beta), c)
        if self.workspace is not None:
            args += (self.workspace,)
        if self.spec.tensor_maps:
            args += self._tensor_maps(a, b)
        try:
            if self.prepass is not None:
                self.prepass(self.spec.prepass.grid, self.spec.prepass.block, args[:9])
            smem = self.spec.dynamic_smem_bytes
            self.function(self.spec.grid, self.spec.block, args, shared_mem=smem)
            if self.tail is not None:  # a split tail: the last tiles, after the main launch's
                self.tail(self.spec.tail.grid, self.spec.block, args, shared_mem=smem)
        except Exception as exc:  # CUDADriverError: invalid configuration, out of resources, ...
            raise LaunchFailed(
                f"launch of kernel {self.spec.name} ({self.spec.entry}, grid={self.spec.grid}, " + (
                    f"then {self.spec.tail.entry}, grid={self.spec.tail.grid}, " if self.spec.tail else "") +
                f"block={self.spec.block}, dynamic smem={self.spec.dynamic_smem_bytes} B) failed: {exc}"
            ) from exc

    def _tensor_maps(self, a, b) -> tuple:
        from src.job.tensor_maps import encode, operand

        key = (a.data.ptr, a.shape, b.data.ptr, b.shape)
        if key not in self._maps:
            arrays = {"a": a, "b": b, "workspace": self.workspace}
            self._maps = {key: tuple(encode(tm, operand(tm, arrays)) for tm in self.spec.tensor_maps)}
        return self._maps[key]


@dataclass(frozen=True)
class Cubin:
    """A compiled kernel on disk: the cubin, the entry's lowered (mangled) name and how long
    NVRTC took when it was built (a cache hit keeps that figure)."""

    path: str
    lowered_name: str
    arch: str
    compile_seconds: float
    source_sha256: str


@lru_cache(maxsize=None)
def cuda_include_options() -> tuple[str, ...]:
    """`-I` for the CUDA toolkit's headers (<mma.h> for the WMMA chapter), found where CuPy
    looks ($CUDA_PATH, $CUDA_HOME, CuPy's CUDA path, /usr/local/cuda); empty if none has them.
    NVRTC itself ships no such headers."""
    candidates = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")]
    try:
        from cupy._environment import get_cuda_path

        candidates.append(get_cuda_path())
    except Exception:
        pass
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and (Path(root) / "include" / "mma.h").is_file():
            return (f"-I{Path(root) / 'include'}",)
    return ()


def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def _cubin_bytes(program) -> bytes:
    """The program's whole cubin. CuPy's getCUBIN drops the last byte (it treats the buffer as a
    NUL-terminated string): the driver still loads that, but cuobjdump and nvdisasm reject it as
    an invalid ELF file. cuda-bindings reads the same program handle with its real size."""
    from cuda.bindings import nvrtc as bindings

    handle = bindings.nvrtcProgram(program)
    err, size = bindings.nvrtcGetCUBINSize(handle)
    buffer = bytearray(size)
    if err == bindings.nvrtcResult.NVRTC_SUCCESS:
        err, = bindings.nvrtcGetCUBIN(handle, buffer)
    if err != bindings.nvrtcResult.NVRTC_SUCCESS:
        raise CompileFailed(f"NVRTC compiled the program but could not hand over its cubin ({err}).")
    return bytes(buffer)


def nvrtc_version() -> str:
    return "%d.%d" % _nvrtc().getVersion()


def build_cubin(source_text: str, entry: str, arch: str, cache_dir: Path | str,
                name: str = "kernel") -> Cubin:
    """NVRTC: `source_text` with `entry` instantiated -> a cubin for `arch` ("sm_90", "sm_90a"),
    or the cached one. Raises CompileFailed with NVRTC's log (file and line) on an error.
    Safe to call from many threads at once: each builds its own program, and files are
    written under a private name and renamed into place."""
    nvrtc = _nvrtc()
    options = (*BUILD_OPTIONS, *cuda_include_options(), f"-arch={arch}")
    source_sha = hashlib.sha256(source_text.encode()).hexdigest()
    key = hashlib.sha256(json.dumps([source_sha, entry, options, nvrtc_version()]).encode()).hexdigest()
    directory = Path(cache_dir) / "cubin" / key[:2]
    meta_path, cubin_path = directory / f"{key}.json", directory / f"{key}.cubin"
    cached = cubin_entry(meta_path, cubin_path)
    if cached is not None:
        return Cubin(**cached)
    start = time.perf_counter()
    program = nvrtc.createProgram(source_text, "kernel.cu", [], [])
    try:
        nvrtc.addNameExpression(program, entry)
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as exc:
            log = _text(nvrtc.getProgramLog(program)).strip()
            first = next((line for line in log.splitlines() if "error" in line), str(exc))
            raise CompileFailed(
                f"kernel {name} ({entry}) failed to compile with NVRTC: {first.strip()}\n"
                f"NVRTC's log ({exc}):\n{log}") from None
        binary = _cubin_bytes(program)
        lowered = _text(nvrtc.getLoweredName(program, entry))
    finally:
        nvrtc.destroyProgram(program)
    cubin = Cubin(path=str(cubin_path.resolve()), lowered_name=lowered, arch=arch,
                  compile_seconds=time.perf_counter() - start, source_sha256=source_sha)
    try:
        store_cubin(binary, asdict(cubin), meta_path, cubin_path)
    except OSError as exc:  # a read-only or full cache: keep the build for this process only
        scratch = Path(tempfile.mkdtemp(prefix="sgemm-cubin-")) / cubin_path.name
        scratch.write_bytes(binary)
        logging.getLogger("sgemm").warning(
            "cubin cache: could not store the build in %s (%s: %s); using %s for this run",
            directory, type(exc).__name__, exc, scratch)
        cubin = replace(cubin, path=str(scratch))
    return cubin


def _text(value) -> str:
    return (value.decode() if isinstance(value, bytes) else str(value)).rstrip("\0")


def precompile(jobs, arch: str, cache_dir: Path | str, threads: int | None = None,
               executor: ThreadPoolExecutor | None = None) -> list[Future]:
    """Build the cubins of many (name, source_text, entry) on CPU threads, in order; returns
    the futures (each a Cubin or a CompileFailed). Pass an executor to keep building in the
    background while the caller goes on."""
    pool = executor or ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1,
                                          thread_name_prefix="nvrtc")
    return [pool.submit(build_cubin, text, entry, arch, cache_dir, name)
            for name, text, entry in jobs]


def build_arch(spec: KernelSpec, device=None) -> str | None:
    """What a kernel is built for: its config's fixed target (e.g. sm_90a for wgmma), else the
    device's architecture (`device`: a gpu.Device); None when neither is known (no GPU)."""
    if spec.arch:
        return spec.arch
    return None if device is None else "sm_" + device.compute_capability.replace(".", "")


# Loaded functions of this process, keyed by cubin (the launch geometry belongs to the spec).
_loaded: dict[tuple, tuple] = {}


def compile_kernel(spec: KernelSpec, cache_dir: Path | str = DEFAULT_CACHE_DIR):
    """Compile (or find cached) and load a chapter kernel, or build a cuBLAS baseline, a Triton
    peer (compiled and autotuned by Triton at its first launch per shape) or the CUTLASS peer
    (its library built with nvcc here, once per machine)."""
    if spec.backend == "cublas":
        from src.job.cublas import CublasGemm

        return CublasGemm(spec)
    if spec.backend == "triton":
        from src.job.triton_gemm import TritonGemm

        return TritonGemm(spec, cache_dir)
    if spec.backend == "cutlass":
        from src.job.cutlass_gemm import CutlassGemm

        return CutlassGemm(spec, cache_dir)

    function, report = _built(spec, spec.entry, cache_dir, spec.dynamic_smem_bytes)
    if spec.threads > report.max_threads_per_block:
        raise LaunchFailed(
            f"kernel {spec.name} ({spec.entry}) cannot launch {spec.threads} threads per block: "
            f"at {report.registers} registers per thread the device allows at most "
            f"{report.max_threads_per_block} (rule: threads * registers <= registers per block). "
            f"Use smaller tiles or fewer threads."
        )
    prepass = _built(spec, spec.prepass.entry, cache_dir, 0)[0] if spec.prepass else None
    tail = _built(spec, spec.tail.entry, cache_dir, spec.dynamic_smem_bytes)[0] if spec.tail else None
    return NvrtcKernel(spec, function, report, prepass, tail)


def _built(spec: KernelSpec, entry: str, cache_dir, dynamic_smem_bytes: int):
    """(function, report) of one entry of the spec's source, built or found cached, loaded once,
    for launches with `dynamic_smem_bytes` of dynamic shared memory (the pre-pass: none)."""
    cubin = build_cubin(expand_source(spec.source), entry, spec.arch or device_arch(), cache_dir,
                        spec.name)
    key = (cubin.path, cubin.lowered_name, dynamic_smem_bytes)
    if key not in _loaded:
        _loaded[key] = _load(spec, cubin, dynamic_smem_bytes)
    return _loaded[key]


def needs_smem_opt_in(dynamic_bytes: int, static_bytes: int) -> bool:
    """Whether a launch must raise the function's dynamic shared memory limit: without the opt-in
    a block gets 48 KiB in all, static included, so exactly 48 KiB of dynamic memory beside a
    static ticket (split_k.cuh's `arrived`) fails at launch with an invalid argument (the first
    H100 tune: gemm_ffma_skinny at 17 x 930 x 11433, 4 warps, K slices of 384)."""
    return dynamic_bytes + static_bytes > STATIC_SMEM_LIMIT


def _load(spec: KernelSpec, cubin: Cubin, dynamic_smem_bytes: int):
    """The loaded entry, its shared memory opt-in its own launches' (a pre-pass: none; given the
    main entry's, its static tile put it over the block's, refused: tests/test_compile.py)."""
    import cupy as cp

    try:
        module = cp.RawModule(path=cubin.path)
        function = module.get_function(cubin.lowered_name)
        function.attributes  # forces the load; resource errors surface here, not at launch
    except cp.cuda.driver.CUDADriverError as exc:
        raise LaunchFailed(f"kernel {spec.name} ({spec.entry}) could not be loaded from its "
                           f"cubin ({cubin.arch}): {exc}") from exc
    if needs_smem_opt_in(dynamic_smem_bytes, int(function.shared_size_bytes)):
        function.max_dynamic_shared_size_bytes = dynamic_smem_bytes  # the opt-in
    report = ResourceReport(
        registers=int(function.num_regs),
        static_smem_bytes=int(function.shared_size_bytes),
        dynamic_smem_bytes=dynamic_smem_bytes,
        local_bytes=int(function.local_size_bytes),
        max_threads_per_block=int(function.max_threads_per_block),
        compile_seconds=cubin.compile_seconds,
        source_sha256=cubin.source_sha256,
    )
    return function, report


def nvrtc_ptx(source_text: str, entry: str, compute_capability: str) -> str:
    """The PTX NVRTC makes of `source_text` with `entry` instantiated, for a device of
    `compute_capability` (e.g. "9.0"), with the options CuPy's RawModule passes (ours, -ftz=true,
    device code by default). CuPy may compile the module that runs straight to a cubin; this is
    the same source, instantiation and options stopped at PTX, for reading. Needs NVRTC, not a GPU.
    """
    from cupy_backends.cuda.libs import nvrtc

    options = [*BUILD_OPTIONS, *cuda_include_options(),
               "-arch=compute_" + compute_capability.replace(".", "")]
    program = nvrtc.createProgram(source_text, "kernel.cu", [], [])
    try:
        nvrtc.addNameExpression(program, entry)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            raise CompileFailed(f"NVRTC could not make PTX for {entry}: {exc}\n"
                                f"{nvrtc.getProgramLog(program)}") from exc
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return (ptx.decode() if isinstance(ptx, bytes) else ptx).rstrip("\0")
