// Test-only kernels (not in the published set): each breaks in one deliberate way, so the
// tests can check that a sweep records the failure with its cause and goes on
// (tests/test_faults.py). Same signature as every chapter.
#include "../../kernels/include/common.cuh"

// Writes far outside C: an illegal-address fault that poisons the CUDA context.
__global__ void broken_out_of_bounds(int M, int N, int K, float alpha, const float* A,
                                     const float* B, float beta, float* C) {
  const long long far = 1LL << 40;  // 4 TiB past C: never mapped
  if (threadIdx.x == 0 && blockIdx.x == 0) C[far] = alpha;
}

// Never returns: a hang that only killing its process ends. `spin` is read from memory so the
// compiler cannot prove the loop infinite and drop it.
__global__ void broken_infinite_loop(int M, int N, int K, float alpha, const float* A,
                                     const float* B, float beta, float* C) {
  volatile const float* a = A;
  while (a[0] == a[0] || a[0] != a[0]) {
    __nanosleep(1000);
  }
  C[0] = alpha;
}

// Finishes and writes every element, but the product is wrong (A B^T instead of A B on the
// square problems it is run on): only verification can tell.
__global__ void broken_wrong_values(int M, int N, int K, float alpha, const float* A,
                                    const float* B, float beta, float* C) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) acc += A[row * K + i] * B[col * K + i];
    store_axpby(&C[row * N + col], acc, alpha, beta);
  }
}
