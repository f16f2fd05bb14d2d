"""A stand-in `cupy` for CPU tests of the runner's load step (src/job/compile.compile_kernel): its
RawModule hands out the test's own function objects, the driver's and the allocator's errors are
plain Python ones, and build_cubin returns a named cubin without NVRTC, so what the runner sets on
and launches through each function can be asserted without a GPU."""

from __future__ import annotations

import sys
import types


def install(monkeypatch, get_function):
    """Put the stand-in in sys.modules (RawModule(path).get_function(name) calls
    `get_function(name)`) and empty the runner's module cache; returns src.job.compile."""
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
