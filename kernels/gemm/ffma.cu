// gemm/ffma.cu: the library's block-tiled FP32 (FFMA) kernel, for the products the tensor-core
// kernels serve worst: tiny ones (every dimension a few hundred or less), where one launch and
// one memory round trip are the cost, and narrow ones (a side of C a few dozen, K long), where
// a 64- or 128-wide MMA tile wastes most of its work. Chapter 21 teaches the FFMA block tile
// this builds on; what differs is what small products need:
// - Tiles as small as 32 x 32 (two warps), so a small C still spreads over many SMs.
// - K slices from the shape at run time (grid.y, from conf/kernel/gemm_ffma.yaml's rule: about
//   blocks_per_sm blocks per SM, each slice at least min_slice_k long), not a compile-time
//   split: one build serves every K, and a tiny product is one block per tile, one launch, no
//   workspace. The last slice to arrive adds the partials in K order (grid_slices.cuh), so the
//   result does not depend on the order the slices finish in.
// - A plain multistage pipeline: STAGES - 1 k tiles in flight from the start (a tiny K is one
//   memory round trip), one register set of fragments per k (ptxas schedules the LDS.128s of
//   the unrolled k loop ahead of their FFMAs).
// - PREFETCH_C (c_read 2): with one K slice and beta != 0, C's old values are read right after
//   the first k tiles' copies go out, so that round trip overlaps theirs; after a tiny K loop
//   the epilogue then only stores (on an H100 an L2 flush added about 3 us to a 57 x 38 x 46
//   launch of 5.7 us: its cold round trips, the C read one of them).
// Any M, N, K, alpha, beta; B's 16-byte copies and C's float4 stores need N % 4 == 0 (VEC 4),
// else 4-byte ones (VEC 1). Element indices are 32-bit: the runner requires each matrix to
// hold fewer than 2^31 elements.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, one K slice (grid.y) in k tiles of BK, STAGES stages
//   warp tile   WM x WN, lane grid (WM / TM) x (WN / TN)
//   thread tile TM x TN as (TM / 4) x (TN / 4) float4 groups (ffma_thread_tile.cuh)
#include "../include/common.cuh"
#include "../include/cp_async.cuh"
#include "../include/grid_slices.cuh"
#include "../include/ffma_stage.cuh"
#include "../include/ffma_thread_tile.cuh"
#include "../include/tile_store.cuh"

