// 01 naive: one thread per element of C.
//
// What it is: the starting point of the worklog. Thread (x, y) of a 2-D block walks
// row x of A and column y of B and writes C[x][y].
// Why it is slow: threadIdx.x (the fastest-varying index inside a warp) selects the
// *row*. The 32 threads of a warp therefore read 32 different rows of A (K floats apart)
// and write 32 different rows of C: no two accesses share a 32-byte sector, so every
// load is its own memory transaction. Almost all of the time is spent waiting on DRAM.
//
// Tile hierarchy: block tile = blockDim.x x blockDim.y elements of C; thread tile = 1 x 1.
// Handles any M, N, K (out-of-range threads return).
#include "../include/common.cuh"

__global__ void sgemm_naive(int M, int N, int K, float alpha,
                                       const float* __restrict__ A,
                                       const float* __restrict__ B, float beta,
                                       float* __restrict__ C) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;  // consecutive threads -> rows: uncoalesced
  const int col = blockIdx.y * blockDim.y + threadIdx.y;
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) {
      acc += A[row * K + i] * B[i * N + col];
    }
    store_axpby(&C[row * N + col], acc, alpha, beta);
  }
}
