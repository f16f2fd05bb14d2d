// 21 FFMA for Hopper: 17 rebuilt around what the profiler showed.
//
// What changed from 17, and why. Nsight Compute's per-instruction sampling put 17's gap to
// cuBLAS (87%) on its FFMAs, not on memory: ~14% of warp samples were dispatch stalls, against
// cuBLAS's 5%. 17's SASS shows why: with 16 A values per k read as LDS.64 pairs (two k at a
// time) and the loads hoisted across the unrolled loop, ptxas renames 60% of the accumulators on
// every FFMA (FFMA R180, R52, R56, R183), so register-bank collisions between the three sources
// are common. cuBLAS's kernel keeps every accumulator in place (FFMA R7, R132, R136, R7).
// - A is transposed on its way into shared memory (As[k][m]), by 4-byte cp.async copies; a warp
//   still reads whole row pieces of A. Both operands are then LDS.128 along m and n: per k a
//   thread loads TM / 4 + TN / 4 float4s (6 for 16 x 8) instead of 17's 10 loads.
// - The fragments of k + 1 load into a second register set while k's outer product runs; at the
//   last k of a tile the warps meet at the barrier and load the next tile's first fragments
//   before that outer product, so a tile change costs no shared-load latency.
// - Fragment loads use lds128<offset> (one address register per tile, the k offset in the
//   instruction): the compiler had been materializing one address per load.
// - Copies of interior tiles carry no predicates; edge tiles (and a slice's last K tile) zero-fill.
// - FMA_ORDER 3 walks the 16 x 8 outer product in serpentine rows; LOADS_FIRST 2 issues the next
//   tile's fragment loads ahead of that tile's copies.
// Measured effect (H200, benchmarks/variants.py, % of cuBLAS FP32 at 4096): the transposed A
// with double-buffered fragments alone 82-87%; predicate-free interior copies and the next
// tile's fragments loaded at the barrier 94%; lds128 offsets and loads ahead of copies 97%.
// 90% of the main loop's FFMAs keep their accumulator in place (17: 40%).
// Kept from 17: grouped tile order, split-K with a ticketed deterministic reduction, any M, N,
// K, alpha, beta (B's 16-byte copies need N % 4 == 0, else VEC = 1 copies 4-byte elements).
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN (K in SPLIT_K K slices), k tiles of BK, STAGES stages in flight
//   warp tile   WM x WN, lane grid (WM / TM) x (WN / TN)
//   thread tile TM x TN as (TM / 4) x (TN / 4) float4 groups, WM / TM * 4 rows (and WN / TN * 4
//               columns) apart; fragments: TM of A, TN of B per k, two register sets
#include "../include/common.cuh"
#include "../include/cp_async.cuh"
#include "../include/tile_order.cuh"
#include "../include/split_k.cuh"
#include "../include/ffma_stage.cuh"
#include "../include/ffma_thread_tile.cuh"

template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int THREADS, int STAGES,
          int GROUP_M, int SPLIT_K, int VEC, int MIN_BLOCKS, int FMA_ORDER, int LOADS_FIRST>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
