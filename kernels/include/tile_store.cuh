// tile_store.cuh: a thread tile's float4 group of accumulators to C with the alpha / beta
// epilogue, predicated at C's edges: one 16-byte access where C's rows are 16-byte aligned
// (VEC 4), element by element where not; or with C's old values read ahead of the K loop. The
// library's FFMA kernel (gemm/ffma.cu) stores through it; chapters 17 and 21 keep their own copy
// of the first (a chapter is self-contained).
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

// C's float4 group at (row, col) read ahead (zero outside C): the old values a kernel that
// prefetches C keeps in registers through its K loop, so the read's memory round trip overlaps
// the operands' instead of following the last FFMA.
template <int VEC>
__device__ __forceinline__ void load_c_group(const float* C, int M, int N, int row, int col,
                                             float* old) {
  if (VEC == 4) {
    const float4 v = (row < M && col < N) ? load_float4(&C[row * N + col])
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    old[0] = v.x; old[1] = v.y; old[2] = v.z; old[3] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) old[e] = (row < M && col + e < N) ? C[row * N + col + e] : 0.0f;
  }
}

// store_axpby_group with C's old values read ahead (load_c_group): C = alpha * acc + beta * old.
template <int VEC>
__device__ __forceinline__ void store_axpby_group_ahead(float* C, int M, int N, int row, int col,
                                                        const float* v, const float* old,
                                                        float alpha, float beta) {
  if (row >= M) return;
  if (VEC == 4) {
    if (col < N)
      store_float4(&C[row * N + col], make_float4(alpha * v[0] + beta * old[0], alpha * v[1] + beta * old[1],
                                                  alpha * v[2] + beta * old[2], alpha * v[3] + beta * old[3]));
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col + e < N) C[row * N + col + e] = alpha * v[e] + beta * old[e];
  }
}

#endif  // SGEMM_LAB_TILE_STORE_CUH
