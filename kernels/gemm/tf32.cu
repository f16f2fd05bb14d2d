// gemm/tf32.cu: the library's TF32 tensor-core GEMM for every M, N, K, alpha, beta (chapter 25's
// kernel; chapter 20 teaches the wgmma + TMA pipeline, chapter 25 the padding pre-pass and the K
// slices across a cluster).
// - Rows not 16-byte aligned (A with K % 4 != 0, B with N % 4 != 0), the TMA cannot read them:
//   STREAM 0: a pre-pass (pad_unaligned_rows) copies them into the workspace with rows padded to
//   4 floats for the TMA; STREAM 1: the producer warpgroup copies their boxes itself with 4-byte
//   cp.async into the TMA's swizzled layout (swizzled_rows.cuh), no pre-pass. Aligned operands
//   are read in place by the TMA either way and launch no pre-pass. Streamed, A reaches wgmma as
//   FP32 (the tensor cores truncate it to TF32; the TMA's TF32 type rounds it).
// - Few tiles: a tile's K range is cut into SLICES (1, 2, 4, 8; the config's derived `slices`)
//   runs computed by the blocks of one cluster, added up in K order through distributed shared
//   memory (k_slices.cuh): deterministic, never through global memory.
// - Block tiles 64, 128 or 256 rows (wgmma m64nBMk8) x 64 or 128 columns; the tuned file picks
//   them per shape. With `fit` 2 the rows are fitted to the shape, any multiple of 8 up to that
//   size (wgmma_rows.cuh): 19 rows run in a 24-row tile, 1156 in ten of 120, not of 128.
// - Short K with a large C (PREFETCH_C, the config's derived `c_prefetched`): with beta != 0 the
//   producer threads left idle request the block's old C into L2 (c_prefetch.cuh), so that the
//   epilogue, most of such a kernel's time, reads it from L2 rather than DRAM. PREFETCH_C 2
//   (`c_staged`; one block per tile, no split tail, N % 4 == 0): they copy the old C whole into
//   shared memory with 16-byte cp.async while the main loop runs, and the epilogue reads it there,
//   so no global load waits after the main loop (c_prefetch.cuh, wgmma_epilogue.cuh).
// Tile hierarchy: block tile BM x BN, k tiles of 32 (one 128-byte swizzle row), STAGES stages in
// the producer -> consumer ring -> consumer warpgroup BM x 64 (wgmma m64nBMk8 on C^T = B^T A^T)
// -> warp 16 columns of C -> thread tile 2 columns x BM / 4 rows. K slice: a run of a tile's k
// tiles, one block each.
#include "../include/common.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
#include "../include/tma.cuh"
#include "../include/wgmma.cuh"
// wgmma_rows: block tiles of any multiple of 8 rows (`fit` 2), shared with gemm/3xtf32.cu
#include "../include/wgmma_rows.cuh"
#include "../include/wgmma_epilogue.cuh"
#include "../include/cluster.cuh"
// add_k_slices: a cluster's K slices added up in distributed shared memory, shared with gemm/3xtf32.cu
#include "../include/k_slices.cuh"
// copy_swizzled_rows: the unaligned operands' boxes by 4-byte cp.async (STREAM 1)
#include "../include/swizzled_rows.cuh"
// prefetch_c_box / copy_c_box: the old C requested into L2 (PREFETCH_C 1) or copied into shared
// memory (PREFETCH_C 2) by the idle producer threads
#include "../include/c_prefetch.cuh"

