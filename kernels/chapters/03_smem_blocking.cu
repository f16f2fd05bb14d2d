// 03 shared-memory cache blocking.
//
// What changed: in 02 every warp of a block re-reads the same rows of A and columns of B
// from global memory. Here the block first stages a BS x BS tile of A and of B in shared
// memory (one coalesced element per thread), synchronises, and then every thread runs its
// partial dot product out of shared memory. Each global element is now read once per
// block instead of once per thread.
// Predicted effect: ~1.5x over 02 (seed 003: 6,352 -> 9,174 GFLOP/s). The kernel is now
// bound by shared-memory loads: two LDS per FMA.
//
// Tile hierarchy: block tile = BS x BS of C, K walked in steps of BS; thread tile = 1 x 1.
// Needs M, N, K to be multiples of BS (no edge handling, as in the worklog).
#include "../include/common.cuh"

template <int BS>
__global__ void __launch_bounds__(BS * BS)
sgemm_smem_blocking(int M, int N, int K, float alpha, const float* __restrict__ A,
                    const float* __restrict__ B, float beta, float* __restrict__ C) {
  __shared__ float As[BS * BS];
  __shared__ float Bs[BS * BS];

  const int block_row = blockIdx.y;
  const int block_col = blockIdx.x;
  const int thread_row = threadIdx.x / BS;
  const int thread_col = threadIdx.x % BS;

  A += block_row * BS * K;                       // row block_row*BS, column 0
  B += block_col * BS;                           // row 0, column block_col*BS
  C += block_row * BS * N + block_col * BS;

  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += BS) {
    // threadIdx.x % BS runs along a row: both loads are coalesced.
    As[thread_row * BS + thread_col] = A[thread_row * K + thread_col];
    Bs[thread_row * BS + thread_col] = B[thread_row * N + thread_col];
    __syncthreads();
    A += BS;
    B += BS * N;
#pragma unroll
    for (int i = 0; i < BS; ++i) {
      acc += As[thread_row * BS + i] * Bs[i * BS + thread_col];
    }
    __syncthreads();  // nobody may overwrite the tiles while others still read them
  }
  store_axpby(&C[thread_row * N + thread_col], acc, alpha, beta);
}
