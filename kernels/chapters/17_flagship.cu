// 17 flagship: 12's pipeline for any shape, with L2-friendly tile order and split-K.
//
// What changed from 12:
// - Any M, N, K. Edge tiles are predicated, not refused: a cp.async whose source lies outside
//   A or B copies 0 bytes and zero-fills its 16 (or 4) bytes of shared memory, so edge tiles
//   compute on zeros, and the epilogue stores only the elements inside C. When N or K is not a
//   multiple of 4, rows of A or B are not 16-byte aligned: the VEC = 1 instantiation copies
//   4-byte elements and stores scalars (the runner picks VEC from the shape).
// - Tile order (rasterization): the grid is one-dimensional and consecutive blocks walk a
//   column of GROUP_M block rows before moving right, so the blocks resident at one time share
//   a few rows of A and columns of B in L2 instead of streaming all of B once per block row.
// - Split-K: with SPLIT_K > 1 the K range is cut into SPLIT_K slices computed by different
//   blocks, which fills the SMs when M x N has too few tiles (1024^2 has 64 tiles of 128 x 128
//   for 132 SMs). Every block writes its partial tile to a workspace, counts itself in on a
//   per-tile ticket, and the last one to arrive sums the slices in slice order (so the result
//   does not depend on arrival order), applies alpha and beta, and resets the ticket.
// - MIN_BLOCKS: __launch_bounds__(THREADS, MIN_BLOCKS) caps registers so that many blocks fit
//   on an SM, a tuning knob between occupancy and accumulators.
// Predicted effect: at 4096 and 8192 12's speed minus a little for the predicates; the tile
// order helps most at 8192, where B (256 MB) is far larger than L2; split-K is for 1024.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN (K in SPLIT_K K slices), k tiles of BK, STAGES stages in flight
//   warp tile   WM x WN = (WMITER x WSUBM) x (WNITER x WSUBN) sub-tiles
//   thread tile TM x TN per sub-tile, WMITER*TM x WNITER*TN accumulators; fragments: TM of A
//               (read KA k at a time) and TN of B per k and sub-tile
#include "../include/common.cuh"
#include "../include/cp_async.cuh"
#include "../include/tile_order.cuh"
#include "../include/split_k.cuh"

// The thread tile's outer product for one k: acc[r][c] += frag_a[r][kk] * frag_b[c], R rows and
// CN columns. The order of the FFMAs as written (the compiler keeps most of it) decides which
// operand consecutive FFMAs share (the operand reuse cache) and so how often three source
// registers collide in one register bank (a dispatch stall).
template <int R, int CN, int KA, int FMA_ORDER>
__device__ __forceinline__ void outer_product(float* acc, const float (&frag_a)[R][KA], int kk,
                                              const float* frag_b) {
  // R = WM * WN / (32 * WNITER * TN) is even for every tile the constraints admit
  static_assert(FMA_ORDER != 4 || R % 2 == 0, "zig-zag row pairs need an even row count");
  if (FMA_ORDER == 2) {  // column by column: the B value is shared
#pragma unroll
    for (int c = 0; c < CN; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r * CN + c] += frag_a[r][kk] * frag_b[c];
  } else if (FMA_ORDER == 4) {  // row pairs, zig-zag: (r,c) (r+1,c) (r+1,c+1) (r,c+1) ...
                                // every FFMA shares A or B with the one before it
#pragma unroll
    for (int r = 0; r < R; r += 2)
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int first = (c & 1) ? r + 1 : r;
        acc[first * CN + c] += frag_a[first][kk] * frag_b[c];
        acc[(2 * r + 1 - first) * CN + c] += frag_a[2 * r + 1 - first][kk] * frag_b[c];
      }
  } else {  // row by row (1), or serpentine (3): the A value is shared, and with 3 also
            // the B value at each turn
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int cc = 0; cc < CN; ++cc) {
        const int c = (FMA_ORDER == 3 && (r & 1)) ? CN - 1 - cc : cc;
        acc[r * CN + c] += frag_a[r][kk] * frag_b[c];
      }
  }
}

