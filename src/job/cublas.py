"""cuBLAS baselines behind the same launch(a, b, c, alpha, beta) interface as a chapter kernel.

Row-major C = alpha * A @ B + beta * C is the column-major product C^T = B^T A^T, so cuBLAS is
called with the operands swapped and no transposes (the seed-001 trick): m' = N, n' = M.
"""

from __future__ import annotations

import numpy as np

from src.errors import LaunchFailed
from src.job.spec import KernelSpec


class CublasGemm:
    def __init__(self, spec: KernelSpec):
        import cupy as cp
        from cupy_backends.cuda.libs import cublas

        self.spec = spec
        self._cublas = cublas
        self.compute_type = getattr(cublas, spec.compute_type)
        self.handle = cp.cuda.device.get_cublas_handle()
        # CUBLAS_DEFAULT_MATH: tensor cores only where the compute type asks for them, so
        # CUBLAS_COMPUTE_32F is true FP32 whatever CUPY_TF32 says.
        cublas.setMathMode(self.handle, cublas.CUBLAS_DEFAULT_MATH)
        self._alpha = np.zeros(1, dtype=np.float32)
        self._beta = np.zeros(1, dtype=np.float32)
        self.report = None  # nothing is compiled

    def launch(self, a, b, c, alpha: float, beta: float) -> None:
        from cupy.cuda import runtime

        cublas = self._cublas
        m, k = a.shape
        n = b.shape[1]
        self._alpha[0] = alpha
        self._beta[0] = beta
        try:
            cublas.setPointerMode(self.handle, cublas.CUBLAS_POINTER_MODE_HOST)
            cublas.gemmEx(
                self.handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
                self._alpha.ctypes.data, b.data.ptr, runtime.CUDA_R_32F, n,
                a.data.ptr, runtime.CUDA_R_32F, k,
                self._beta.ctypes.data, c.data.ptr, runtime.CUDA_R_32F, n,
                self.compute_type, cublas.CUBLAS_GEMM_DEFAULT,
            )
        except Exception as exc:
            raise LaunchFailed(f"cuBLAS gemmEx ({self.spec.compute_type}) failed: {exc}") from exc

