// 23 wgmma_3xtf32: FP32 accuracy from the TF32 tensor cores. Each FP32 operand x is split into
// two TF32 numbers, x ~ big + small, and C = A B is computed as A_big B_big + A_big B_small +
// A_small B_big: three wgmmas per k step instead of one (a third of chapter 20's rate at best),
// for an error close to FP32's instead of TF32's (2.6e-4 at 4096 in 20).
//
// What changed from 20 and why:
// - A pre-pass (split_tf32_operands, launched by the runner before the main kernel through the
//   config's launch.prepass) writes A_big and A_small into the workspace, each M x K with rows
//   padded to a multiple of 4 floats, and (only when N % 4 != 0) a copy of B with padded rows.
//   That solves two problems at once: the split of the shared-memory operand, which wgmma reads
//   straight from shared memory and so must be two TF32 tiles there, and the TMA's 16-byte
//   row-stride rule, which made 20 refuse N, K not multiples of 4. This chapter runs ANY M, N, K.
//   Cost: one memory-bound pass, reading A (and B when copied) once and writing 2 (3) times its
//   bytes: at 4096 192 MiB of DRAM traffic, about 0.07 ms at 3 TB/s, against ~1.3 ms of wgmma
//   work at 100 TFLOP/s (5%); at 8192 about 0.27 ms against ~11 ms (2.5%). It is counted in the
//   timing (the runner launches both kernels per launch).
// - B, wgmma's register operand, is split in registers as its fragments are loaded: big =
//   cvt.rna(b), small = cvt.rna(b - big): 3 instructions per value, 16 values per thread per
//   32-k stage against 12 wgmmas. No second B tile, no extra shared memory for it.
// - Both parts are rounded explicitly (cvt.rna): the tensor cores read FP32 bits and ignore the
//   low 13 mantissa bits, so an unrounded small part would lose up to 2^-10 of itself.
// - A stage holds three tiles (A_big, A_small, B), 48 KiB at 128 x 128 x 32: the default tile is
//   128 x 128 (wgmma m64n128k8) with 4 stages instead of 20's 256 x 128.
// - The three products of a k step go to the tensor cores small ones first (ORDER 1:
//   A_big B_small, A_small B_big, then A_big B_big; ORDER 2 puts the big one first, kept to
//   measure the difference). Within a promotion period (below) the running partial sum grows
//   with k; a cross term added before its k step's big product meets a partial sum one big
//   product smaller, so it keeps a few more of its bits where the partial is still small.
// - Promotion (PROMOTE > 0): the tensor cores add each wgmma's 8 products to the accumulator
//   with the operands aligned to the largest exponent and the result truncated (the published
//   models of V100 to H100 tensor cores), an error biased towards zero that would drift over
//   K / 8 * 3 wgmmas into one accumulator. So every PROMOTE k tiles the wgmma accumulator is
//   added into an FP32 register total with a round-to-nearest FADD and restarted (scale-d = 0 on
//   the next wgmma): truncation acts only on sums of 32 * PROMOTE k, and the total takes
//   K / (32 * PROMOTE) correctly rounded additions. It costs BM / 2 more registers (so BM = 128)
//   and one drain of the wgmma pipeline per period.
//
// Error analysis (per product, u = 2^-24 is FP32's unit roundoff):
//   big = rna_tf32(x) keeps 11 significant bits: |x - big| <= 2^-11 |x|, and x - big is exact in
//   FP32. small = rna_tf32(x - big): |x - big - small| <= 2^-11 |x - big| <= 2^-22 |x|.
//   a b = a_big b_big + a_big b_small + a_small b_big + a_small b_small + (split errors), and the
//   tensor cores multiply TF32 numbers exactly (11 x 11 bits fit in FP32). Dropped: a_small
//   b_small, at most 2^-22 |a b|, and the split errors, at most about 2 * 2^-22 |a b|: about
//   3 * 2^-22 = 12u per product in the worst case, far less on average, and with inputs of random
//   sign these errors add up like C itself (both as sqrt(K)), so their normwise share of the
//   error does not grow with K. A fourth product would recover only the 2^-22 term, below
//   what the split errors already cost. What grows with K is accumulation: FP32 FFMA (cuBLAS)
//   rounds once per k; here the tensor core truncates once per wgmma (3 per 8 k) into a partial
//   of 32 * PROMOTE k, and the register total rounds once per period. Expected: rel_err a few
//   times 1e-7, growing slowly with K (measured at K = 1024 ... 16384 by
//   benchmarks/proof.sh 23; see kernels/README.md).
// Where it is worse than FP32:
// - Tiny values: small is about 2^-11 ... 2^-22 of x, so for |x| below about 2^-114 it falls
//   under FP32's normal range, and the split (built with -ftz) flushes it: such an operand is
//   only TF32-accurate (2^-11). tests/test_gpu.py runs A ~ 2^-120, B ~ 2^100 (C in range): FP32
//   rel_err stays ~1e-7, this chapter's is TF32's ~1e-4.
// - Near overflow: |x| >= (2 - 2^-11) 2^127 rounds big to Inf, and big + small becomes NaN.
// - Within one wgmma the 8 products are aligned to the largest: in a k step mixing products of
//   very different sizes the small ones lose low bits they would keep in FFMA.
//
// Measured on an H100 (benchmarks/variants.py and benchmarks/accuracy_3xtf32.py, one process, L2
// flushed; % of cuBLAS FP32): PROMOTE 4 with 2 k tiles in flight ran at 148 / 225 / 251 / 246% at
// 1024 / 2048 / 4096 / 8192 with rel_err 9.1e-7 at every K from 1024 to 16384 (cuBLAS FP32 on the
// same inputs, M = N = 2048: 5.7e-7 ... 2.3e-6, so a ratio of 1.58 ... 0.41); PROMOTE 2 with one
// k tile in flight (the configured default) 243 / 241% at 4096 / 8192 with 4.8e-7 / 5.0e-7;
// PROMOTE 1 215 / 205% with 3.1e-7 / 3.7e-7. Promotion halves the error for 2-3% of the speed.
// At small K cuBLAS FP32's own error (1.8e-7 at 130 x 260 x 1030) falls below this floor.
//
// Tile hierarchy as in 20: block tile BM x BN x 32 -> consumer warpgroup BM x 64 (wgmma
// m64nBMk8 on C^T = B^T A^T) -> warp 16 columns of C -> lane 2 columns x BM / 4 rows.
#include "../include/common.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
// TensorMap, tma_load_2d, init_stage_ring; to_tf32, the wgmma wrappers and descriptor: as in 20
#include "../include/tma.cuh"
#include "../include/wgmma.cuh"
// store_tile: the predicated any-N epilogue, shared with 25
#include "../include/wgmma_epilogue.cuh"
// split_tf32, the pre-pass split_tf32_operands, the three-tile producer (produce_split_k_tiles)
// and the consumer's K loop (consume_split_k_tiles), shared with 26
#include "../include/tf32_split.cuh"

