// 07 bank conflicts resolved by linearizing the shared-memory B tile.
//
// What changed from 06:
// - In 06 a warp's 16 thread columns read their B values as float4s from Bs[k][col * TN + t]:
//   16 chunks of 16 bytes spread 32 bytes apart over 512 bytes, so every group of 4 banks is hit
//   by 4 chunks: 4 shared-memory wavefronts where 2 would do (a 2-way bank conflict).
// - Bs is now stored in the order the threads read it: for each k, float4 group g of thread
//   column c lives at Bs[(k * TN/4 + g) * (BN/TN) + c] (in float4s). A warp's reads of one group
//   are 16 consecutive float4s (256 contiguous bytes): conflict-free, still LDS.128. The float4
//   read from global memory lands as one float4 in shared memory (its 4 columns belong to the same
//   thread and group), so the store side stays STS.128.
// Predicted effect: small (the worklog's kernel 7 gained a few percent on an A6000); the
// transposing scalar stores of A still conflict (08 addresses them).
//
// Tile hierarchy: block tile = BM x BN of C, K walked in steps of BK;
//                 thread tile = TM x TN (THREADS = BM * BN / (TM * TN)).
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__(BM * BN / (TM * TN))
sgemm_bank_linearize(int M, int N, int K, float alpha, const float* __restrict__ A,
                     const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int THREADS = BM * BN / (TM * TN);
  constexpr int COLS = BN / TN;            // thread columns in the block
  __shared__ __align__(16) float As[BK * BM];      // transposed: As[k * BM + m]
  __shared__ __align__(16) float4 Bs4[BK * BN / 4];  // linearized: [k][group][thread column]

  const int thread_col = threadIdx.x % COLS;
  const int thread_row = threadIdx.x / COLS;

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += blockIdx.y * BM * N + blockIdx.x * BN;

  float acc[TM * TN] = {0.0f};
  float reg_a[TM];
  float reg_b[TN];
  for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
    for (int i = threadIdx.x; i < BM * BK / 4; i += THREADS) {
      const int m = i / (BK / 4);
      const int k4 = (i % (BK / 4)) * 4;
      const float4 v = load_float4(&A[m * K + k4]);
      As[(k4 + 0) * BM + m] = v.x;
      As[(k4 + 1) * BM + m] = v.y;
      As[(k4 + 2) * BM + m] = v.z;
      As[(k4 + 3) * BM + m] = v.w;
    }
#pragma unroll
    for (int i = threadIdx.x; i < BK * BN / 4; i += THREADS) {
      const int k = i / (BN / 4);
      const int n4 = (i % (BN / 4)) * 4;   // first column of this float4
      const int owner = n4 / TN;           // the thread column that reads it
      const int group = (n4 % TN) / 4;     // which of its TN/4 float4s
      Bs4[(k * (TN / 4) + group) * COLS + owner] = load_float4(&B[k * N + n4]);
    }
    __syncthreads();
    A += BK;
    B += BK * N;

#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
      for (int t = 0; t < TM; t += 4) {
        const float4 v = load_float4(&As[kk * BM + thread_row * TM + t]);
        reg_a[t] = v.x; reg_a[t + 1] = v.y; reg_a[t + 2] = v.z; reg_a[t + 3] = v.w;
      }
#pragma unroll
      for (int g = 0; g < TN / 4; ++g) {
        const float4 v = Bs4[(kk * (TN / 4) + g) * COLS + thread_col];
        reg_b[4 * g] = v.x; reg_b[4 * g + 1] = v.y; reg_b[4 * g + 2] = v.z; reg_b[4 * g + 3] = v.w;
      }
#pragma unroll
      for (int tm = 0; tm < TM; ++tm) {
#pragma unroll
        for (int tn = 0; tn < TN; ++tn) acc[tm * TN + tn] += reg_a[tm] * reg_b[tn];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int tm = 0; tm < TM; ++tm) {
#pragma unroll
    for (int tn = 0; tn < TN; tn += 4) {
      store_axpby4(&C[(thread_row * TM + tm) * N + thread_col * TN + tn], &acc[tm * TN + tn],
                   alpha, beta);
    }
  }
}
