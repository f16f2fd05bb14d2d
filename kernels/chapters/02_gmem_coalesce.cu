// 02 global-memory coalescing: same arithmetic as 01, threads remapped.
//
// What changed: the block is 1-D (BS*BS threads) and threadIdx.x % BS selects the
// *column*. Now the 32 threads of a warp read one element of A (a broadcast) and 32
// consecutive elements of B, and write 32 consecutive elements of C: one 128-byte
// transaction instead of 32.
// Predicted effect: an order of magnitude (seed 003: 502 -> 6,352 GFLOP/s on a GH200).
//
// Tile hierarchy: block tile = BS x BS elements of C; thread tile = 1 x 1.
// Handles any M, N, K (out-of-range threads return).
#include "../include/common.cuh"

template <int BS>
__global__ void __launch_bounds__(BS * BS)
sgemm_gmem_coalesce(int M, int N, int K, float alpha, const float* __restrict__ A,
                    const float* __restrict__ B, float beta, float* __restrict__ C) {
  const int row = blockIdx.x * BS + threadIdx.x / BS;
  const int col = blockIdx.y * BS + threadIdx.x % BS;  // consecutive threads -> columns
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) {
      acc += A[row * K + i] * B[i * N + col];
    }
    store_axpby(&C[row * N + col], acc, alpha, beta);
  }
}