// --- Pre-pass: workspace = [A copy (only when K % 4 != 0) | B copy (only when N % 4 != 0)],
// row strides padded to 4 floats (16 bytes), pad columns zero. The copies are flat lists of
// 4-float chunks of the padded rows: a thread takes CHUNKS of them a grid apart, loads all of
// them (four 4-byte loads each: a source row starts anywhere) before it stores any (one 16-byte
// store each: a padded row starts 16-byte aligned), so each thread has 16 loads in flight and
// a warp's loads and stores are 512 contiguous bytes. The first version (a block per row, four
// loads in flight per thread, 4-byte stores) moved 67 MB at 511 x 513 x 8191 at 2.1 TB/s,
// 32 us next to the GEMM's 42 (H100, timed apart, L2 flushed).
__global__ void __launch_bounds__(256)
    pad_unaligned_rows(int M, int N, int K, float, const float* __restrict__ A,
                       const float* __restrict__ B, float, float*, float* __restrict__ workspace) {
  constexpr int CHUNKS = 4;
  const int a_per_row = CEIL_DIV(K, 4), b_per_row = CEIL_DIV(N, 4);  // chunks per padded row
  // chunk counts fit an int (the yaml's size constraint: copy_chunks <= 2^31 - 1)
  const int a_chunks = K % 4 ? M * a_per_row : 0, b_chunks = N % 4 ? K * b_per_row : 0;
  const int total = a_chunks + b_chunks, step = gridDim.x * blockDim.x;
  float* b_copy = workspace + (size_t)(a_chunks ? M : 0) * (4 * a_per_row);
  for (int first = blockIdx.x * blockDim.x + threadIdx.x; first < total; first += CHUNKS * step) {
    float4 v[CHUNKS];
    float4* dst[CHUNKS];
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      const int id = first + j * step;
      dst[j] = nullptr;
      if (id >= total) continue;
      const bool is_a = id < a_chunks;
      const int local = is_a ? id : id - a_chunks, per_row = is_a ? a_per_row : b_per_row;
      const int row = local / per_row, col = 4 * (local - row * per_row), cols = is_a ? K : N;
      const float* src = (is_a ? A : B) + (size_t)row * cols + col;
      v[j].x = __ldg(src);  // col < cols: a chunk starts inside its row
      v[j].y = col + 1 < cols ? __ldg(src + 1) : 0.0f;
      v[j].z = col + 2 < cols ? __ldg(src + 2) : 0.0f;
      v[j].w = col + 3 < cols ? __ldg(src + 3) : 0.0f;
      dst[j] = reinterpret_cast<float4*>((is_a ? workspace : b_copy) + (size_t)row * 4 * per_row) +
               col / 4;
    }
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j)
      if (dst[j] != nullptr) *dst[j] = v[j];
  }
}

// Producer: walks this block's K slice (k tiles kt0 .. kt0 + k_tiles - 1), refilling each stage
// as soon as the consumers release it: A's BM x 32 box and BN / 32 boxes of B (32 k rows x 32
// columns) per stage, as in 20. Thread 0 issues the TMA copies; with STREAM, every producer
// thread also copies its rows of the operands the TMA cannot read (A when K % 4, B when N % 4).
template <int BM, int BN, int STAGES, int STREAM>
__device__ __forceinline__ void produce_k_slice(unsigned char* a_tiles, unsigned char* b_tiles,
                                                u64* full, u64* empty, const TensorMap* tmap_a,
                                                const TensorMap* tmap_b, int m0, int n0, int kt0,
                                                int k_tiles, const float* A, const float* B,
                                                int M, int N, int K) {
  constexpr int BK = 32, A_STAGE = BM * BK * 4, B_BOX = BK * 32 * 4, B_STAGE = (BN / 32) * B_BOX;
  const bool a_streamed = STREAM && K % 4 != 0, b_streamed = STREAM && N % 4 != 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // streamed rows: this lane's element of the warp's first box row, as of k = 0
  const float* a_row = A + (size_t)(m0 + warp) * K + lane;
  const float* b_row = B + (size_t)warp * N + n0 + lane;
  unsigned b_cols_ok = 0;
#pragma unroll
  for (int i = 0; i < BN / 32; ++i) b_cols_ok |= (n0 + 32 * i + lane < N ? 1u : 0u) << i;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    const int k = (kt0 + kt) * BK;
    mbar_wait(&empty[s], ((kt / STAGES) & 1) ^ 1);
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&full[s], (a_streamed ? 0 : A_STAGE) + (b_streamed ? 0 : B_STAGE));
      if (!a_streamed) tma_load_2d(a_tiles + s * A_STAGE, tmap_a, &full[s], k, m0);
      if (!b_streamed) {
#pragma unroll
        for (int i = 0; i < BN / 32; ++i)
          tma_load_2d(b_tiles + s * B_STAGE + i * B_BOX, tmap_b, &full[s], n0 + 32 * i, k);
      }
    }
    if constexpr (STREAM) {
      if (a_streamed)
        copy_swizzled_rows<BM, 1>(smem_addr(a_tiles + s * A_STAGE), a_row + k, K,
                                  M - m0 - warp, k + lane < K ? 1u : 0u, warp, lane);
      if (b_streamed)
        copy_swizzled_rows<BK, BN / 32>(smem_addr(b_tiles + s * B_STAGE), b_row + (size_t)k * N,
                                        N, K - k - warp, b_cols_ok, warp, lane);
      stream_arrive(&full[s]);
    }
  }
  if constexpr (STREAM) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The block: a tile's K slice (the whole K range when SLICES == 1), as in 20, then the cluster's
// slices added up. LAST_TILES: the launch runs the last tiles (a split tail's, k_slices.cuh).
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int STREAM,
          int PREFETCH_C, bool LAST_TILES = false>
