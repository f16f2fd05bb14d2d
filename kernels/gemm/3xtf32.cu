// gemm/3xtf32.cu: the library's FP32-accurate GEMM on the TF32 tensor cores (3xTF32), any M, N,
// K, alpha, beta. Each operand x = big + small, both TF32; C = A_big B_big + A_big B_small +
// A_small B_big, three wgmma per k step (small products first), the wgmma partial promoted into
// an FP32 register total every PROMOTE k tiles (chapter 23 teaches the split, its error analysis
// and the pipeline; chapter 25 the K slices across a cluster).
//
// One kernel, two roles for the operands (A_IN_REGISTERS, chosen per shape by the tuned file):
//   0: C^T = B^T A^T (chapter 23's layout). The pre-pass splits A into A_big and A_small in the
//      workspace (split_tf32_operands, tf32_split.cuh); B's fragments are split in registers.
//      B's rows when not 16-byte aligned (N % 4): copied padded by the pre-pass, or (STREAM 1)
//      copied into the stage by the producer warpgroup (swizzled_rows.cuh). Or (STREAM 2, the
//      tuned file's split_by 2) no pre-pass: the producer warpgroup copies A's rows into the
//      stage (or, STREAM 4, the TMA brings them, K % 4 == 0) and splits them there
//      (split_in_stage, tf32_split.cuh), for the shapes where the pre-pass's own launch is a
//      large share of the time.
//      Block tile BM x BN, BM = wgmma's N, one consumer warpgroup per 64 columns.
//   1: C = A B. A is streamed once as FP32 and split in registers (ldmatrix, split_a_fragments);
//      the pre-pass splits and transposes B, the small operand of few-columns products, into
//      B_big^T and B_small^T (split_tf32_b_transposed), instead of writing A twice. A's rows when
//      not 16-byte aligned (K % 4): copied padded by the pre-pass (COPY_A), or (STREAM) copied
//      into the stage by the producer warpgroup, as B's in role 0. Block tile BM x BN, BN =
//      wgmma's N, one consumer warpgroup per 64 rows.
// wgmma's N side (BM in role 0, BN in role 1) is 64, 128 or 256, or with the tuned file's `fit`
// 2 fitted to the shape, any multiple of 8 (wgmma_rows.cuh): 19 rows run in a 24-row tile.
// The same block with one product a step (PRODUCTS 1, role 1 only) is gemm_tf32_swapped, the
// library's TF32 kernel for few columns (defined at the end of this file).
// Everything else is shared: the stage ring, the producer (produce_split_k_tiles), the consumer's
// K loop (consume_split_k_tiles), and K slices (SLICES > 1: the blocks of one cluster, each
// block's FP32 total left in its idle stage ring and added up in K order, k_slices.cuh).
// Short K with a large C (PREFETCH_C, gemm_3xtf32's derived `c_prefetched`; gemm_tf32_swapped
// never): with beta != 0 the idle producer threads request the block's old C into L2 for the
// epilogue (c_prefetch.cuh).
//
// Tile hierarchy: block tile BM x BN, k tiles of 32, STAGES stages of three tiles -> consumer
// warpgroup 64 columns (role 0) or 64 rows (role 1) -> warp 16 of them -> thread tile. K slice: a
// run of a tile's k tiles, one block each.
#include "../include/common.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
#include "../include/tma.cuh"
#include "../include/wgmma.cuh"
#include "../include/wgmma_epilogue.cuh"
#include "../include/cluster.cuh"
#include "../include/k_slices.cuh"
#include "../include/tf32_split.cuh"
// prefetch_c_box: the old C requested into L2 by the idle producer threads (PREFETCH_C)
#include "../include/c_prefetch.cuh"

// Pre-pass of role 1: workspace = [B_big^T | B_small^T | A copy (only when K % 4 != 0 and
// COPY_A: the producer does not stream A)], each row padded to k_pad = K rounded up to 4 floats
// (zeros in the pad). B^T is written through 32 x 32 tiles of shared memory, so both B's rows
// (read) and B^T's rows (written) are walked along; the padding column of the tile puts a
// column's 32 values on 32 banks.
template <int COPY_A>
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
  if (!COPY_A || K % 4 == 0) return;
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

