// Test-only kernels (not in the published set) that pass the first launch's verification and
// then cheat: each must be caught by the checks of the timed launches (src/job/measure.py) and
// get no figure (tests/test_cheating.py). Same signature as every chapter. Each keeps its own
// launch count in device memory: the last block to finish a launch counts it, so every block
// of one launch sees the same count (the next launch starts after this one has finished).
#include "../../kernels/include/common.cuh"

__device__ unsigned int cheat_blocks_done[3];
__device__ unsigned int cheat_launches[3];

__device__ __forceinline__ unsigned int launches_so_far(int which) {
  return *(volatile unsigned int*)&cheat_launches[which];
}

__device__ void count_launch(int which) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    const unsigned int blocks = gridDim.x * gridDim.y;
    if (atomicAdd(&cheat_blocks_done[which], 1u) == blocks - 1) {
      cheat_blocks_done[which] = 0;
      atomicAdd(&cheat_launches[which], 1u);
      __threadfence();
    }
  }
}

// The plain one-element-per-thread product, over k < k_end only.
__device__ void naive_until(int M, int N, int K, float alpha, const float* A, const float* B,
                            float beta, float* C, int k_end) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int i = 0; i < k_end; ++i) acc += A[row * K + i] * B[i * N + col];
    store_axpby(&C[row * N + col], acc, alpha, beta);
  }
}

// (a) Skips work once a flag is set: after its first launch it does an eighth of K.
__global__ void cheat_skip_after_first(int M, int N, int K, float alpha, const float* A,
                                       const float* B, float beta, float* C) {
  const bool flag = launches_so_far(0) > 0;
  naive_until(M, N, K, alpha, A, B, beta, C, flag ? K / 8 : K);
  count_launch(0);
}

// (b) Reuses its earlier result: after its first launch it writes nothing, so C keeps it.
__global__ void cheat_reuse_result(int M, int N, int K, float alpha, const float* A,
                                   const float* B, float beta, float* C) {
  if (launches_so_far(1) > 0) return;
  naive_until(M, N, K, alpha, A, B, beta, C, K);
  count_launch(1);
}

// (c) Behaves differently after N launches: right for its first 4, then it drops the last k
// step (an error of about 1/sqrt(K), far above the tolerance, on a kernel that looks honest).
__global__ void cheat_after_n_launches(int M, int N, int K, float alpha, const float* A,
                                       const float* B, float beta, float* C) {
  const bool late = launches_so_far(2) >= 4;
  naive_until(M, N, K, alpha, A, B, beta, C, late ? K - 1 : K);
  count_launch(2);
}
