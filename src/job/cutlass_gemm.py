"""The CUTLASS peer (conf/kernel/cutlass_3xtf32.yaml) behind the chapters' launch(a, b, c, alpha,
beta) interface: CUTLASS's 3xTF32 device-level GEMM (src/job/cutlass_3xtf32.cu), built by
src/job/cutlass_build.py and called through ctypes with CuPy's device pointers, on CuPy's current
stream (so the timing step's events and flushes order with it).

The library is built when the peer is compiled (compile_kernel), before any launch: its nvcc
time is never timed, and is kept in `tuning` with the tile the library's rule picks at each shape
(the record's peer_compile_s and peer_config, as for a Triton peer's autotune).
"""

from __future__ import annotations

import ctypes

from src.errors import LaunchFailed
from src.job.gpu import device_arch
from src.job.cutlass_build import build_library, require_tools
from src.job.spec import KernelSpec
from src.job.recording import Tuning


def load(path: str) -> ctypes.CDLL:
    """The built library with its entries typed (it loads without a GPU)."""
    library = ctypes.CDLL(path)
    library.cutlass_3xtf32_gemm.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p]
    library.cutlass_3xtf32_gemm.restype = ctypes.c_int
    library.cutlass_3xtf32_sms.argtypes = []
    library.cutlass_3xtf32_sms.restype = ctypes.c_int
    library.cutlass_3xtf32_choose.argtypes = [ctypes.c_int] * 5
    library.cutlass_3xtf32_choose.restype = ctypes.c_int
    library.cutlass_3xtf32_config_name.argtypes = [ctypes.c_int]
    library.cutlass_3xtf32_config_name.restype = ctypes.c_char_p
    library.cutlass_3xtf32_status_string.argtypes = [ctypes.c_int]
    library.cutlass_3xtf32_status_string.restype = ctypes.c_char_p
    return library


class CutlassGemm:
    def __init__(self, spec: KernelSpec, cache_dir):
        require_tools(spec.name)  # skipped without them, before the device is asked its arch
        self.spec = spec
        self.report = None  # nvcc builds a library, not one cubin: no ptxas report is read
        self.built = build_library(spec.arch or device_arch(), cache_dir, spec.name)
        self.library = load(self.built.path)
        self.tuning: Tuning | None = None
        self._tuned: dict[tuple, Tuning] = {}  # per shape: no extra host calls in timed launches

    def config(self, m: int, n: int, k: int, pointers_aligned: bool) -> str:
        """The instantiation the library's rule runs at m x n x k on this device."""
        sms = self.library.cutlass_3xtf32_sms()
        choice = self.library.cutlass_3xtf32_choose(m, n, k, sms, int(pointers_aligned))
        return self.library.cutlass_3xtf32_config_name(choice).decode()

    def launch(self, a, b, c, alpha: float, beta: float) -> None:
        import cupy as cp

        m, k = a.shape
        n = b.shape[1]
        if not all(x.flags.c_contiguous and x.dtype == cp.float32 for x in (a, b, c)):
            raise LaunchFailed(f"peer {self.spec.name} takes row-major (C-contiguous) float32 A, "
                               f"B and C (rule: lda = K, ldb = N, ldc = N).")
        pointers = (a.data.ptr, b.data.ptr, c.data.ptr)
        status = self.library.cutlass_3xtf32_gemm(m, n, k, alpha, pointers[0], pointers[1], beta,
                                                  pointers[2], cp.cuda.get_current_stream().ptr)
        key = (m, n, k, all(p % 16 == 0 for p in pointers))
        if status != 0:
            raise LaunchFailed(
                f"CUTLASS peer {self.spec.name} refused or failed at {m}x{n}x{k}: cutlass::Status "
                f"{status} ({self.library.cutlass_3xtf32_status_string(status).decode()}) with "
                f"{self.config(*key)} (can_implement checks the shape and alignment; a CUDA "
                f"error at launch reads 'Error Internal').")
        if key not in self._tuned:
            self._tuned[key] = Tuning(self.built.compile_seconds, self.config(*key),
                                      self.built.reused)
        self.tuning = self._tuned[key]