// The block's geometry for the operands' roles: which tile side is wgmma's N (the shared-memory
// operand, split by the pre-pass) and which the register operand's (64 per consumer warpgroup).
// PRODUCTS 1 (gemm_tf32_swapped, role 1 only): one TF32 product, so a stage holds B_big^T alone.
template <bool A_IN_REGISTERS, int BM, int BN, int PRODUCTS = 3>
struct Roles {
  static constexpr int BK = 32;
  static constexpr int WGMMA_N = A_IN_REGISTERS ? BN : BM;
  static constexpr int CONSUMERS = (A_IN_REGISTERS ? BM : BN) / 64;
  static constexpr int A_TILE = BM * BK * 4;  // bytes of one A part (A_big, A_small or A) per stage
  static constexpr int B_TILE = BN * BK * 4;  // bytes of one B part per stage
  static constexpr int B_PARTS = PRODUCTS == 1 ? 1 : 2;  // B_big^T (and B_small^T) with A in registers
  static constexpr int STAGE = A_IN_REGISTERS ? A_TILE + B_PARTS * B_TILE : 2 * A_TILE + B_TILE;
};

// What either consumer takes: the problem's C side, the stage ring and its barriers, its work.
#define CONSUMER_ARGS                                                                          \
  int M, int N, float alpha, float beta, float *C, unsigned char *smem, u64 *full, u64 *empty, \
      const SliceOfTile &work

