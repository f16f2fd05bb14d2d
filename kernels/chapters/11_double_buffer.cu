// 11 double buffering: two shared-memory tiles, the next one loaded while this one is used.
//
// What changed from 10:
// - Two copies of the A and B tiles in shared memory. While the warps compute on tile t, each
//   thread has already issued its global loads of tile t + 1 into registers (float4s); after
//   the compute it writes them to the other buffer. The load latency is hidden behind a whole
//   tile of FFMAs instead of being waited out by the block, and one __syncthreads per K step is
//   enough (10 needed two).
// - The price: twice the shared memory, and A_LOADS + B_LOADS float4 staging registers per thread.
// Predicted effect: modest where occupancy already hides latency (the worklog's double-buffered
// kernel gained a few percent); it matters more with one block per SM.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK, two stages
//   warp tile   WM x WN = (WMITER x WSUBM) x (WNITER x WSUBN) sub-tiles
//   thread tile TM x TN per sub-tile, WMITER*TM x WNITER*TN accumulators; fragments: TM of A,
//               TN of B per k and sub-tile
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"

template <int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int THREADS>
__global__ void __launch_bounds__(THREADS)
sgemm_double_buffer(int M, int N, int K, float alpha, const float* __restrict__ A,
                 const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int WMITER = (WM * WN) / (32 * TM * TN * WNITER);
  constexpr int WSUBM = WM / WMITER;
  constexpr int WSUBN = WN / WNITER;
  constexpr int LANE_COLS = WSUBN / TN;          // lanes across a sub-tile
  constexpr int LANE_ROWS = WSUBM / TM;          // lanes down a sub-tile
  constexpr int AS_STRIDE = BM + 4;              // 08's padded, transposed A
  constexpr int A_LOADS = BM * BK / 4 / THREADS;   // float4s of A per thread per tile
  constexpr int B_LOADS = BK * BN / 4 / THREADS;
  __shared__ __align__(16) float As[2][BK * AS_STRIDE];
  __shared__ __align__(16) float Bs[2][BK * BN];

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
  float4 staged_a[A_LOADS];
  float4 staged_b[B_LOADS];
  // global -> registers (tile starting at A, B) and registers -> shared buffer `buf`
  auto load_tile = [&]() {
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) {
      const int i = threadIdx.x + l * THREADS;
      staged_a[l] = load_float4(&A[(i / (BK / 4)) * K + (i % (BK / 4)) * 4]);
    }
#pragma unroll
    for (int l = 0; l < B_LOADS; ++l) {
      const int i = threadIdx.x + l * THREADS;
      staged_b[l] = load_float4(&B[(i / (BN / 4)) * N + (i % (BN / 4)) * 4]);
    }
  };
  auto store_tile = [&](int buf) {
#pragma unroll
    for (int l = 0; l < A_LOADS; ++l) {
      const int i = threadIdx.x + l * THREADS;
      const int m = i / (BK / 4);
      const int k4 = (i % (BK / 4)) * 4;
      As[buf][(k4 + 0) * AS_STRIDE + m] = staged_a[l].x;
      As[buf][(k4 + 1) * AS_STRIDE + m] = staged_a[l].y;
      As[buf][(k4 + 2) * AS_STRIDE + m] = staged_a[l].z;
      As[buf][(k4 + 3) * AS_STRIDE + m] = staged_a[l].w;
    }
#pragma unroll
    for (int l = 0; l < B_LOADS; ++l) {
      const int i = threadIdx.x + l * THREADS;
      store_float4(&Bs[buf][(i / (BN / 4)) * BN + (i % (BN / 4)) * 4], staged_b[l]);
    }
  };

  load_tile();
  store_tile(0);
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += BK) {
    const int buf = (k0 / BK) & 1;
    const bool more = k0 + BK < K;
    if (more) {  // issue the next tile's loads now; they land while this tile is computed
      A += BK;
      B += BK * N;
      load_tile();
    }
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
      for (int i = 0; i < WMITER; ++i) {
#pragma unroll
        for (int t = 0; t < TM; t += 4) {
          const float4 v = load_float4(&As[buf][kk * AS_STRIDE + warp_row * WM + i * WSUBM +
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
              &Bs[buf][kk * BN + warp_col * WN + j * WSUBN + (t / 4 * LANE_COLS + lane_col) * 4]);
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
    if (more) store_tile(buf ^ 1);  // buffer buf ^ 1 was last read before the previous barrier
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
