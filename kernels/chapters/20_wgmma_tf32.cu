// 20 wgmma_tf32: Hopper's own tensor-core path. Operands move global -> shared through the
// tensor memory accelerator (TMA: cp.async.bulk.tensor with a tensor map, completion counted on
// an mbarrier), one producer warpgroup keeps a STAGES-deep ring of tiles full, and consumer
// warpgroups multiply with wgmma (warpgroup MMA, m64nNk8 TF32) into register accumulators.
//
// What changed from 19 and why:
// - mma.sync is a warp-wide m16n8k8 that the SM issues from registers loaded by the warp itself;
//   on Hopper it does not reach the tensor cores' rate (19 peaked at 35% of cuBLAS TF32). wgmma is issued by a warpgroup
//   (4 warps, 128 threads) for a 64 x N x 8 product (N up to 256), reads its B operand straight
//   from shared memory through a matrix descriptor and runs asynchronously: the warps go on
//   while it works, and wait on a commit group only when they need the result.
// - Copies are TMA: one thread describes a whole tile (tensor map + coordinates) instead of 256
//   threads each copying 16 bytes (19's cp.async). The TMA writes the tile 128-byte swizzled
//   (CU_TENSOR_MAP_SWIZZLE_128B), the layout wgmma reads without bank conflicts, and fills
//   elements outside the matrix with zeros, which is all the edge handling the K loop needs:
//   any M, N, K (with N and K multiples of 4, the TMA's 16-byte row-stride rule).
// - Warp specialization: warpgroup 0 only issues TMA copies (setmaxnreg.dec gives its registers
//   away); the consumer warpgroups only wait, multiply and release (setmaxnreg.inc takes them).
//   A full/empty mbarrier pair per stage hands each tile from producer to consumers and back.
// - TF32 wgmma reads both operands K-major only (no transpose for 32-bit types), and B (K x N,
//   row-major) is N-major. So the kernel computes the transposed product, C^T = B^T A^T:
//   wgmma's "A" (64 x 8 per instruction) is a slice of B^T taken from registers, which the
//   consumer loads from the TMA's B tile itself; wgmma's "B" is a tile of A, which in row-major
//   A is already K-major in shared memory. The accumulators hold C^T; the epilogue writes them
//   back transposed.
// - Register fragments of B^T are loaded with one LDS.64 per two values: D row g of a warp is
//   column n(g) of C and row g + 8 is n(g) + 1, a free permutation of C's columns that makes
//   each lane's two values adjacent. n(g) walks the 16-byte chunks {0,1,4,5} or {2,3,6,7} of a
//   128-byte row, which the swizzle (chunk ^ (k % 8)) spreads over all 32 banks for the four
//   k rows a load touches: conflict-free.
// - Two wgmma groups in flight per consumer (IN_FLIGHT = 2): tile kt is issued before the wait
//   for tile kt - 1, so a warpgroup never leaves the tensor cores idle while it loads fragments
//   (measured on the H100: 96.8% of cuBLAS TF32 at 4096 against 91.8% with one). The register
//   fragments of a group in flight are kept live (`keep`) so the compiler cannot reuse them.
// - FP32 -> TF32, rounded both ways: the register operand (B) with cvt.rna.tf32.f32 as in 18 and
//   19; the shared-memory operand (A) by the TMA itself, whose tensor map has the TF32 element
//   type. With an FP32 map the tensor cores would use A's top 19 bits (truncation): rel_err 4.2e-4
//   at 4096 against 2.6e-4 rounded, which is cuBLAS TF32's.
// - Tried and left out: pairs of CTAs in a cluster sharing the A tile through TMA multicast
//   (half the A traffic from L2) verified but ran at 40-45% of cuBLAS TF32 on the H100.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of 32 (BM rows of C from A, BN columns of C from B; 32 k =
//               one 128-byte swizzle row), STAGES stages in the producer -> consumer ring
//   consumer warpgroup tile BM x 64 (one wgmma m64nBMk8 per 8 k, in transposed form: 64
//               columns of C by BM rows) -> warp 16 columns of C -> thread tile 2 columns x
//               BM/4 rows (BM/2 accumulators)
// The TMA and wgmma wrappers (tma.cuh, wgmma.cuh) are shared with 23; the kernel's own steps
// (producer, fragment keep-alive, epilogue) are named functions above it.
#include "../include/common.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
#include "../include/tma.cuh"
#include "../include/wgmma.cuh"