// Role 0's consumer: B^T fragments split in registers, A_big and A_small from shared memory; C
// stored by rows of the tile (store_tile), or a share of its row groups after the K slices.
template <int BM, int BN, int STAGES, int IN_FLIGHT, int PROMOTE, int SLICES>
__device__ __forceinline__ void consume_b_in_registers(CONSUMER_ARGS) {
  using R = Roles<false, BM, BN>;
  const int ct = threadIdx.x - 128;  // consumer thread, 0 .. 128 * CONSUMERS - 1
  const int c = ct / 128;
  const ConsumerLane place = consumer_lane(c);
  const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
  const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

  float d[BM / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
  float total[BM / 2];  // promotion: the FP32 sum of this slice's periods
  consume_split_k_tiles<BM, R::STAGE, 0, R::A_TILE, STAGES, IN_FLIGHT, 1, PROMOTE>(
      smem, full, empty, work.k_tiles, box, frag_lo, frag_hi, lane, d, total);

  const float* acc = PROMOTE > 0 ? total : d;
  const int n = work.n0 + box * 32 + 4 * chunk + 2 * (g & 1);
  if constexpr (SLICES == 1) {
    store_tile<BM>(acc, C, M, N, work.m0, n, t, alpha, beta);
  } else {
    constexpr int SHARE = k_slice_share(BM, SLICES);
    float sum[4 * SHARE];
    add_k_slices<BM, 128 * R::CONSUMERS, SLICES>(acc, sum, smem, work.slice, ct);
    cluster_sync();  // every block has read its share of this block's partial
    // a shorter last share (a fitted tile): its rows past the tile are the next tile's
    const int rows_end = (BM / 8) % SLICES == 0 ? M : min(M, work.m0 + BM);
    store_row_groups<SHARE>(sum, C, rows_end, N, work.m0 + 8 * SHARE * work.slice, n, t, alpha,
                            beta);
  }
}

// Role 1's consumer: A fragments split in registers (ldmatrix from the FP32 A tile), B_big^T and
// B_small^T from shared memory; C stored by pairs of columns (store_column_groups).
template <int BM, int BN, int STAGES, int IN_FLIGHT, int PROMOTE, int SLICES, int PRODUCTS>
__device__ __forceinline__ void consume_a_in_registers(CONSUMER_ARGS) {
  using R = Roles<true, BM, BN, PRODUCTS>;
  const int ct = threadIdx.x - 128;  // consumer thread, 0 .. 128 * CONSUMERS - 1
  const int c = ct / 128, warp = (ct / 32) % 4, lane = ct % 32;
  // The row of the A tile this lane addresses for ldmatrix (split_a_fragments): the warp's 16
  // rows, lanes 0-7 and 16-23 rows 0-7, lanes 8-15 and 24-31 rows 8-15.
  const int a_row = 64 * c + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);

  float d[BN / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
  float total[BN / 2];  // promotion: the FP32 sum of this slice's periods
  consume_split_k_tiles<BN, R::STAGE, R::A_TILE, R::A_TILE + R::B_TILE, STAGES, IN_FLIGHT, 1,
                        PROMOTE, true, PRODUCTS>(smem, full, empty, work.k_tiles, 0, a_row * 128,
                                                 0, lane, d, total);

  const float* acc = PROMOTE > 0 ? total : d;
  const int m = work.m0 + 64 * c + 16 * warp + lane / 4, n = work.n0 + 2 * (lane % 4);
  if constexpr (SLICES == 1) {
    store_column_groups<BN / 8>(acc, C, M, N, m, n, alpha, beta, N);
  } else {
    constexpr int SHARE = k_slice_share(BN, SLICES);  // column groups each block of the cluster stores
    float sum[4 * SHARE];
    add_k_slices<BN, 128 * R::CONSUMERS, SLICES>(acc, sum, smem, work.slice, ct);
    cluster_sync();  // every block has read its share of this block's partial
    // a shorter last share (a fitted tile): its columns past the tile are the next tile's
    const int cols_end = (BN / 8) % SLICES == 0 ? N : min(N, work.n0 + BN);
    store_column_groups<SHARE>(sum, C, M, N, m, n + 8 * SHARE * work.slice, alpha, beta,
                               cols_end);
  }
}

// The block: a tile's K slice (all of K when SLICES == 1), then the cluster's slices added up.
// LAST_TILES: the launch runs the last tiles (a split tail's, k_slices.cuh).
// The three tensor maps in the roles' order: role 0 A_big, A_small, B; role 1 A, B_big^T,
// B_small^T (the producer loads them in this order into each stage).
template <bool A_IN_REGISTERS, int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT,
          int PROMOTE, int SLICES, int PRODUCTS = 3, int STREAM = 0, bool LAST_TILES = false,
          int PREFETCH_C = 0>
__device__ __forceinline__ void run_block(int M, int N, int K, float alpha, const float* A,
                                          const float* B, float beta, float* C,
                                          const TensorMap* tmap_0,
                                          const TensorMap* tmap_1, const TensorMap* tmap_2) {
  using R = Roles<A_IN_REGISTERS, BM, BN, PRODUCTS>;
  static_assert(PRODUCTS == 3 || (PRODUCTS == 1 && A_IN_REGISTERS && PROMOTE == 0),
                "one product: role 1, one accumulator over the slice (TF32 needs no promotion)");
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = R::CONSUMERS == 2 ? 232 : 240;
  static_assert(SLICES == 1 || STAGES * R::STAGE >= BM * BN * 4,
                "the partial tile must fit in the stage ring it reuses");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  u64* full = reinterpret_cast<u64*>(smem + STAGES * R::STAGE);
  u64* empty = full + STAGES;
  u64* loaded = empty + STAGES;  // STREAM 4: A's FP32 box landed, for the producers to split

  // This block's tile and K slice (k_slices.cuh).
  const SliceOfTile work = slice_of_tile<BM, BN, R::BK, GROUP_M, SLICES, LAST_TILES>(M, N, K);

  if (threadIdx.x == 0) {
    if constexpr (STREAM & 4) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) mbar_init(&loaded[s], 1);  // the TMA thread's arrival
    }
    if constexpr (STREAM)  // an arrival a producer thread for each of its kinds of copies
      stream_ring_init<STAGES, R::CONSUMERS, (STREAM & 1) + ((STREAM >> 1) & 1)>(full, empty);
    else
      init_stage_ring<STAGES, R::CONSUMERS>(full, empty);
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<PRODUCER_REGS>();
    if (STREAM || threadIdx.x == 0) {
      // STREAM 1: the register operand's rows, copied by every producer thread (A's or B's);
      // 2 (role 0): A's rows, copied and split in the stage by every producer thread
      if constexpr (A_IN_REGISTERS)
        produce_split_k_tiles<BM, BN, STAGES, true, R::B_PARTS, STREAM>(
            smem, full, empty, tmap_0, tmap_1, tmap_2, work.m0, work.n0, work.kt0, work.k_tiles,
            A, M, K);
      else
        produce_split_k_tiles<BM, BN, STAGES, false, R::B_PARTS, STREAM>(
            smem, full, empty, tmap_0, tmap_1, tmap_2, work.m0, work.n0, work.kt0, work.k_tiles,
            B, K, N, A, M, K, loaded);
    }
    // PREFETCH_C: the producers done, this block's box of the old C requested into L2 for the
    // epilogue (its share after the K slices: role 1's slices share columns, role 0's rows)
    if (PREFETCH_C && beta != 0.0f) {
      const int rows = A_IN_REGISTERS ? BM : BM / SLICES, cols = A_IN_REGISTERS ? BN / SLICES : BN;
      const int row0 = work.m0 + (A_IN_REGISTERS ? 0 : work.slice * rows);
      const int col0 = work.n0 + (A_IN_REGISTERS ? work.slice * cols : 0);
      prefetch_c_box<128>(C, N, row0, min(M, row0 + rows), col0, min(N, col0 + cols),
                          threadIdx.x);
    }
    producers_meet_slice_barriers<SLICES>();
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  if constexpr (A_IN_REGISTERS)
    consume_a_in_registers<BM, BN, STAGES, IN_FLIGHT, PROMOTE, SLICES, PRODUCTS>(
        M, N, alpha, beta, C, smem, full, empty, work);
  else
    consume_b_in_registers<BM, BN, STAGES, IN_FLIGHT, PROMOTE, SLICES>(M, N, alpha, beta, C, smem,
                                                                       full, empty, work);
}

