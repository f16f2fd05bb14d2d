// 06 vectorized memory access: float4 global and shared loads, A transposed in shared memory.
//
// What changed from 05:
// - Global loads of A and B and the read-modify-write of C use 16-byte float4 accesses
//   (LDG.E.128 / STG.E.128): a quarter of the load instructions.
// - A is stored *transposed* in shared memory (As[k][m]). In 05 a thread's TM elements of
//   A for one k were BK floats apart; transposed, they are contiguous, so the thread loads
//   them with TM/4 LDS.128 instead of TM LDS.32. B's TN elements were already contiguous.
//   The price is a scalar, transposing store of A into shared memory.
// Predicted effect: ~1.2x over 05 (seed 003: 25,933 -> 31,421 GFLOP/s, 63% of cuBLAS).
//
// Tile hierarchy: block tile = BM x BN of C, K walked in steps of BK;
//                 thread tile = TM x TN (THREADS = BM * BN / (TM * TN)).
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__(BM * BN / (TM * TN))
sgemm_vectorize(int M, int N, int K, float alpha, const float* __restrict__ A,
                const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int THREADS = BM * BN / (TM * TN);
  __shared__ __align__(16) float As[BK * BM];  // transposed: As[k * BM + m]
  __shared__ __align__(16) float Bs[BK * BN];  // as in memory: Bs[k * BN + n]

  const int thread_col = threadIdx.x % (BN / TN);
  const int thread_row = threadIdx.x / (BN / TN);

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += blockIdx.y * BM * N + blockIdx.x * BN;

  float acc[TM * TN] = {0.0f};
  float reg_a[TM];
  float reg_b[TN];
  for (int k0 = 0; k0 < K; k0 += BK) {
    // A tile: BM rows of BK floats, read as float4 along k, scattered transposed.
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
    // B tile: BK rows of BN floats, copied as float4.
#pragma unroll
    for (int i = threadIdx.x; i < BK * BN / 4; i += THREADS) {
      const int k = i / (BN / 4);
      const int n4 = (i % (BN / 4)) * 4;
      store_float4(&Bs[k * BN + n4], load_float4(&B[k * N + n4]));
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
      for (int t = 0; t < TN; t += 4) {
        const float4 v = load_float4(&Bs[kk * BN + thread_col * TN + t]);
        reg_b[t] = v.x; reg_b[t + 1] = v.y; reg_b[t + 2] = v.z; reg_b[t + 3] = v.w;
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