sgemm_ffma(int M, int N, int K, float alpha, const float* __restrict__ A,
           const float* __restrict__ B, float beta, float* __restrict__ C,
           float* __restrict__ workspace) {
  constexpr int LANE_ROWS = WM / TM;            // lanes down a warp tile
  constexpr int LANE_COLS = WN / TN;            // lanes across it
  constexpr int AS_STRIDE = BM + 4;             // A transposed: As[k][m], one float4 of padding
  constexpr int AS_SIZE = BK * AS_STRIDE;
  constexpr int BS_SIZE = BK * BN;              // B as stored: Bs[k][n]
  static_assert(LANE_ROWS * LANE_COLS == 32, "a warp's lanes tile its warp tile");
  extern __shared__ __align__(16) float smem[];

  const BlockTile at = grouped_block_tile<BM, BN, GROUP_M>(M, N);
  const int slice = at.slice, tile_m = at.tile_m, tile_n = at.tile_n;

  const KSlice ks = k_slice<BK, SPLIT_K>(K, slice);
  const int k_tile_begin = ks.k_tile_begin, k_tiles = ks.k_tiles;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warp_m = (warp / (BN / WN)) * WM;
  const int warp_n = (warp % (BN / WN)) * WN;
  const int lane_row = lane / LANE_COLS;
  const int lane_col = lane % LANE_COLS;
  const int block_row = tile_m * BM;
  const int block_col = tile_n * BN;

  // Who copies what (copy_ffma_stage, ffma_stage.cuh). A (4-byte copies: A is transposed on the
  // way, As[k][m]): consecutive threads take consecutive k of a row, so one copy instruction
  // reads whole 4*BK-byte pieces of rows. B: B_LANES threads per k row, so one copy instruction
  // reads whole lines and a thread's B copies are one address plus constants.
  constexpr int B_LANES = THREADS / BK;                 // threads per k row of B
  const int a_m = threadIdx.x / BK, a_k = threadIdx.x % BK;
  const int b_k = threadIdx.x / B_LANES, b_n = (threadIdx.x % B_LANES) * VEC;
  const unsigned smem_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned a_dst = smem_base + 4 * (a_k * AS_STRIDE + a_m);
  const unsigned b_dst = smem_base + 4 * (AS_SIZE + b_k * BN + b_n);
  const bool interior = block_row + BM <= M && block_col + BN <= N;
  // Element indices (32-bit: the runner requires each matrix to have < 2^31 elements) of the
  // thread's first copies in the slice's first tile; K and N come from the constant bank, so the
  // per-copy and per-tile offsets cost no registers.
  const unsigned a_base = (block_row + a_m) * K + k_tile_begin * BK + a_k;
  const unsigned b_base = (k_tile_begin * BK + b_k) * N + block_col + b_n;
  constexpr unsigned STAGE_BYTES = 4 * (AS_SIZE + BS_SIZE);
  // Copies tile kt (of this slice) into the stage at byte offset `offset`.
  auto copy_tile = [&](unsigned offset, int kt) {
    copy_ffma_stage<BM, BN, BK, VEC, THREADS>(A, B, M, N, K, a_dst, b_dst, offset, a_base, b_base,
                                              kt, K - (k_tile_begin + kt) * BK, interior,
                                              block_row + a_m, a_k, block_col + b_n, b_k);
  };

  float acc[TM][TN];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;

  float frag_a[2][TM], frag_b[2][TN];
  // The lane's fragments of k step KK from the stage whose A tile starts at shared address
  // `stage_addr`: TM / 4 float4s of A (rows lane_row * 4 + g * LANE_ROWS * 4) and TN / 4 of B.
  const unsigned a_frag = 4 * (warp_m + lane_row * 4);
  const unsigned b_frag = 4 * (AS_SIZE + warp_n + lane_col * 4);
  auto load_fragments = [&](auto kk_const, int buf, unsigned stage_addr) {
    constexpr int KK = decltype(kk_const)::value;
    load_ffma_fragments<TM, TN, LANE_ROWS, LANE_COLS, 4 * KK * AS_STRIDE, 4 * KK * BN>(
        frag_a[buf], frag_b[buf], stage_addr + a_frag, stage_addr + b_frag);
  };
  // The thread tile's outer product for one k (FMA_ORDER: see ffma_thread_tile.cuh).
  auto outer_product = [&](int buf) { ffma_outer_product<FMA_ORDER>(acc, frag_a[buf], frag_b[buf]); };

  // Pipeline: all STAGES tiles in flight at the start. At the last k of tile t the warps wait
  // for tile t + 1, meet at the barrier (after which nobody reads tile t's stage again), refill
  // that stage with tile t + STAGES, and load tile t + 1's first fragments before the last outer
  // product of tile t, so the shared-load latency at a tile change hides behind 128 FFMAs.
  // `read` and `fill` (byte offsets of the stage being read and of the next to refill) live
  // across the loop.
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    if (s < k_tiles) copy_tile(s * STAGE_BYTES, s);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 1>();
  __syncthreads();
  unsigned read = 0;
  load_fragments(Int<0>{}, 0, smem_base + read);
  for (int t = 0; t < k_tiles; ++t) {
    static_for<0, BK>([&](auto kk_const) {
      constexpr int kk = decltype(kk_const)::value;
      if constexpr (kk + 1 < BK) {
        load_fragments(Int<kk + 1>{}, (kk + 1) & 1, smem_base + read);
      } else {
        if (t + 1 < k_tiles) {
          cp_async_wait<STAGES - 2>();
          __syncthreads();
          const unsigned done = read;
          read = read + STAGE_BYTES == STAGES * STAGE_BYTES ? 0 : read + STAGE_BYTES;
          if (LOADS_FIRST == 2) {  // tile t + 1's first fragments reach the shared-memory pipe ahead of the copies
            load_fragments(Int<0>{}, 0, smem_base + read);
            if (t + STAGES < k_tiles) copy_tile(done, t + STAGES);
          } else {
            if (t + STAGES < k_tiles) copy_tile(done, t + STAGES);
            load_fragments(Int<0>{}, 0, smem_base + read);
          }
          cp_async_commit();
        }
      }
      outer_product(kk & 1);
    });
  }
  cp_async_wait<0>();

  auto for_each_fragment = [&](auto&& visit) {
    for_each_ffma_fragment<LANE_ROWS, LANE_COLS>(acc, warp_m + lane_row * 4, warp_n + lane_col * 4, visit);
  };

  // --- split-K: the last slice to arrive at this tile adds the others' partials, in slice order
  if (SPLIT_K > 1 && !split_k_reduce<SPLIT_K, BM, BN>(workspace, at, for_each_fragment)) return;

  for_each_fragment([&](int tile_row, int tile_col, float* v) {
    const int row = block_row + tile_row, col = block_col + tile_col;
    if (row >= M) return;
    if (VEC == 4) {
      if (col < N) store_axpby4(&C[row * N + col], v, alpha, beta);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col + e < N) store_axpby(&C[row * N + col + e], v[e], alpha, beta);
    }
  });
}
