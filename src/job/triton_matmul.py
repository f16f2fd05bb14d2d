"""The Triton peer's kernel: the matmul tutorial's structure (block tiles, GROUP_M tile order for
L2 reuse, a K loop of tl.dot) with tl.dot's input_precision a compile-time parameter (ieee, tf32,
tf32x3) and C = alpha * A @ B + beta * C, autotuned by Triton over CONFIGS per (M, N, K).

Imported only by src/job/triton_gemm.py, which turns a missing triton into a skipped row.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import triton
import triton.language as tl

# Eight configs, as the tutorial's (FP32 operands: BLOCK_K 32 keeps the stages in shared
# memory); each costs a compile per input_precision, so the set stays small.
CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 8},
                  num_stages=stages, num_warps=warps)
    for bm, bn, stages, warps in ((128, 256, 3, 8), (256, 128, 3, 8), (128, 128, 4, 8),
                                  (128, 128, 3, 4), (128, 64, 4, 4), (64, 128, 4, 4),
                                  (64, 64, 5, 4), (32, 64, 5, 2))
]


# key: the autotuner caches per key, and the three peers share this kernel; restore_value:
# autotuning launches each config on the real C, which beta != 0 reads
@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "HAS_BETA", "INPUT_PRECISION"],
                 restore_value=["c_ptr"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, alpha, beta,
                  HAS_BETA: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrapped rows are never stored
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kk * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - kk * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = acc * alpha

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if HAS_BETA:
        acc += beta * tl.load(c_ptrs, mask=c_mask, other=0.0)
    tl.store(c_ptrs, acc, mask=c_mask)


def launch(a, b, c, alpha: float, beta: float, input_precision: str,
           config: dict | None = None) -> None:
    """One launch on torch tensors (row-major A m x k, B k x n, C m x n): autotuned, or with
    `config` (a chosen config's all_kwargs()), the kernel itself with that config, as the
    autotuner launches its choice."""
    m, k = a.shape
    n = b.shape[1]

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel = matmul_kernel if config is None else matmul_kernel.fn
    kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 c.stride(0), c.stride(1), float(alpha), float(beta),
                 HAS_BETA=beta != 0.0, INPUT_PRECISION=input_precision, **(config or {}))


def chosen() -> tuple[dict, str] | None:
    """The config the autotuner chose at its last launch: its launch arguments (all_kwargs())
    and Triton's own text of it (`BLOCK_M: 128, ...`)."""
    best = getattr(matmul_kernel, "best_config", None)
    return None if best is None else (best.all_kwargs(), str(best))


def source_sha256() -> str:
    """This file's SHA-256: the kernel and its configs (a shared autotune choice's key)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def version() -> str:
    return triton.__version__
