// 08 bank conflicts avoided by padding: an extra column in the transposed A tile.
//
// What changed from 07:
// - A is written to shared memory transposed, one scalar at a time: As[k][m]. With rows of BM
//   floats (a multiple of 32), the threads of a warp that load the same m from different k4
//   groups write to the same bank: with BK = 8, two k4 groups per row of A, so a 2-way conflict
//   on every store (4-way with BK = 16).
// - Each row of As now has an extra column: BM + 4 floats (one float4, so that the LDS.128 reads
//   of a thread's TM values stay 16-byte aligned). Row k then starts 4k banks later: the two k4
//   groups of BK = 8 land 16 banks apart (conflict-free); with BK = 16 the four groups fall
//   0, 16, 0, 16 banks apart, which halves the conflict but cannot remove it (that would need a
//   2-float pad, which breaks the float4 reads; 14 swizzles instead).
// Predicted effect: small; the stores of A are a small part of the K loop (the worklog's
// kernel 8 was within a few percent of kernel 7).
//
// Tile hierarchy: block tile = BM x BN of C, K walked in steps of BK;
//                 thread tile = TM x TN (THREADS = BM * BN / (TM * TN)).
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__(BM * BN / (TM * TN))
sgemm_bank_padding(int M, int N, int K, float alpha, const float* __restrict__ A,
                   const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int THREADS = BM * BN / (TM * TN);
  constexpr int COLS = BN / TN;
  constexpr int AS_STRIDE = BM + 4;                       // the extra (float4) column
  __shared__ __align__(16) float As[BK * AS_STRIDE];       // transposed: As[k * AS_STRIDE + m]
  __shared__ __align__(16) float4 Bs4[BK * BN / 4];        // linearized as in 07

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
      As[(k4 + 0) * AS_STRIDE + m] = v.x;
      As[(k4 + 1) * AS_STRIDE + m] = v.y;
      As[(k4 + 2) * AS_STRIDE + m] = v.z;
      As[(k4 + 3) * AS_STRIDE + m] = v.w;
    }
#pragma unroll
    for (int i = threadIdx.x; i < BK * BN / 4; i += THREADS) {
      const int k = i / (BN / 4);
      const int n4 = (i % (BN / 4)) * 4;
      Bs4[(k * (TN / 4) + (n4 % TN) / 4) * COLS + n4 / TN] = load_float4(&B[k * N + n4]);
    }
    __syncthreads();
    A += BK;
    B += BK * N;

#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
      for (int t = 0; t < TM; t += 4) {
        const float4 v = load_float4(&As[kk * AS_STRIDE + thread_row * TM + t]);
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