#define GEMM_3XTF32_ARGS                                                                      \
  int M, int N, int K, float alpha, const float* __restrict__ A, const float* __restrict__ B,   \
      float beta, float* __restrict__ C, float* __restrict__ workspace,                         \
      const __grid_constant__ TensorMap tmap_0, const __grid_constant__ TensorMap tmap_1,       \
      const __grid_constant__ TensorMap tmap_2

// One block per tile (SLICES == 1)... STREAM, bits of what the producer threads copy: 1 the
// register operand's rows unaligned (role 0: B's, N % 4; role 1: A's, K % 4; no copy of them in
// the pre-pass), 2 (role 0) A's rows, split in the stage (no pre-pass for A), 4 with 2: A's rows
// brought by the TMA (K % 4 == 0) rather than copied.
template <int A_IN_REGISTERS, int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE,
          int SLICES, int PREFETCH_C, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<A_IN_REGISTERS, BM, BN>::CONSUMERS), 1)
    gemm_3xtf32(GEMM_3XTF32_ARGS) {
  run_block<A_IN_REGISTERS, BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES, 3, STREAM, false,
            PREFETCH_C>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_2);
}

// ... or a cluster of SLICES blocks per tile, one K slice each.
template <int A_IN_REGISTERS, int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE,
          int SLICES, int PREFETCH_C, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<A_IN_REGISTERS, BM, BN>::CONSUMERS), 1)
    __cluster_dims__(SLICES, 1, 1) gemm_3xtf32_cluster(GEMM_3XTF32_ARGS) {
  run_block<A_IN_REGISTERS, BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES, 3, STREAM, false,
            PREFETCH_C>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_2);
}

// ... or the split tail (`split_tail`): the tiles past the last full wave of a launch of the
// first ones (gemm_3xtf32, a grid of whole waves), a cluster of SLICES blocks each.
template <int A_IN_REGISTERS, int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int PROMOTE,
          int SLICES, int PREFETCH_C, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<A_IN_REGISTERS, BM, BN>::CONSUMERS), 1)
    __cluster_dims__(SLICES, 1, 1) gemm_3xtf32_tail(GEMM_3XTF32_ARGS) {
  run_block<A_IN_REGISTERS, BM, BN, STAGES, GROUP_M, IN_FLIGHT, PROMOTE, SLICES, 3, STREAM, true,
            PREFETCH_C>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_2);
}

// gemm_tf32_swapped: TF32 (one product a step, A rounded to TF32 in registers, B^T rounded by the
// pre-pass) in role 1's block, for few columns: they are wgmma's N side (any multiple of 8 with a
// fitted tile), where gemm_tf32 spends a 64-column consumer warpgroup. The pre-pass and the maps
// are role 1's (split_tf32_b_transposed; it also writes B_small^T, which this kernel never reads).
// STREAM: A's rows unaligned (K % 4), copied by the producer as in gemm_3xtf32's role 1, so the
// pre-pass transposes B alone (split_tf32_b_transposed<0>) instead of also writing A's padded copy.
#define GEMM_TF32_SWAPPED_ARGS                                                                \
  int M, int N, int K, float alpha, const float* __restrict__ A, const float* __restrict__ B,   \
      float beta, float* __restrict__ C, float* __restrict__ workspace,                         \
      const __grid_constant__ TensorMap tmap_0, const __grid_constant__ TensorMap tmap_1

template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<true, BM, BN, 1>::CONSUMERS), 1)
    gemm_tf32_swapped(GEMM_TF32_SWAPPED_ARGS) {
  run_block<true, BM, BN, STAGES, GROUP_M, IN_FLIGHT, 0, SLICES, 1, STREAM>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_1);
}

template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<true, BM, BN, 1>::CONSUMERS), 1)
    __cluster_dims__(SLICES, 1, 1) gemm_tf32_swapped_cluster(GEMM_TF32_SWAPPED_ARGS) {
  run_block<true, BM, BN, STAGES, GROUP_M, IN_FLIGHT, 0, SLICES, 1, STREAM>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_1);
}

// ... or the split tail (`split_tail`), as gemm_3xtf32_tail.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int STREAM>
__global__ void __launch_bounds__(128 * (1 + Roles<true, BM, BN, 1>::CONSUMERS), 1)
    __cluster_dims__(SLICES, 1, 1) gemm_tf32_swapped_tail(GEMM_TF32_SWAPPED_ARGS) {
  run_block<true, BM, BN, STAGES, GROUP_M, IN_FLIGHT, 0, SLICES, 1, STREAM, true>(
      M, N, K, alpha, A, B, beta, C, &tmap_0, &tmap_1, &tmap_1);
}