// Producer (one thread of warpgroup 0): walks K, refilling each stage as soon as the consumers
// release it: A's BM x 32 box and BN / 32 boxes of B (32 k rows x 32 columns) per stage.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void produce_k_tiles(unsigned char* a_tiles, unsigned char* b_tiles,
                                                u64* full, u64* empty, const TensorMap* tmap_a,
                                                const TensorMap* tmap_b, int m0, int n0,
                                                int k_tiles) {
  constexpr int BK = 32, A_STAGE = BM * BK * 4, B_BOX = BK * 32 * 4, B_STAGE = (BN / 32) * B_BOX;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    mbar_wait(&empty[s], ((kt / STAGES) & 1) ^ 1);
    mbar_arrive_expect_tx(&full[s], A_STAGE + B_STAGE);
    tma_load_2d(a_tiles + s * A_STAGE, tmap_a, &full[s], kt * BK, m0);
#pragma unroll
    for (int i = 0; i < BN / 32; ++i)
      tma_load_2d(b_tiles + s * B_STAGE + i * B_BOX, tmap_b, &full[s], n0 + 32 * i, kt * BK);
  }
}

// The epilogue: d[4j + {0, 2}] are C(m0 + 8j + 2t, n .. n + 1), d[4j + {1, 3}] the next row.
// N is a multiple of 4, so a column pair is in or out as a whole. With beta != 0 the old C is
// read in batches of EPI_BATCH row groups, all loads before any store: loaded one row at a time
// ahead of its store, each of the BM / 4 rows waited a full global-memory latency (measured on
// the H100 at beta = 3: 1024^3 ran at 45% of its beta = 0 speed, 4096^3 at 73%).
template <int BM>
__device__ __forceinline__ void store_tile_pairs(const float* d, float* C, int M, int N, int m0,
                                                 int n, int t, float alpha, float beta) {
  constexpr int EPI_BATCH = 8;  // 16 float2 loads in flight per thread
  static_assert((BM / 8) % EPI_BATCH == 0, "row groups come in whole batches");
  if (n >= N) return;
#pragma unroll
  for (int j0 = 0; j0 < BM / 8; j0 += EPI_BATCH) {
    float2 old[EPI_BATCH][2];
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        old[j][h] = (beta != 0.0f && m < M)
                        ? *reinterpret_cast<const float2*>(C + (size_t)m * N + n)
                        : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        if (m < M) {
          const float* v = d + 4 * (j0 + j) + h;
          *reinterpret_cast<float2*>(C + (size_t)m * N + n) =
              make_float2(alpha * v[0] + beta * old[j][h].x, alpha * v[2] + beta * old[j][h].y);
        }
      }
  }
}