// The A fragments of KA consecutive k: for each of the lane's WMITER * TM rows of the warp tile,
// one LDS.128 (KA = 4) or LDS.64 (KA = 2) at `as` (the warp tile's first row, at the first k).
template <int WMITER, int TM, int WSUBM, int LANE_ROWS, int AS_STRIDE, int KA>
__device__ __forceinline__ void load_a_fragments(float (&reg_a)[WMITER * TM][KA], const float* as,
                                                 int lane_row) {
#pragma unroll
  for (int i = 0; i < WMITER; ++i) {
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const float* src = &as[(i * WSUBM + r * LANE_ROWS + lane_row) * AS_STRIDE];
      if (KA == 4) {
        const float4 v = load_float4(src);
        reg_a[i * TM + r][0] = v.x; reg_a[i * TM + r][1] = v.y;
        reg_a[i * TM + r][KA > 2 ? 2 : 0] = v.z; reg_a[i * TM + r][KA > 3 ? 3 : 0] = v.w;
      } else {
        const float2 v = *reinterpret_cast<const float2*>(src);
        reg_a[i * TM + r][0] = v.x; reg_a[i * TM + r][1] = v.y;
      }
    }
  }
}

// The B fragments of one k: the lane's WNITER * TN columns of the warp tile as float4s (LDS.128)
// from `bs` (the warp tile's first column, at that k).
template <int WNITER, int TN, int WSUBN, int LANE_COLS>
__device__ __forceinline__ void load_b_fragments(float (&reg_b)[WNITER * TN], const float* bs,
                                                 int lane_col) {
#pragma unroll
  for (int j = 0; j < WNITER; ++j) {
#pragma unroll
    for (int c = 0; c < TN; c += 4) {
      const float4 v = load_float4(&bs[j * WSUBN + (c / 4 * LANE_COLS + lane_col) * 4]);
      reg_b[j * TN + c] = v.x; reg_b[j * TN + c + 1] = v.y;
      reg_b[j * TN + c + 2] = v.z; reg_b[j * TN + c + 3] = v.w;
    }
  }
}

// The epilogue for one float4 of accumulators v at (row, col) of C: C = alpha * v + beta * C,
// inside C only (VEC = 1: N need not be a multiple of 4, so element by element).
template <int VEC>
__device__ __forceinline__ void store_fragment(float* C, int M, int N, int row, int col,
                                               const float* v, float alpha, float beta) {
  if (row >= M) return;
  if (VEC == 4) {
    if (col < N) store_axpby4(&C[row * N + col], v, alpha, beta);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col + e < N) store_axpby(&C[row * N + col + e], v[e], alpha, beta);
  }
}

template <int BM, int BN, int BK, int WM, int WN, int WNITER, int TM, int TN, int THREADS,
          int STAGES, int GROUP_M, int SPLIT_K, int VEC, int MIN_BLOCKS, int KA, int FMA_ORDER>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
