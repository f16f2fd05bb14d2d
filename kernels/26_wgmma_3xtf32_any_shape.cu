// 26 wgmma_3xtf32_any_shape: chapter 23's FP32-accurate 3xTF32 pipeline with chapter 25's
// answer to few tiles. 23 already runs any M, N, K (its pre-pass pads the rows it writes), but
// like 20 it gives each 128 x 128 tile one block over all of K, so a product with few tiles
// leaves most SMs idle: in the H100 shape suite (% of the stronger cuBLAS FP32) 128 x 4096 x 8192
// ran at 72% and 64 x 8192 x 4096 at 85%, and the shapes with even fewer tiles went to the FFMA
// chapters (22 at a small C: 333^3 66%, 512^3 72%, 511 x 513 x 8191 65%; 24 at 32 rows: 57%).
//
// What changed from 23 and why:
// - K slices, as in 25: with few tiles a tile's K range is cut into SLICES runs of k tiles, one
//   block each, the blocks of one cluster; each leaves its partial tile (the promoted FP32 total)
//   in its own idle stage ring, and block r adds up the r-th share of the tile's row groups from
//   every block in K order (k_slices.cuh, shared with 25). A 3xTF32 k tile costs three times a
//   TF32 one, so the add-up (one partial tile read per block) is a smaller share of the work
//   than in 25, and slices pay off from shorter K.
// - 64-row block tiles (wgmma m64n64k8 with the scale-d predicate, wgmma.cuh) for products with a
//   few dozen rows; a stage of 64 x 64 is 24 KiB (A_big, A_small, B), so 8 stages fit.
// - Promotion works per slice: each block's FP32 total holds its own slice's periods, and the
//   cluster's add-up is one more round-to-nearest addition per slice, in the same K order on
//   every run (deterministic, as 25).
// - The three products always go small ones first (23's ORDER 1, its measured default).
// Unchanged from 23: the pre-pass (split_tf32_operands), the three-tile producer and the
// consumer's K loop (B split in registers, promotion), now in tf32_split.cuh; the predicated
// any-N epilogue (wgmma_epilogue.cuh).
//
// Measured on the H100 (shape suite, alpha 0.5, beta 3, against the stronger of cuBLAS FP32 and
// autotuned cuBLASLt): 32 x 4096 x 4096 1.33x, 511 x 513 x 8191 1.28x, 512^3 1.20x, 64 x 8192 x
// 4096 1.56x, 4096^3 2.46x (23 and 26 in one variants run at 4096^3: 237% and 245% of cuBLAS
// FP32). Where A is the big operand (few columns, many rows) the split pre-pass, which writes A
// twice, costs more than the tensor cores save: 4096 x 64 x 4096 ran at 0.49x (22: 0.85x), so the
// dispatch left those shapes to 22; chapter 27 (A streamed once and split in registers, B
// pre-split instead) now runs every shape with M >= 2 N.
//
// Tile hierarchy as in 23: block tile BM x BN, k tiles of 32, STAGES stages of three tiles ->
// consumer warpgroup BM x 64 (wgmma m64nBMk8 on C^T = B^T A^T) -> warp 16 columns of C ->
// thread tile 2 columns x BM / 4 rows. K slice: a run of a tile's k tiles, one block each.
#include "common.cuh"
#include "mbarrier.cuh"
#include "warpgroup.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
#include "wgmma_epilogue.cuh"
#include "cluster.cuh"
#include "k_slices.cuh"
#include "tf32_split.cuh"

