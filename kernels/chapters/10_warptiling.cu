// 10 warptiling: a warp tile between the block tile and the thread tile.
//
// What changed from 09:
// - The block's warps each own a WM x WN warp tile of C. Inside it a warp walks WMITER x WNITER
//   sub-tiles of WSUBM x WSUBN, and in each sub-tile its 32 lanes own a TM x TN thread tile.
//   A lane's values of A (and of B) for one k are then shared with the few lanes in the same
//   lane row (column): a warp's LDS.128 touches at most WSUBM/TM (WSUBN/TN) distinct float4s,
//   served as broadcasts. A lane's TM rows (TN columns) are float4 groups interleaved with the
//   other lanes' (group g of lane row r starts at row 4 * (g * LANE_ROWS + r)), so those distinct
//   float4s are contiguous: one wavefront per shared load instruction, no bank conflict.
// - The block's thread count is a parameter (THREADS = 32 x warps), decoupled from the thread
//   tile: fewer, fatter threads and more accumulators per thread.
// - Shared-memory layouts from 08: A transposed with a float4 pad per row, B as in memory (the
//   warp tile's B reads are already contiguous runs, so 07's linearization is not needed).
// Predicted effect: the worklog's largest single step after vectorizing (A6000: 19.7 -> 21.7
// TFLOP/s after tuning; seed 003 on a GH200: 31.4 -> 41.5 TFLOP/s, 83% of cuBLAS).
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK
//   warp tile   WM x WN = (WMITER x WSUBM) x (WNITER x WSUBN) sub-tiles
//   thread tile TM x TN per sub-tile, WMITER*TM x WNITER*TN accumulators; fragments: TM of A,
//               TN of B per k and sub-tile
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"

template <int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int THREADS>
__global__ void __launch_bounds__(THREADS)
sgemm_warptiling(int M, int N, int K, float alpha, const float* __restrict__ A,
                 const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int WMITER = (WM * WN) / (32 * TM * TN * WNITER);
  constexpr int WSUBM = WM / WMITER;
  constexpr int WSUBN = WN / WNITER;
  constexpr int LANE_COLS = WSUBN / TN;          // lanes across a sub-tile
  constexpr int LANE_ROWS = WSUBM / TM;          // lanes down a sub-tile
  constexpr int AS_STRIDE = BM + 4;              // 08's padded, transposed A
  __shared__ __align__(16) float As[BK * AS_STRIDE];
  __shared__ __align__(16) float Bs[BK * BN];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warp_row = warp / (BN / WN);
  const int warp_col = warp % (BN / WN);
  const int lane_row = lane / LANE_COLS;
  const int lane_col = lane % LANE_COLS;

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += (blockIdx.y * BM + warp_row * WM) * N + blockIdx.x * BN + warp_col * WN;

  float acc[WMITER * TM * WNITER * TN] = {0.0f};
  float reg_a[WMITER * TM];
  float reg_b[WNITER * TN];
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
      store_float4(&Bs[k * BN + n4], load_float4(&B[k * N + n4]));
    }
    __syncthreads();
    A += BK;
    B += BK * N;

#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
      for (int i = 0; i < WMITER; ++i) {
#pragma unroll
        for (int t = 0; t < TM; t += 4) {
          const float4 v = load_float4(&As[kk * AS_STRIDE + warp_row * WM + i * WSUBM +
                                           (t / 4 * LANE_ROWS + lane_row) * 4]);
          reg_a[i * TM + t] = v.x; reg_a[i * TM + t + 1] = v.y;
          reg_a[i * TM + t + 2] = v.z; reg_a[i * TM + t + 3] = v.w;
        }
      }
#pragma unroll
      for (int j = 0; j < WNITER; ++j) {
#pragma unroll
        for (int t = 0; t < TN; t += 4) {
          const float4 v = load_float4(
              &Bs[kk * BN + warp_col * WN + j * WSUBN + (t / 4 * LANE_COLS + lane_col) * 4]);
          reg_b[j * TN + t] = v.x; reg_b[j * TN + t + 1] = v.y;
          reg_b[j * TN + t + 2] = v.z; reg_b[j * TN + t + 3] = v.w;
        }
      }
#pragma unroll
      for (int r = 0; r < WMITER * TM; ++r) {
#pragma unroll
        for (int c = 0; c < WNITER * TN; ++c) acc[r * WNITER * TN + c] += reg_a[r] * reg_b[c];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < WMITER; ++i) {
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
      const int row = i * WSUBM + (tm / 4 * LANE_ROWS + lane_row) * 4 + tm % 4;
#pragma unroll
      for (int j = 0; j < WNITER; ++j) {
#pragma unroll
        for (int tn = 0; tn < TN; tn += 4) {
          store_axpby4(&C[row * N + j * WSUBN + (tn / 4 * LANE_COLS + lane_col) * 4],
                       &acc[(i * TM + tm) * WNITER * TN + j * TN + tn], alpha, beta);
        }
      }
    }
  }
}
