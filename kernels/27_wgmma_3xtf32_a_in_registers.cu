// 27 wgmma_3xtf32_a_in_registers: chapter 26's FP32-accurate 3xTF32 pipeline with the operands'
// roles swapped, for products whose big operand is A (few columns, many rows). 26, like 23 and
// 20, computes C^T = B^T A^T: wgmma reads A from shared memory, so A must be split into two TF32
// tiles before the main kernel, and the pre-pass reads A once and writes it twice (A_big,
// A_small). Where A is most of the bytes that costs more than the tensor cores save: in the H100
// shape suite 4096 x 64 x 4096 ran at 0.49x cuBLAS FP32 on 26, and the dispatch sent it to the
// FFMA chapter 22 (0.86x).
//
// What changed from 26 and why:
// - C = A B: wgmma m64nBNk8 takes A from registers and B^T from shared memory. A is streamed by
//   the TMA as it is, FP32, once, and each consumer lane splits its A fragments in registers
//   (split_a_fragments, tf32_split.cuh) as 26 splits its B^T fragments. The pre-pass now writes
//   B^T's two parts, B_big^T and B_small^T (N x K, rows padded to 4 floats): a transpose of the
//   small operand, because wgmma reads TF32 only K-major from shared memory.
// - The A fragments come out of the 128-byte-swizzled A tile by ldmatrix: read as 16-bit pairs,
//   an 8 x 8 matrix of ldmatrix is 8 rows of four FP32 values, and the value it hands lane
//   (g, t) is row g's t-th, which is the TF32 fragment layout. One ldmatrix.x4 per warp and 8 k
//   (26: two LDS.64 per lane).
// - A consumer warpgroup holds 64 rows of C and all BN columns (26: BM rows and 64 columns), so
//   the block tile is 64 x BN per consumer: bm = 64 or 128 (one or two consumers), bn = 64 or 128.
//   The accumulator is C's own layout (wgmma.cuh's D): the epilogue stores pairs of columns of
//   two rows (store_column_groups, wgmma_epilogue.cuh).
// - Rows of A that are not 16-byte aligned (K % 4 != 0) cannot be TMA tensors: the pre-pass then
//   also copies A with padded rows (once, where 26 writes it twice in every case).
// Unchanged from 26: K slices across a cluster with the partial tiles added up in K order
// (k_slices.cuh), promotion, the producer and the consumer's K loop (produce_split_k_tiles and
// consume_split_k_tiles, both with SPLIT_A), the small products first.
//
// Tile hierarchy: block tile BM x BN, k tiles of 32, STAGES stages of three tiles (A, B_big^T,
// B_small^T) -> consumer warpgroup 64 rows x BN (wgmma m64nBNk8 on C = A B) -> warp 16 rows ->
// thread tile rows g and g + 8 x BN / 4 columns (pairs 8 apart). K slice: a run of a tile's k
// tiles, one block each.
#include "common.cuh"
#include "mbarrier.cuh"
#include "warpgroup.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
#include "wgmma_epilogue.cuh"
#include "cluster.cuh"
#include "k_slices.cuh"
#include "tf32_split.cuh"

// Pre-pass: workspace = [B_big^T | B_small^T | A copy (only when K % 4 != 0)], each row padded
// to k_pad = K rounded up to 4 floats (zeros in the pad). B^T is written through 32 x 32 tiles of
// shared memory, so both B's rows (read) and B^T's rows (written) are walked along; the padding
// column of the tile puts a column's 32 values on 32 banks.
__global__ void __launch_bounds__(256)
    split_tf32_b_transposed(int M, int N, int K, float, const float* __restrict__ A,
                            const float* __restrict__ B, float, float*,
                            float* __restrict__ workspace) {
  __shared__ float tile[32][33];
  const int k_pad = (K + 3) / 4 * 4;
  unsigned* b_big = reinterpret_cast<unsigned*>(workspace);
  unsigned* b_small = b_big + (size_t)N * k_pad;
  float* a_copy = workspace + 2 * (size_t)N * k_pad;
  const int tiles_n = CEIL_DIV(N, 32), b_tiles = CEIL_DIV(k_pad, 32) * tiles_n;
  const int x = threadIdx.x % 32, y = threadIdx.x / 32;  // 8 rows of 32 threads
  for (int i = blockIdx.x; i < b_tiles; i += gridDim.x) {
    const int k0 = (i / tiles_n) * 32, n0 = (i % tiles_n) * 32;
    __syncthreads();  // the previous tile's reads are done
    for (int r = y; r < 32; r += 8) {
      const int k = k0 + r, n = n0 + x;
      tile[r][x] = k < K && n < N ? B[(size_t)k * N + n] : 0.0f;
    }
    __syncthreads();
    for (int r = y; r < 32; r += 8) {
      const int n = n0 + r, k = k0 + x;
      if (n < N && k < k_pad) {
        unsigned big, small;
        split_tf32(tile[x][r], big, small);
        b_big[(size_t)n * k_pad + k] = big;
        b_small[(size_t)n * k_pad + k] = small;
      }
    }
  }
  if (K % 4 == 0) return;
  const int k_chunks = k_pad / 4;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)M * k_chunks;
       i += (size_t)gridDim.x * blockDim.x) {
    const int row = i / k_chunks, col = (i % k_chunks) * 4;
    const float* src = A + (size_t)row * K + col;
    float4 v;
    v.x = src[0];  // col < K always: the first of a chunk is inside the row
    v.y = col + 1 < K ? src[1] : 0.0f;
    v.z = col + 2 < K ? src[2] : 0.0f;
    v.w = col + 3 < K ? src[3] : 0.0f;
    *reinterpret_cast<float4*>(a_copy + i * 4) = v;
  }
}

