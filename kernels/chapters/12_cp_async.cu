// 12 asynchronous copies: a multi-stage cp.async pipeline from global to shared memory.
//
// What changed from 11:
// - Tiles move global -> shared with cp.async (16 bytes per instruction, LDGSTS in SASS): no
//   staging registers, no wait in the thread that issued them. STAGES tiles are in flight: while
//   the warps compute on tile t, tiles t+1 .. t+STAGES-1 are landing. One barrier per K step.
// - cp.async copies bytes as they are, so A can no longer be transposed on the way in. A stays
//   row-major in shared memory (As[m][k], rows padded by one float4) and a lane reads 4
//   consecutive k of one row with one LDS.128, covering 4 K steps: per 4 K steps a lane still
//   issues WMITER*TM loads of A, as with the transposed tile. A lane's TM rows are interleaved
//   with the other lane rows (row = t * LANE_ROWS + lane_row), so one load instruction reads
//   LANE_ROWS consecutive rows; with a row stride of BK + 4 floats ((BK + 4) / 4 odd) they fall
//   in distinct banks.
// Predicted effect: the copy latency leaves the critical path entirely; fewer registers than 11
// (no staging), so more accumulators or more blocks per SM.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK, STAGES stages in flight
//   warp tile   WM x WN = (WMITER x WSUBM) x (WNITER x WSUBN) sub-tiles
//   thread tile TM x TN per sub-tile, WMITER*TM x WNITER*TN accumulators; fragments: TM of A,
//               TN of B per k and sub-tile
// Needs M % BM == 0, N % BN == 0, K % BK == 0, and N, K multiples of 4 (16-byte alignment).
#include "../include/common.cuh"
#include "../include/cp_async.cuh"

template <int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int THREADS,
          int STAGES>
__global__ void __launch_bounds__(THREADS)
sgemm_cp_async(int M, int N, int K, float alpha, const float* __restrict__ A,
               const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int WMITER = (WM * WN) / (32 * TM * TN * WNITER);
  constexpr int WSUBM = WM / WMITER;
  constexpr int WSUBN = WN / WNITER;
  constexpr int LANE_COLS = WSUBN / TN;
  constexpr int LANE_ROWS = WSUBM / TM;
  constexpr int AS_STRIDE = BK + 4;                    // row-major A, one float4 of padding
  constexpr int AS_SIZE = BM * AS_STRIDE;
  constexpr int BS_SIZE = BK * BN;
  constexpr int A_COPIES = BM * BK / 4 / THREADS;      // 16-byte copies per thread per tile
  constexpr int B_COPIES = BK * BN / 4 / THREADS;
  extern __shared__ __align__(16) float smem[];        // STAGES x (A tile, B tile)

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warp_row = warp / (BN / WN);
  const int warp_col = warp % (BN / WN);
  const int lane_row = lane / LANE_COLS;
  const int lane_col = lane % LANE_COLS;

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += (blockIdx.y * BM + warp_row * WM) * N + blockIdx.x * BN + warp_col * WN;

  auto copy_tile = [&](int stage, int k0) {
    float* as = smem + stage * (AS_SIZE + BS_SIZE);
    float* bs = as + AS_SIZE;
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l) {
      const int i = threadIdx.x + l * THREADS;
      const int m = i / (BK / 4);
      const int k4 = (i % (BK / 4)) * 4;
      cp_async_16(&as[m * AS_STRIDE + k4], &A[m * K + k0 + k4], 16);
    }
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      const int i = threadIdx.x + l * THREADS;
      const int k = i / (BN / 4);
      const int n4 = (i % (BN / 4)) * 4;
      cp_async_16(&bs[k * BN + n4], &B[(k0 + k) * N + n4], 16);
    }
  };

  const int k_tiles = K / BK;
  // Prologue: STAGES - 1 tiles in flight. Every step commits one group (possibly empty), so
  // "tile t has landed" is always "at most STAGES - 2 groups pending".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) copy_tile(s, s * BK);
    cp_async_commit();
  }

  float acc[WMITER * TM * WNITER * TN] = {0.0f};
  for (int t = 0; t < k_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile t is visible to all; everyone is done with tile t - 1's stage
    const int next = t + STAGES - 1;
    if (next < k_tiles) copy_tile(next % STAGES, next * BK);
    cp_async_commit();

    const float* as = smem + (t % STAGES) * (AS_SIZE + BS_SIZE) + warp_row * WM * AS_STRIDE;
    const float* bs = smem + (t % STAGES) * (AS_SIZE + BS_SIZE) + AS_SIZE + warp_col * WN;
#pragma unroll
    for (int kc = 0; kc < BK; kc += 4) {
      float4 reg_a[WMITER * TM];  // 4 consecutive k of each of the lane's rows
#pragma unroll
      for (int i = 0; i < WMITER; ++i) {
#pragma unroll
        for (int r = 0; r < TM; ++r) {
          reg_a[i * TM + r] =
              load_float4(&as[(i * WSUBM + r * LANE_ROWS + lane_row) * AS_STRIDE + kc]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float reg_b[WNITER * TN];
#pragma unroll
        for (int j = 0; j < WNITER; ++j) {
#pragma unroll
          for (int c = 0; c < TN; c += 4) {
            const float4 v =
                load_float4(&bs[(kc + kk) * BN + j * WSUBN + (c / 4 * LANE_COLS + lane_col) * 4]);
            reg_b[j * TN + c] = v.x; reg_b[j * TN + c + 1] = v.y;
            reg_b[j * TN + c + 2] = v.z; reg_b[j * TN + c + 3] = v.w;
          }
        }
#pragma unroll
        for (int r = 0; r < WMITER * TM; ++r) {
          const float a = component(reg_a[r], kk);
#pragma unroll
          for (int c = 0; c < WNITER * TN; ++c) acc[r * WNITER * TN + c] += a * reg_b[c];
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < WMITER; ++i) {
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const int row = i * WSUBM + r * LANE_ROWS + lane_row;
#pragma unroll
      for (int j = 0; j < WNITER; ++j) {
#pragma unroll
        for (int c = 0; c < TN; c += 4) {
          store_axpby4(&C[row * N + j * WSUBN + (c / 4 * LANE_COLS + lane_col) * 4],
                       &acc[(i * TM + r) * WNITER * TN + j * TN + c], alpha, beta);
        }
      }
    }
  }
}