sgemm_flagship(int M, int N, int K, float alpha, const float* __restrict__ A,
               const float* __restrict__ B, float beta, float* __restrict__ C,
               float* __restrict__ workspace) {
  constexpr int WMITER = (WM * WN) / (32 * TM * TN * WNITER);
  constexpr int WSUBM = WM / WMITER;
  constexpr int WSUBN = WN / WNITER;
  constexpr int LANE_COLS = WSUBN / TN;
  constexpr int LANE_ROWS = WSUBM / TM;
  constexpr int AS_STRIDE = BK + 4;
  constexpr int AS_SIZE = BM * AS_STRIDE;
  constexpr int BS_SIZE = BK * BN;
  constexpr int A_COPIES = BM * BK / VEC / THREADS;   // copies per thread per tile
  constexpr int B_COPIES = BK * BN / VEC / THREADS;
  extern __shared__ __align__(16) float smem[];

  // --- which tile and K slice this block computes
  const BlockTile at = grouped_block_tile<BM, BN, GROUP_M>(M, N);
  const int slice = at.slice, tile_m = at.tile_m, tile_n = at.tile_n;

  const KSlice ks = k_slice<BK, SPLIT_K>(K, slice);
  const int k_tile_begin = ks.k_tile_begin, k_tiles = ks.k_tiles;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warp_row = warp / (BN / WN);
  const int warp_col = warp % (BN / WN);
  const int lane_row = lane / LANE_COLS;
  const int lane_col = lane % LANE_COLS;
  const int block_row = tile_m * BM;
  const int block_col = tile_n * BN;

  // --- global -> shared, predicated: out-of-range sources copy 0 bytes (zero fill). Each thread's
  // source rows (A) and columns (B) are fixed for the whole K loop: their pointers and in-range
  // flags are computed once, and only the K edge is tested per tile.
  // Element offsets (32-bit: the runner requires each matrix to have < 2^31 elements) of the
  // thread's first copy source, and its in-range flags; only the K edge is tested per tile.
  int a_off[A_COPIES], b_off[B_COPIES];
  unsigned a_row_ok = 0, b_col_ok = 0;  // one bit per copy
#pragma unroll
  for (int l = 0; l < A_COPIES; ++l) {
    const int i = threadIdx.x + l * THREADS;
    const int m = i / (BK / VEC), kv = (i % (BK / VEC)) * VEC;
    const bool ok = block_row + m < M;
    a_row_ok |= unsigned(ok) << l;
    a_off[l] = (ok ? (block_row + m) * K : 0) + k_tile_begin * BK + kv;
  }
#pragma unroll
  for (int l = 0; l < B_COPIES; ++l) {
    const int i = threadIdx.x + l * THREADS;
    const int k = i / (BN / VEC), nv = (i % (BN / VEC)) * VEC;
    const bool ok = block_col + nv < N;
    b_col_ok |= unsigned(ok) << l;
    b_off[l] = (k_tile_begin * BK + k) * N + (ok ? block_col + nv : 0);
  }
  auto copy_tile = [&](int stage, int kt) {
    float* as = smem + stage * (AS_SIZE + BS_SIZE);
    float* bs = as + AS_SIZE;
    const int k_left = K - (k_tile_begin + kt) * BK;  // valid k in this tile: [0, k_left)
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l) {
      const int i = threadIdx.x + l * THREADS;
      const int m = i / (BK / VEC), kv = (i % (BK / VEC)) * VEC;
      const bool inside = ((a_row_ok >> l) & 1) && kv < k_left;
      const float* src = A + (inside ? a_off[l] + kt * BK : 0);
      if (VEC == 4) cp_async_16(&as[m * AS_STRIDE + kv], src, inside ? 16 : 0);
      else cp_async_4(&as[m * AS_STRIDE + kv], src, inside ? 4 : 0);
    }
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      const int i = threadIdx.x + l * THREADS;
      const int k = i / (BN / VEC), nv = (i % (BN / VEC)) * VEC;
      const bool inside = ((b_col_ok >> l) & 1) && k < k_left;
      const float* src = B + (inside ? b_off[l] + kt * BK * N : 0);
      if (VEC == 4) cp_async_16(&bs[k * BN + nv], src, inside ? 16 : 0);
      else cp_async_4(&bs[k * BN + nv], src, inside ? 4 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) copy_tile(s, s);
    cp_async_commit();
  }

  float acc[WMITER * TM * WNITER * TN] = {0.0f};
  for (int t = 0; t < k_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = t + STAGES - 1;
    if (next < k_tiles) copy_tile(next % STAGES, next);
    cp_async_commit();

    const float* as = smem + (t % STAGES) * (AS_SIZE + BS_SIZE) + warp_row * WM * AS_STRIDE;
    const float* bs = smem + (t % STAGES) * (AS_SIZE + BS_SIZE) + AS_SIZE + warp_col * WN;
#pragma unroll
    for (int kc = 0; kc < BK; kc += KA) {
      // KA consecutive k of each of the lane's rows of A: one LDS.128 (KA = 4) or LDS.64 (KA = 2)
      // per row. KA = 2 halves the registers that hold A, at twice the A load instructions.
      float reg_a[WMITER * TM][KA];
      load_a_fragments<WMITER, TM, WSUBM, LANE_ROWS, AS_STRIDE, KA>(reg_a, as + kc, lane_row);
#pragma unroll
      for (int kk = 0; kk < KA; ++kk) {
        float reg_b[WNITER * TN];
        load_b_fragments<WNITER, TN, WSUBN, LANE_COLS>(reg_b, bs + (kc + kk) * BN, lane_col);
        outer_product<WMITER * TM, WNITER * TN, KA, FMA_ORDER>(acc, reg_a, kk, reg_b);
      }
    }
  }
  cp_async_wait<0>();

  // The thread's accumulators as float4 fragments, with their row and column in the block tile:
  // the split-K exchange and the epilogue walk them in the same order.
  auto for_each_fragment = [&](auto&& visit) {
#pragma unroll
    for (int i = 0; i < WMITER; ++i)
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int j = 0; j < WNITER; ++j)
#pragma unroll
          for (int c = 0; c < TN; c += 4)
            visit(warp_row * WM + i * WSUBM + r * LANE_ROWS + lane_row,
                  warp_col * WN + j * WSUBN + (c / 4 * LANE_COLS + lane_col) * 4,
                  &acc[(i * TM + r) * WNITER * TN + j * TN + c]);
  };

  // --- split-K: the last slice to arrive at this tile adds the others' partials, in slice order
  if (SPLIT_K > 1 && !split_k_reduce<SPLIT_K, BM, BN>(workspace, at, for_each_fragment)) return;

  // --- epilogue: C = alpha * acc + beta * C, inside C only
  for_each_fragment([&](int tile_row, int tile_col, float* v) {
    store_fragment<VEC>(C, M, N, block_row + tile_row, block_col + tile_col, v, alpha, beta);
  });
}
