"""A NumPy stand-in for the part of CuPy that the measure step uses (arrays, events, the memory
pool, the runtime calls), so its logic runs on CPU: kernels are Python objects with the
chapters' launch(a, b, c, alpha, beta), events read the host clock. Install with `install`; the
load step's stand-in (RawModule, the driver's errors, no NVRTC) with `install_loader`."""

from __future__ import annotations

import sys
import time
import types

import numpy as np


class CUDARuntimeError(RuntimeError):
    pass


class _Event:
    def __init__(self):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass


class _Stream:
    ptr = 0

    def synchronize(self):
        pass


class _Generator:
    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def uniform(self, low, high, shape, dtype=np.float64):
        return self._rng.uniform(low, high, shape).astype(dtype)


def _module() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    for name in ("float32", "float64", "uint64", "nan", "matmul", "isfinite", "count_nonzero",
                 "full", "zeros", "empty", "linalg"):
        setattr(cp, name, getattr(np, name))
    cp.random = types.SimpleNamespace(default_rng=_Generator)
    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError, deviceSynchronize=lambda: None,
        memGetInfo=lambda: (80 << 30, 80 << 30), memsetAsync=lambda *args: None)
    cp.cuda = types.SimpleNamespace(
        runtime=runtime, Event=_Event, get_current_stream=lambda: _Stream(),
        get_elapsed_time=lambda start, stop: 1e3 * (stop.at - start.at))
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    return cp


class _NoProbe:
    """ClockProbe without a GPU: no clock readings (every sample kept)."""

    def __init__(self, batch):
        pass

    def before(self, i):
        pass

    def after(self, i):
        pass

    def read(self, count):
        return [float("inf")] * count


def install(monkeypatch) -> None:
    from src.job import timing

    monkeypatch.setitem(sys.modules, "cupy", _module())
    monkeypatch.setattr(timing, "ClockProbe", _NoProbe)


def install_loader(monkeypatch, get_function):
    """The load step's stand-in (src/job/compile.compile_kernel, no GPU): RawModule(path)
    .get_function(name) calls `get_function(name)` (the test's own function objects, so what the
    runner sets on and launches through each can be asserted), the driver's and the allocator's
    errors are plain Python ones, build_cubin returns a named cubin without NVRTC, and the
    runner's module cache starts empty; returns src.job.compile."""
    from src.job import compile as compile_mod

    fake = types.ModuleType("cupy")
    fake.RawModule = lambda path: types.SimpleNamespace(path=path, get_function=get_function)
    fake.cuda = types.SimpleNamespace(driver=types.SimpleNamespace(CUDADriverError=RuntimeError),
                                      memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    fake.uint8, fake.zeros = "uint8", lambda size, dtype: bytearray(size)  # the workspace
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(compile_mod, "_loaded", {})
    monkeypatch.setattr(compile_mod, "build_cubin", lambda text, entry, arch, cache_dir, name:
                        compile_mod.Cubin(entry, entry, arch, 0.0, "0" * 64))
    return compile_mod