__device__ __forceinline__ void run_block(int M, int N, int K, float alpha, const float* A,
                                          const float* B, float beta, float* C,
                                          const TensorMap* tmap_a, const TensorMap* tmap_b) {
  constexpr int BK = 32;
  constexpr int CONSUMERS = BN / 64;
  constexpr int A_STAGE = BM * BK * 4;
  constexpr int B_BOX = BK * 32 * 4;
  constexpr int B_STAGE = (BN / 32) * B_BOX;
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 240;
  static_assert(SLICES == 1 || STAGES * (A_STAGE + B_STAGE) >= BM * BN * 4,
                "the partial tile must fit in the stage ring it reuses");

  // PREFETCH_C 2: the old C copied whole into shared memory (N % 4 == 0), one block per tile; a
  // row's floats BN + 4 apart, so that a warp's rows of the epilogue fall in other banks
  static_assert(PREFETCH_C != 2 || SLICES == 1, "the staged C is a whole tile's");
  constexpr int C_STRIDE = BN + 4;
  constexpr int C_TILE = PREFETCH_C == 2 ? BM * C_STRIDE * 4 : 0;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* a_tiles = smem;
  unsigned char* b_tiles = smem + STAGES * A_STAGE;
  float* c_tile = reinterpret_cast<float*>(b_tiles + STAGES * B_STAGE);
  u64* full = reinterpret_cast<u64*>(b_tiles + STAGES * B_STAGE + C_TILE);
  u64* empty = full + STAGES;
  u64* c_ready = empty + STAGES;  // PREFETCH_C 2: every producer thread's copies of C landed

  // This block's tile and K slice (k_slices.cuh).
  const SliceOfTile work = slice_of_tile<BM, BN, BK, GROUP_M, SLICES, LAST_TILES>(M, N, K);
  const int m0 = work.m0, n0 = work.n0, slice = work.slice, kt0 = work.kt0, k_tiles = work.k_tiles;

  if (threadIdx.x == 0) {
    if constexpr (PREFETCH_C == 2) mbar_init(c_ready, 128);  // the ring's init fences it
    if constexpr (STREAM)
      stream_ring_init<STAGES, CONSUMERS>(full, empty);
    else
      init_stage_ring<STAGES, CONSUMERS>(full, empty);
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<PRODUCER_REGS>();
    if (STREAM || threadIdx.x == 0)
      produce_k_slice<BM, BN, STAGES, STREAM>(a_tiles, b_tiles, full, empty, tmap_a, tmap_b, m0,
                                              n0, kt0, k_tiles, A, B, M, N, K);
    // PREFETCH_C: the producers done (at once, for all but thread 0 unless STREAM), this block's
    // rows of the old C (its share after the K slices) are requested into L2 for the epilogue
    if constexpr (PREFETCH_C == 2) {  // no copies with beta 0: the arrival is at once
      if (beta != 0.0f)
        copy_c_box<C_STRIDE, 128>(c_tile, C, N, m0, min(M, m0 + BM), n0, min(N, n0 + BN),
                                  threadIdx.x);
      cp_async_mbar_arrive(c_ready);
    } else if (PREFETCH_C && beta != 0.0f) {
      const int row0 = m0 + slice * (BM / SLICES);
      prefetch_c_box<128>(C, N, row0, min(M, row0 + BM / SLICES), n0, min(N, n0 + BN),
                          threadIdx.x);
    }
    producers_meet_slice_barriers<SLICES>();
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  const int ct = threadIdx.x - 128;  // consumer thread, 0 .. 128 * CONSUMERS - 1
  const int c = ct / 128;
  const ConsumerLane place = consumer_lane(c);
  const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
  const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

  float d[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) d[i] = 0.0f;

  auto release = [&](int s) {
    if (lane == 0) mbar_arrive(&empty[s]);
  };
  // As in 20: wait for k tile kt, load its B^T fragments (rounded to TF32), issue its wgmmas as
  // one group.
  auto issue = [&](int kt, unsigned (&frag)[BK / 8][4]) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], (kt / STAGES) & 1);
    if (STREAM && K % 4 != 0) stream_fence_for_wgmma();  // A streamed: wgmma reads it
    const unsigned char* b_box = b_tiles + s * B_STAGE + box * B_BOX;
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks) {
      const float2 lo = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_lo);
      const float2 hi = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_hi);
      frag[ks][0] = to_tf32(lo.x);
      frag[ks][1] = to_tf32(lo.y);
      frag[ks][2] = to_tf32(hi.x);
      frag[ks][3] = to_tf32(hi.y);
    }
    const unsigned a_tile = smem_addr(a_tiles + s * A_STAGE);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks)
      wgmma_rows<BM>(d, frag[ks], a_tile + ks * 32);
    wgmma_commit();
  };
  auto keep = [](unsigned (&frag)[BK / 8][4]) { keep_fragments(frag); };
  // One k tile: issue it, then retire the one before (IN_FLIGHT 2) or itself (1).
  auto step = [&](int kt, unsigned (&now)[BK / 8][4], unsigned (&prev)[BK / 8][4]) {
    issue(kt, now);
    if (IN_FLIGHT == 2) {
      wgmma_wait<1>();
      keep(prev);
      if (kt > 0) release((kt - 1) % STAGES);
    } else {
      wgmma_wait<0>();
      keep(now);
      release(kt % STAGES);
    }
  };

  unsigned frag0[BK / 8][4], frag1[BK / 8][4];
  int kt = 0;
  for (; kt + 1 < k_tiles; kt += 2) {
    step(kt, frag0, frag1);
    step(kt + 1, frag1, frag0);
  }
  if (kt < k_tiles) step(kt, frag0, frag1);
  wgmma_wait<0>();
  keep(frag0);
  keep(frag1);
  if (IN_FLIGHT == 2 && k_tiles > 0) release((k_tiles - 1) % STAGES);
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) asm volatile("" : "+f"(d[i]));  // d only after the wait

  const int n = n0 + box * 32 + 4 * chunk + 2 * (g & 1);
  if constexpr (PREFETCH_C == 2) {
    mbar_wait(c_ready, 0);
    store_row_groups_from<BM / 8, C_STRIDE>(d, c_tile, C, M, N, m0, n0, n, t, alpha, beta);
  } else if constexpr (SLICES == 1) {
    store_tile<BM>(d, C, M, N, m0, n, t, alpha, beta);
  } else {
    constexpr int SHARE = k_slice_share(BM, SLICES);
    float sum[4 * SHARE];
    add_k_slices<BM, 128 * CONSUMERS, SLICES>(d, sum, smem, slice, ct);
    cluster_sync();  // every block has read its share of this block's partial
    // a shorter last share (a fitted tile): its rows past the tile are the next tile's
    const int rows_end = (BM / 8) % SLICES == 0 ? M : min(M, m0 + BM);
    store_row_groups<SHARE>(sum, C, rows_end, N, m0 + 8 * SHARE * slice, n, t, alpha, beta);
  }
}