// The block: a tile's K slice (all of K when SLICES == 1) as in 23, then the cluster's slices
// added up as in 25.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__device__ __forceinline__ void run_block(int M, int N, int K, float alpha, float beta, float* C,
                                          const TensorMap* tmap_a_big,
                                          const TensorMap* tmap_a_small,
                                          const TensorMap* tmap_b) {
  constexpr int BK = 32;
  constexpr int CONSUMERS = BN / 64;
  constexpr int A_TILE = BM * BK * 4;                    // bytes of one A part per stage
  constexpr int B_BOX = BK * 32 * 4;                     // one TMA box of B: 32 k x 32 columns
  constexpr int STAGE = 2 * A_TILE + (BN / 32) * B_BOX;  // A_big, A_small, B
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 240;
  static_assert(SLICES == 1 || STAGES * STAGE >= BM * BN * 4,
                "the partial tile must fit in the stage ring it reuses");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  u64* full = reinterpret_cast<u64*>(smem + STAGES * STAGE);
  u64* empty = full + STAGES;

  // This block's tile and K slice (k_slices.cuh).
  const SliceOfTile work = slice_of_tile<BM, BN, BK, GROUP_M, SLICES>(M, N, K);
  const int m0 = work.m0, n0 = work.n0, slice = work.slice, kt0 = work.kt0, k_tiles = work.k_tiles;

  if (threadIdx.x == 0) init_stage_ring<STAGES, CONSUMERS>(full, empty);
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0)
      produce_split_k_tiles<BM, BN, STAGES>(smem, full, empty, tmap_a_big, tmap_a_small, tmap_b,
                                            m0, n0, kt0, k_tiles);
    if constexpr (SLICES > 1) {  // the producers meet the cluster's two barriers too
      __syncwarp();  // converged: the barrier is .aligned
      cluster_sync();
      cluster_sync();
    }
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  const int ct = threadIdx.x - 128;  // consumer thread, 0 .. 128 * CONSUMERS - 1
  const int c = ct / 128;
  const ConsumerLane place = consumer_lane(c);
  const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
  const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

  float d[BM / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
  float total[BM / 2];  // promotion: the FP32 sum of this slice's periods
  consume_split_k_tiles<BM, STAGE, 0, A_TILE, STAGES, IN_FLIGHT, 1, PROMOTE>(
      smem, full, empty, k_tiles, box, frag_lo, frag_hi, lane, d, total);

  const float* acc = PROMOTE > 0 ? total : d;
  const int n = n0 + box * 32 + 4 * chunk + 2 * (g & 1);
  if constexpr (SLICES == 1) {
    store_tile<BM>(acc, C, M, N, m0, n, t, alpha, beta);
  } else {
    constexpr int SHARE = BM / 8 / SLICES;
    float sum[4 * SHARE];
    add_k_slices<BM, 128 * CONSUMERS, SLICES>(acc, sum, smem, slice, ct);
    cluster_sync();  // every block has read its share of this block's partial
    store_row_groups<SHARE>(sum, C, M, N, m0 + 8 * SHARE * slice, n, t, alpha, beta);
  }
}

// One block per tile (SLICES == 1)...
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1)
    sgemm_wgmma_3xtf32_any_shape(int M, int N, int K, float alpha, const float* __restrict__ A,
                                 const float* __restrict__ B, float beta, float* __restrict__ C,
                                 float* __restrict__ workspace,
                                 const __grid_constant__ TensorMap tmap_a_big,
                                 const __grid_constant__ TensorMap tmap_a_small,
                                 const __grid_constant__ TensorMap tmap_b) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES>(M, N, K, alpha, beta, C,
                                                                 &tmap_a_big, &tmap_a_small,
                                                                 &tmap_b);
}

// ... or a cluster of SLICES blocks per tile, one K slice each.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1) __cluster_dims__(SLICES, 1, 1)
    sgemm_wgmma_3xtf32_any_shape_cluster(int M, int N, int K, float alpha,
                                         const float* __restrict__ A,
                                         const float* __restrict__ B, float beta,
                                         float* __restrict__ C, float* __restrict__ workspace,
                                         const __grid_constant__ TensorMap tmap_a_big,
                                         const __grid_constant__ TensorMap tmap_a_small,
                                         const __grid_constant__ TensorMap tmap_b) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES>(M, N, K, alpha, beta, C,
                                                                 &tmap_a_big, &tmap_a_small,
                                                                 &tmap_b);
}
