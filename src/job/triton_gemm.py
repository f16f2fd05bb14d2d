"""Triton peers (conf/kernel/triton_*.yaml) behind the chapters' launch(a, b, c, alpha, beta)
interface: the matmul a Python user would write (src/job/triton_matmul.py), tl.dot's
input_precision from the config (ieee, tf32, tf32x3).

Triton compiles and autotunes at the first launch of each shape; that launch is timed here,
synchronised, and kept in `tuning` (seconds and the chosen config). The first launch of a job is
its verification (measure.py), so the autotune has finished before any timed launch. The choice
is shared through the cache_dir (src/job/triton_tuning.py): a process that finds one for this
GPU and shape (another GPU's slot autotuned it) launches that config without autotuning, and its
`tuning` says `reused`, with the autotuning process's seconds. Every later launch of the shape
runs the chosen config directly, however it was found. CuPy arrays
reach Triton as torch tensors through DLPack (no copy), and Triton launches on CuPy's current
stream, so the timing step's events and flushes order with it.

Without triton (or torch, which Triton's autotuner uses) a job is `skipped_missing_peer`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from src.errors import LaunchFailed, PeerMissing
from src.job.gpu import device_arch
from src.job.recording import Tuning
from src.job.spec import KernelSpec
from src.job.triton_tuning import Choice, shared

EXTRA = "pip install -e '.[peers]'"


def missing_message(name: str, exc: BaseException) -> str:
    return (f"peer {name} is skipped: Triton or torch cannot be imported ({type(exc).__name__}: "
            f"{exc}) (rule: a Triton peer needs the optional extra `peers`, triton and torch; "
            f"install it with {EXTRA}). The other kernels and baselines are not affected; the "
            f"peer's rows and comparisons are left out.")


class TritonGemm:
    def __init__(self, spec: KernelSpec, cache_dir: Path | str):
        try:
            import torch

            from src.job import triton_matmul
        except ImportError as exc:
            raise PeerMissing(missing_message(spec.name, exc)) from None
        self.spec = spec
        self.report = None  # Triton compiles at the first launch: see `tuning`
        self.tuning: Tuning | None = None
        self.version = triton_matmul.version()
        self._torch = torch
        self._matmul = triton_matmul
        self._cache_dir = cache_dir
        self._chosen: dict[tuple, Choice] = {}  # per shape: the config every launch runs

    def _stream(self):
        """Triton launches on torch's current stream: make it CuPy's (a no-op on the default)."""
        import cupy as cp

        ptr = cp.cuda.get_current_stream().ptr
        if not ptr:
            return contextlib.nullcontext()
        return self._torch.cuda.stream(self._torch.cuda.ExternalStream(ptr))

    def _run(self, a, b, c, alpha: float, beta: float, config: dict | None) -> None:
        from_dlpack = self._torch.from_dlpack
        with self._stream():
            self._matmul.launch(from_dlpack(a), from_dlpack(b), from_dlpack(c), alpha, beta,
                                self.spec.input_precision, config)

    def _described(self, a, b, beta: float) -> dict:
        """What a shared autotune choice depends on (src/job/triton_tuning.py's key)."""
        import cupy as cp

        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return {"kernel_sha256": self._matmul.source_sha256(), "triton": self.version,
                "gpu": name, "arch": device_arch(), "m": int(a.shape[0]), "n": int(b.shape[1]),
                "k": int(a.shape[1]), "has_beta": beta != 0.0,
                "input_precision": self.spec.input_precision}

    def _autotuned(self, a, b, c, alpha: float, beta: float) -> Choice:
        """Triton's autotune at this shape, then its choice run once (this launch's output)."""
        import cupy as cp

        started = time.perf_counter()
        self._run(a, b, c, alpha, beta, None)  # compiles and autotunes, then runs the chosen config
        cp.cuda.get_current_stream().synchronize()
        kwargs, text = self._matmul.chosen()
        return Choice(kwargs, Tuning(time.perf_counter() - started, text))

    def launch(self, a, b, c, alpha: float, beta: float) -> None:
        key = (a.shape, b.shape, beta != 0.0)
        try:
            if key not in self._chosen:
                import cupy as cp

                cp.cuda.get_current_stream().synchronize()
                choice = shared(self._cache_dir, self._described(a, b, beta),
                                lambda: self._autotuned(a, b, c, alpha, beta))
                self._chosen[key] = choice
                if not choice.tuning.reused:  # this launch autotuned and wrote C already
                    self.tuning = choice.tuning
                    return
            choice = self._chosen[key]
            self._run(a, b, c, alpha, beta, choice.kwargs)
            self.tuning = choice.tuning
        except LaunchFailed:
            raise
        except Exception as exc:  # Triton's CompilationError, OutOfResources, a CUDA error
            raise LaunchFailed(f"Triton peer {self.spec.name} (input_precision="
                               f"{self.spec.input_precision}) failed: {type(exc).__name__}: "
                               f"{exc}") from exc
