// tile_store.cuh: a thread tile's float4 group of accumulators to C with the alpha / beta
// epilogue, predicated at C's edges: one 16-byte access where C's rows are 16-byte aligned
// (VEC 4), element by element where not. The library's FFMA kernel (gemm/ffma.cu) stores through
// it; chapters 17 and 21 keep their own copy of these lines (a chapter is self-contained).
#ifndef SGEMM_LAB_TILE_STORE_CUH
#define SGEMM_LAB_TILE_STORE_CUH
#include "common.cuh"

template <int VEC>
__device__ __forceinline__ void store_axpby_group(float* C, int M, int N, int row, int col,
                                                  const float* v, float alpha, float beta) {
  if (row >= M) return;
  if (VEC == 4) {
    if (col < N) store_axpby4(&C[row * N + col], v, alpha, beta);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col + e < N) store_axpby(&C[row * N + col + e], v[e], alpha, beta);
  }
}

#endif  // SGEMM_LAB_TILE_STORE_CUH