template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1)
    sgemm_wgmma_tf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                     const float* __restrict__ B, float beta, float* __restrict__ C,
                     const __grid_constant__ TensorMap tmap_a,
                     const __grid_constant__ TensorMap tmap_b) {
  constexpr int BK = 32;                       // floats of k per stage: one 128-byte swizzle row
  constexpr int CONSUMERS = BN / 64;           // consumer warpgroups, 64 columns of C each
  constexpr int A_STAGE = BM * BK * 4;         // bytes: BM rows of A, 128 bytes each
  constexpr int B_BOX = BK * 32 * 4;           // bytes: one TMA box of B, 32 k rows x 32 columns
  constexpr int B_STAGE = (BN / 32) * B_BOX;
  // Registers per thread after the hand-over: the producer keeps few, the consumers take the rest
  // of the 64K (multiples of 8).
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 240;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // 128-byte swizzled tiles must start 1024-byte aligned (the swizzle repeats every 8 rows).
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* a_tiles = smem;                          // STAGES x A_STAGE
  unsigned char* b_tiles = smem + STAGES * A_STAGE;       // STAGES x B_STAGE
  u64* full = reinterpret_cast<u64*>(b_tiles + STAGES * B_STAGE);  // tile landed
  u64* empty = full + STAGES;                                           // tile consumed

  // Tile order as in 17: groups of GROUP_M block rows walked column by column, for L2 reuse.
  const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
  const int group_tiles = GROUP_M * tiles_n;
  const int first_m = (blockIdx.x / group_tiles) * GROUP_M;
  const int rows_here = min(tiles_m - first_m, GROUP_M);
  const int m0 = (first_m + (blockIdx.x % group_tiles) % rows_here) * BM;
  const int n0 = ((blockIdx.x % group_tiles) / rows_here) * BN;
  const int k_tiles = CEIL_DIV(K, BK);

  if (threadIdx.x == 0) init_stage_ring<STAGES, CONSUMERS>(full, empty);
  __syncthreads();

  if (threadIdx.x < 128) {
    // Producer warpgroup: one thread walks K, refilling each stage as soon as it is released.
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0)
      produce_k_tiles<BM, BN, STAGES>(a_tiles, b_tiles, full, empty, &tmap_a, &tmap_b, m0, n0,
                                      k_tiles);
  } else {
    // Consumer warpgroup c: columns n0 + 64c .. n0 + 64c + 63 of C, all BM rows.
    setmaxnreg_inc<CONSUMER_REGS>();
    const int c = threadIdx.x / 128 - 1;
    // Its lane's box of B, 16-byte chunk of n(g) and fragment offsets (wgmma.cuh).
    const ConsumerLane place = consumer_lane(c);
    const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
    const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

    float d[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) d[i] = 0.0f;

    auto release = [&](int s) {  // stage s back to the producer
      if (lane == 0) mbar_arrive(&empty[s]);
    };
    // Wait for k tile kt, load its B^T fragments into `frag` and issue its wgmmas as one group.
    auto issue = [&](int kt, unsigned (&frag)[BK / 8][4]) {
      const int s = kt % STAGES;
      mbar_wait(&full[s], (kt / STAGES) & 1);
      const unsigned char* b_box = b_tiles + s * B_STAGE + box * B_BOX;
#pragma unroll
      for (int ks = 0; ks < BK / 8; ++ks) {
        const float2 lo = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_lo);
        const float2 hi = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_hi);
        frag[ks][0] = to_tf32(lo.x);   // row g:     (k = t,     n(g))
        frag[ks][1] = to_tf32(lo.y);   // row g + 8: (k = t,     n(g) + 1)
        frag[ks][2] = to_tf32(hi.x);   // row g:     (k = t + 4, n(g))
        frag[ks][3] = to_tf32(hi.y);   // row g + 8: (k = t + 4, n(g) + 1)
      }
      const unsigned a_tile = smem_addr(a_tiles + s * A_STAGE);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BK / 8; ++ks)
        wgmma_rs<BM>(d, frag[ks], smem_desc_k_sw128(a_tile + ks * 32));
      wgmma_commit();
    };
    auto keep = [](unsigned (&frag)[BK / 8][4]) { keep_fragments(frag); };

    unsigned frag0[BK / 8][4], frag1[BK / 8][4];
    if (IN_FLIGHT == 1) {  // issue a tile, wait for it, release it
      for (int kt = 0; kt < k_tiles; ++kt) {
        issue(kt, frag0);
        wgmma_wait<0>();
        release(kt % STAGES);
      }
    } else {  // two groups in flight: tile kt is issued before tile kt - 1 is waited for
      int kt = 0;
      for (; kt + 1 < k_tiles; kt += 2) {
        issue(kt, frag0);
        wgmma_wait<1>();
        keep(frag1);
        if (kt > 0) release((kt - 1) % STAGES);
        issue(kt + 1, frag1);
        wgmma_wait<1>();
        keep(frag0);
        release(kt % STAGES);
      }
      if (kt < k_tiles) {
        issue(kt, frag0);
        wgmma_wait<1>();
        keep(frag1);
        if (kt > 0) release((kt - 1) % STAGES);
      }
      wgmma_wait<0>();
      keep(frag0);
      keep(frag1);
      release((k_tiles - 1) % STAGES);
    }

    const int n = n0 + box * 32 + 4 * chunk + 2 * (g & 1);
    store_tile_pairs<BM>(d, C, M, N, m0, n, t, alpha, beta);
  }
}