// One block per tile (SLICES == 1)...
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int PREFETCH_C,
          int STREAM>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1)
    gemm_tf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                               const float* __restrict__ B, float beta, float* __restrict__ C,
                               float* __restrict__ workspace,
                               const __grid_constant__ TensorMap tmap_a,
                               const __grid_constant__ TensorMap tmap_b) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, SLICES, STREAM, PREFETCH_C>(
      M, N, K, alpha, A, B, beta, C, &tmap_a, &tmap_b);
}

// ... or a cluster of SLICES blocks per tile, one K slice each.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int PREFETCH_C,
          int STREAM>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1) __cluster_dims__(SLICES, 1, 1)
    gemm_tf32_cluster(int M, int N, int K, float alpha,
                                       const float* __restrict__ A, const float* __restrict__ B,
                                       float beta, float* __restrict__ C,
                                       float* __restrict__ workspace,
                                       const __grid_constant__ TensorMap tmap_a,
                                       const __grid_constant__ TensorMap tmap_b) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, SLICES, STREAM, PREFETCH_C>(
      M, N, K, alpha, A, B, beta, C, &tmap_a, &tmap_b);
}

// ... or the split tail (`split_tail`): the tiles past the last full wave of a launch of the
// first ones (the kernel above, a grid of whole waves), a cluster of SLICES blocks each, so that
// they fill one wave of SMs for 1 / SLICES of a round instead of a few SMs for a whole one.
template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int SLICES, int PREFETCH_C,
          int STREAM>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1) __cluster_dims__(SLICES, 1, 1)
    gemm_tf32_tail(int M, int N, int K, float alpha, const float* __restrict__ A,
                   const float* __restrict__ B, float beta, float* __restrict__ C,
                   float* __restrict__ workspace, const __grid_constant__ TensorMap tmap_a,
                   const __grid_constant__ TensorMap tmap_b) {
  run_block<BM, BN, STAGES, GROUP_M, IN_FLIGHT, SLICES, STREAM, PREFETCH_C, true>(
      M, N, K, alpha, A, B, beta, C, &tmap_a, &tmap_b);
}