// The block: a tile's K slice (all of K when SLICES == 1), then the cluster's slices added up.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__device__ __forceinline__ void run_block(int M, int N, int K, float alpha, float beta, float* C,
                                          const TensorMap* tmap_a, const TensorMap* tmap_b_big,
                                          const TensorMap* tmap_b_small) {
  constexpr int BK = 32;
  constexpr int CONSUMERS = BM / 64;
  constexpr int A_TILE = BM * BK * 4;        // bytes of A per stage (FP32)
  constexpr int B_TILE = BN * BK * 4;        // bytes of one part of B^T per stage
  constexpr int STAGE = A_TILE + 2 * B_TILE;  // A, B_big^T, B_small^T
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 240;
  static_assert(SLICES == 1 || STAGES * STAGE >= BM * BN * 4,
                "the partial tile must fit in the stage ring it reuses");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  u64* full = reinterpret_cast<u64*>(smem + STAGES * STAGE);
  u64* empty = full + STAGES;

  const SliceOfTile work = slice_of_tile<BM, BN, BK, GROUP_M, SLICES>(M, N, K);

  if (threadIdx.x == 0) init_stage_ring<STAGES, CONSUMERS>(full, empty);
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0)
      produce_split_k_tiles<BM, BN, STAGES, true>(smem, full, empty, tmap_a, tmap_b_big,
                                                  tmap_b_small, work.m0, work.n0, work.kt0,
                                                  work.k_tiles);
    if constexpr (SLICES > 1) {  // the producers meet the cluster's two barriers too
      __syncwarp();
      cluster_sync();
      cluster_sync();
    }
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  const int ct = threadIdx.x - 128;  // consumer thread, 0 .. 128 * CONSUMERS - 1
  const int c = ct / 128, warp = (ct / 32) % 4, lane = ct % 32;
  // The row of the A tile this lane addresses for ldmatrix (split_a_fragments): the warp's 16
  // rows, lanes 0-7 and 16-23 rows 0-7, lanes 8-15 and 24-31 rows 8-15.
  const int a_row = 64 * c + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);

  float d[BN / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
  float total[BN / 2];  // promotion: the FP32 sum of this slice's periods
  consume_split_k_tiles<BN, STAGE, A_TILE, A_TILE + B_TILE, STAGES, IN_FLIGHT, 1, PROMOTE, true>(
      smem, full, empty, work.k_tiles, 0, a_row * 128, 0, lane, d, total);

  const float* acc = PROMOTE > 0 ? total : d;
  const int m = work.m0 + 64 * c + 16 * warp + lane / 4, n = work.n0 + 2 * (lane % 4);
  if constexpr (SLICES == 1) {
    store_column_groups<BN / 8>(acc, C, M, N, m, n, alpha, beta);
  } else {
    constexpr int SHARE = BN / 8 / SLICES;  // column groups each block of the cluster stores
    float sum[4 * SHARE];
    add_k_slices<BN, 128 * CONSUMERS, SLICES>(acc, sum, smem, work.slice, ct);
    cluster_sync();  // every block has read its share of this block's partial
    store_column_groups<SHARE>(sum, C, M, N, m, n + 8 * SHARE * work.slice, alpha, beta);
  }
}

// One block per tile (SLICES == 1)...
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__global__ void __launch_bounds__(128 * (1 + BM / 64), 1)
    sgemm_wgmma_3xtf32_a_in_registers(int M, int N, int K, float alpha,
                                      const float* __restrict__ A, const float* __restrict__ B,
                                      float beta, float* __restrict__ C,
                                      float* __restrict__ workspace,
                                      const __grid_constant__ TensorMap tmap_a,
                                      const __grid_constant__ TensorMap tmap_b_big,
                                      const __grid_constant__ TensorMap tmap_b_small) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES>(M, N, K, alpha, beta, C, &tmap_a,
                                                                 &tmap_b_big, &tmap_b_small);
}

// ... or a cluster of SLICES blocks per tile, one K slice each.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE, int SLICES>
__global__ void __launch_bounds__(128 * (1 + BM / 64), 1) __cluster_dims__(SLICES, 1, 1)
    sgemm_wgmma_3xtf32_a_in_registers_cluster(int M, int N, int K, float alpha,
                                              const float* __restrict__ A,
                                              const float* __restrict__ B, float beta,
                                              float* __restrict__ C,
                                              float* __restrict__ workspace,
                                              const __grid_constant__ TensorMap tmap_a,
                                              const __grid_constant__ TensorMap tmap_b_big,
                                              const __grid_constant__ TensorMap tmap_b_small) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES>(M, N, K, alpha, beta, C, &tmap_a,
                                                                 &tmap_b_big, &tmap_b_small);
}