template <int BM, int BN, int STAGES, int GROUP_M, int IN_FLIGHT, int ORDER, int PROMOTE>
__global__ void __launch_bounds__(128 * (1 + BN / 64), 1)
    sgemm_wgmma_3xtf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                       const float* __restrict__ B, float beta, float* __restrict__ C,
                       float* __restrict__ workspace, const __grid_constant__ TensorMap tmap_a_big,
                       const __grid_constant__ TensorMap tmap_a_small,
                       const __grid_constant__ TensorMap tmap_b) {
  constexpr int BK = 32;
  constexpr int CONSUMERS = BN / 64;
  constexpr int A_TILE = BM * BK * 4;          // bytes of one A part per stage
  constexpr int B_BOX = BK * 32 * 4;           // one TMA box of B: 32 k rows x 32 columns
  constexpr int STAGE = 2 * A_TILE + (BN / 32) * B_BOX;  // A_big, A_small, B
  constexpr int PRODUCER_REGS = 40;
  constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 240;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  u64* full = reinterpret_cast<u64*>(smem + STAGES * STAGE);
  u64* empty = full + STAGES;

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
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0)
      produce_split_k_tiles<BM, BN, STAGES>(smem, full, empty, &tmap_a_big, &tmap_a_small,
                                            &tmap_b, m0, n0, 0, k_tiles);
  } else {
    setmaxnreg_inc<CONSUMER_REGS>();
    const int c = threadIdx.x / 128 - 1;
    const ConsumerLane place = consumer_lane(c);
    const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
    const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

    float d[BM / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
    float total[BM / 2];  // promotion: the FP32 sum of the periods' partials
    consume_split_k_tiles<BM, STAGE, 0, A_TILE, STAGES, IN_FLIGHT, ORDER, PROMOTE>(
        smem, full, empty, k_tiles, box, frag_lo, frag_hi, lane, d, total);

    const int n = n0 + box * 32 + 4 * chunk + 2 * (g & 1);
    store_tile<BM>(PROMOTE > 0 ? total : d, C, M, N, m0, n, t, alpha, beta);
  }
}