// __launch_bounds__ names 1 block per SM as the minimum: without it ptxas held some tiles (64 x
// 128, 32 x 128) at 72 or 128 registers and spilled 16-36 bytes; with it none spills (offline
// build, every tile of conf/tune/gemm_ffma.yaml).
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int THREADS, int STAGES, int VEC,
          int PREFETCH_C>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_ffma(int M, int N, int K, float alpha, const float* __restrict__ A,
              const float* __restrict__ B, float beta, float* __restrict__ C,
              float* __restrict__ workspace) {
  constexpr int LANE_ROWS = WM / TM, LANE_COLS = WN / TN;
  constexpr int AS_STRIDE = BM + 4;  // A transposed, As[k][m], a float4 of padding a row
  constexpr int AS_SIZE = BK * AS_STRIDE, BS_SIZE = BK * BN;
  constexpr unsigned STAGE_BYTES = 4 * (AS_SIZE + BS_SIZE);
  static_assert(LANE_ROWS * LANE_COLS == 32, "a warp's lanes tile its warp tile");
  static_assert(THREADS == 32 * (BM / WM) * (BN / WN), "one warp per warp tile");
  extern __shared__ __align__(16) float smem[];

  const GridSlice at = grid_slice<BM, BN, BK>(N, K);  // the tile (grid.x), the K slice (grid.y)
  const int block_row = at.block_row, block_col = at.block_col, kt0 = at.kt0, k_tiles = at.k_tiles;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = (warp / (BN / WN)) * WM, warp_n = (warp % (BN / WN)) * WN;
  const int lane_row = lane / LANE_COLS, lane_col = lane % LANE_COLS;

  // Copies (ffma_stage.cuh): BK consecutive threads take a row piece of A, THREADS / BK threads
  // a k row of B; edge tiles zero-fill.
  constexpr int B_LANES = THREADS / BK;
  const int a_m = threadIdx.x / BK, a_k = threadIdx.x % BK;
  const int b_k = threadIdx.x / B_LANES, b_n = (threadIdx.x % B_LANES) * VEC;
  const unsigned smem_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned a_dst = smem_base + 4 * (a_k * AS_STRIDE + a_m);
  const unsigned b_dst = smem_base + 4 * (AS_SIZE + b_k * BN + b_n);
  const bool interior = block_row + BM <= M && block_col + BN <= N;
  const unsigned a_base = (block_row + a_m) * K + kt0 * BK + a_k;
  const unsigned b_base = (kt0 * BK + b_k) * N + block_col + b_n;
  auto copy_tile = [&](int t) {  // the slice's k tile t into stage t % STAGES
    copy_ffma_stage<BM, BN, BK, VEC, THREADS>(A, B, M, N, K, a_dst, b_dst, (t % STAGES) * STAGE_BYTES,
                                              a_base, b_base, t, K - (kt0 + t) * BK, interior,
                                              block_row + a_m, a_k, block_col + b_n, b_k);
  };

  float acc[TM][TN], c_old[TM][TN];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;
  const int row0 = warp_m + lane_row * 4, col0 = warp_n + lane_col * 4;  // the lane's first float4
  const unsigned a_frag = smem_base + 4 * row0, b_frag = smem_base + 4 * (AS_SIZE + col0);

  // Prologue: STAGES - 1 tiles in flight. Each step then waits for its tile, meets the block
  // (after which nobody reads the stage the previous step used), refills that stage with the
  // tile STAGES - 1 ahead, and runs its BK outer products.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) copy_tile(s);
    cp_async_commit();
  }
  // PREFETCH_C, with one K slice and beta != 0: the lane's part of C is read now, its round trip
  // beside the operands' instead of after the last FFMA (a tiny product's time is its round
  // trips); the values wait in registers through the K loop.
  const bool c_ahead = PREFETCH_C && beta != 0.0f && gridDim.y == 1;
  if (c_ahead)
    for_each_ffma_fragment<LANE_ROWS, LANE_COLS>(c_old, row0, col0, [&](int r, int c, float* v) {
      load_c_group<VEC>(C, M, N, block_row + r, block_col + c, v);
    });
  for (int t = 0; t < k_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (t + STAGES - 1 < k_tiles) copy_tile(t + STAGES - 1);
    cp_async_commit();
    const unsigned stage = (t % STAGES) * STAGE_BYTES;
    static_for<0, BK>([&](auto kk_const) {
      constexpr int kk = decltype(kk_const)::value;
      float frag_a[TM], frag_b[TN];
      load_ffma_fragments<TM, TN, LANE_ROWS, LANE_COLS, 4 * kk * AS_STRIDE, 4 * kk * BN>(
          frag_a, frag_b, a_frag + stage, b_frag + stage);
      ffma_outer_product<3>(acc, frag_a, frag_b);
    });
  }
  cp_async_wait<0>();

  auto for_each_fragment = [&](auto&& visit) {
    for_each_ffma_fragment<LANE_ROWS, LANE_COLS>(acc, row0, col0, visit);
  };
  if (c_ahead) {  // one slice: no partials to add
#pragma unroll
    for (int g = 0; g < TM / 4; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int h = 0; h < TN / 4; ++h)  // for_each_ffma_fragment's walk, over both arrays
          store_axpby_group_ahead<VEC>(C, M, N, block_row + row0 + g * LANE_ROWS * 4 + e,
                                       block_col + col0 + h * LANE_COLS * 4, &acc[g * 4 + e][h * 4],
                                       &c_old[g * 4 + e][h * 4], alpha, beta);
    return;
  }
  if (!add_up_grid_slices<BM, BN>(workspace, for_each_fragment)) return;  // K slices: the last adds
  for_each_fragment([&](int tile_row, int tile_col, float* v) {
    store_axpby_group<VEC>(C, M, N, block_row + tile_row, block_col + tile_col, v, alpha, beta);
  });
}
