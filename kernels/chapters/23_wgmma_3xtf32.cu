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
//
// Reading order: the split (split_tf32) and the pre-pass that applies it to A, then the pipeline
// (produce_k_tiles, consume_k_tiles: 20's producer and consumer with A_small as a third tile and
// three wgmmas per k step), the any-N epilogue, and the kernel. Only 20's generic pieces come
// from headers (TMA, mbarriers, setmaxnreg, the wgmma instruction and its fragment layout); the
// library's gemm_3xtf32 (kernels/gemm/3xtf32.cu) runs the same idea for every shape.
#include "../include/common.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
// TensorMap, tma_load_2d, init_stage_ring; to_tf32, the wgmma wrappers and descriptor: as in 20
#include "../include/tma.cuh"
#include "../include/wgmma.cuh"

// ---- The split: x = big + small ------------------------------------------------------------

// x = big + small (+ at most 2^-22 |x|), both TF32 values held as FP32 bit patterns.
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));  // exact difference; -ftz flushes it below 2^-126
}

// --- Pre-pass: workspace = [A_big | A_small | B copy (only when N % 4 != 0)], row strides padded
// to 4 floats (16 bytes). Each thread handles 4 consecutive elements of a padded row; the pad
// columns get zeros (the tensor maps stop at K and N, so they are never read anyway).
__global__ void __launch_bounds__(256)
    split_tf32_operands(int M, int N, int K, float, const float* __restrict__ A,
                        const float* __restrict__ B, float, float*, float* __restrict__ workspace) {
  const int k_chunks = (K + 3) / 4, n_chunks = (N + 3) / 4;
  const size_t a_floats = (size_t)M * k_chunks * 4;
  float* a_big = workspace;
  float* a_small = workspace + a_floats;
  float* b_copy = workspace + 2 * a_floats;
  const size_t a_work = (size_t)M * k_chunks;
  const size_t b_work = N % 4 ? (size_t)K * n_chunks : 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < a_work + b_work;
       i += (size_t)gridDim.x * blockDim.x) {
    if (i < a_work) {
      const int row = i / k_chunks, col = (i % k_chunks) * 4;
      const float* src = A + (size_t)row * K + col;
      float v[4];
      if (K % 4 == 0) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = col + j < K ? src[j] : 0.0f;
      }
      unsigned big[4], small[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) split_tf32(v[j], big[j], small[j]);
      *reinterpret_cast<uint4*>(a_big + i * 4) = make_uint4(big[0], big[1], big[2], big[3]);
      *reinterpret_cast<uint4*>(a_small + i * 4) = make_uint4(small[0], small[1], small[2], small[3]);
    } else {
      const size_t j = i - a_work;
      const int row = j / n_chunks, col = (j % n_chunks) * 4;
      const float* src = B + (size_t)row * N + col;
      float4 v;
      v.x = src[0];  // col < N always: the first of a chunk is inside the row
      v.y = col + 1 < N ? src[1] : 0.0f;
      v.z = col + 2 < N ? src[2] : 0.0f;
      v.w = col + 3 < N ? src[3] : 0.0f;
      *reinterpret_cast<float4*>(b_copy + j * 4) = v;
    }
  }
}

// A consumer lane's share of B^T (wgmma's register operand) for one 32-k stage, split: 16 values
// x 2 parts, 4 per 8-k step in wgmma's A-fragment order (wgmma.cuh).
struct Fragments {
  unsigned big[4][4], small[4][4];
};

// ---- The pipeline: 20's, with a third tile per stage and three wgmmas per k step -------------

// Producer (one thread of warpgroup 0): walks all k tiles, refilling each stage as soon as the
// consumers release it: A_big's and A_small's BM x 32 boxes, then BN / 32 boxes of B.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void produce_k_tiles(unsigned char* smem, u64* full, u64* empty,
                                                const TensorMap* tmap_a_big,
                                                const TensorMap* tmap_a_small,
                                                const TensorMap* tmap_b, int m0, int n0,
                                                int k_tiles) {
  constexpr int BK = 32, A_TILE = BM * BK * 4, B_BOX = BK * 32 * 4;
  constexpr int STAGE = 2 * A_TILE + (BN / 32) * B_BOX;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    const int k = kt * BK;
    unsigned char* stage = smem + s * STAGE;
    mbar_wait(&empty[s], ((kt / STAGES) & 1) ^ 1);
    mbar_arrive_expect_tx(&full[s], STAGE);
    tma_load_2d(stage, tmap_a_big, &full[s], k, m0);
    tma_load_2d(stage + A_TILE, tmap_a_small, &full[s], k, m0);
#pragma unroll
    for (int i = 0; i < BN / 32; ++i)
      tma_load_2d(stage + 2 * A_TILE + i * B_BOX, tmap_b, &full[s], n0 + 32 * i, k);
  }
}

// Consumer warpgroup: k tiles 0 .. k_tiles - 1 of the ring of STAGE-byte stages. For each, the
// lane loads B^T's fragments from its 32-column box `box` of the B tile (consumer_lane's offsets
// frag_lo, frag_hi) and splits them; three wgmmas m64nBMk8 per 8 k then multiply them into `d`
// against A's two TF32 parts (A_big at byte 0 of the stage, A_small at A_TILE): B_small x
// A_big, B_big x A_small, B_big x A_big (ORDER 1; ORDER 2 puts the big product first). The
// accumulator restarts every PROMOTE k tiles, and `total` is the FP32 sum of the periods.
template <int BM, int STAGE, int STAGES, int IN_FLIGHT, int ORDER, int PROMOTE>
__device__ __forceinline__ void consume_k_tiles(const unsigned char* smem, u64* full, u64* empty,
                                                int k_tiles, int box, unsigned frag_lo,
                                                unsigned frag_hi, int lane, float* d,
                                                float* total) {
  constexpr int BK = 32;
  constexpr int A_TILE = BM * BK * 4;  // bytes of one A part per stage
  constexpr int B_BOX = BK * 32 * 4;   // one TMA box of B
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) d[i] = total[i] = 0.0f;

  auto release = [&](int s) {
    if (lane == 0) mbar_arrive(&empty[s]);
  };
  // Wait for k tile kt, split its B^T fragments, issue its 3 x 4 wgmmas as one group. The first
  // wgmma of a promotion period starts the accumulator afresh (scale-d = 0).
  auto issue = [&](int kt, Fragments& f) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], (kt / STAGES) & 1);
    const unsigned char* stage = smem + s * STAGE;
    const unsigned char* b_box = stage + 2 * A_TILE + box * B_BOX;
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks) {
      const float2 lo = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_lo);
      const float2 hi = *reinterpret_cast<const float2*>(b_box + ks * 1024 + frag_hi);
      split_tf32(lo.x, f.big[ks][0], f.small[ks][0]);
      split_tf32(lo.y, f.big[ks][1], f.small[ks][1]);
      split_tf32(hi.x, f.big[ks][2], f.small[ks][2]);
      split_tf32(hi.y, f.big[ks][3], f.small[ks][3]);
    }
    const unsigned big = smem_addr(stage), small = big + A_TILE;
    int accumulate = PROMOTE == 0 || kt % PROMOTE != 0 ? 1 : 0;
    auto mma = [&](const unsigned* frag, unsigned tile) {
      wgmma_rs<BM>(d, frag, smem_desc_k_sw128(tile), accumulate);
      accumulate = 1;
    };
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks) {
      if (ORDER == 2) mma(f.big[ks], big + ks * 32);  // big x big first
      mma(f.small[ks], big + ks * 32);                // B small x A big
      mma(f.big[ks], small + ks * 32);                // B big x A small
      if (ORDER == 1) mma(f.big[ks], big + ks * 32);  // big x big last
    }
    wgmma_commit();
  };
  // The fragments must live until their wgmma group completes: an empty asm that "changes" them
  // keeps the compiler from reusing their registers earlier.
  auto keep = [](Fragments& f) {
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(f.big[ks][i]), "+r"(f.small[ks][i]));
  };
  // One k tile: issue it, retire the one before (IN_FLIGHT 2) or itself (1), and at the end of
  // a promotion period drain the group and add the partial into the total.
  auto step = [&](int kt, Fragments& now, Fragments& prev) {
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
    if (PROMOTE > 0 && (kt % PROMOTE == PROMOTE - 1 || kt == k_tiles - 1)) {
      wgmma_wait<0>();
      keep(now);
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        asm volatile("" : "+f"(d[i]));  // read d only after the wait
        total[i] += d[i];
      }
    }
  };

  Fragments f0, f1;
  int kt = 0;
  for (; kt + 1 < k_tiles; kt += 2) {
    step(kt, f0, f1);
    step(kt + 1, f1, f0);
  }
  if (kt < k_tiles) step(kt, f0, f1);
  wgmma_wait<0>();
  keep(f0);
  keep(f1);
  if (IN_FLIGHT == 2 && k_tiles > 0) release((k_tiles - 1) % STAGES);
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) asm volatile("" : "+f"(d[i]));  // d only after the wait
}

// ---- The epilogue: any M and N ---------------------------------------------------------------

// C(m, n .. n + 1) for GROUPS row groups of this lane (rows m0 + 8j + 2t and
// m0 + 8j + 2t + 1 for j < GROUPS; acc[4j + {0, 2}] and acc[4j + {1, 3}] as in wgmma.cuh), any
// N (a pair of columns is read and stored as a float2 only when N is even, so its address is
// 8-byte aligned). With beta != 0 the old C is read in batches of EPI_BATCH row groups, all loads
// before any store, as in 20: one row at a time, each row waited a full global-memory latency.
template <int GROUPS>
__device__ __forceinline__ void store_row_groups(const float* acc, float* C, int M, int N, int m0,
                                                 int n, int t, float alpha, float beta) {
  constexpr int EPI_BATCH = GROUPS < 8 ? GROUPS : 8;  // up to 16 float2 loads in flight per thread
  static_assert(GROUPS % EPI_BATCH == 0, "row groups come in whole batches");
  if (n >= N) return;
  const bool pair = n + 1 < N && N % 2 == 0;
  const bool second = n + 1 < N;  // this lane's second column is inside C
#pragma unroll
  for (int j0 = 0; j0 < GROUPS; j0 += EPI_BATCH) {
    float2 old[EPI_BATCH][2];
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        const float* p = C + (size_t)m * N + n;
        old[j][h] = make_float2(0.0f, 0.0f);
        if (beta != 0.0f && m < M) {
          if (pair) old[j][h] = *reinterpret_cast<const float2*>(p);
          else old[j][h] = make_float2(p[0], second ? p[1] : 0.0f);
        }
      }
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        if (m >= M) continue;
        float* p = C + (size_t)m * N + n;
        const float* v = acc + 4 * (j0 + j) + h;
        const float2 out = make_float2(alpha * v[0] + beta * old[j][h].x,
                                       alpha * v[2] + beta * old[j][h].y);
        if (pair) {
          *reinterpret_cast<float2*>(p) = out;
        } else {
          p[0] = out.x;
          if (second) p[1] = out.y;
        }
      }
  }
}

// A consumer lane's whole block tile: BM / 4 rows, BM / 8 row groups.
template <int BM>
__device__ __forceinline__ void store_tile(const float* acc, float* C, int M, int N, int m0,
                                           int n, int t, float alpha, float beta) {
  store_row_groups<BM / 8>(acc, C, M, N, m0, n, t, alpha, beta);
}

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
      produce_k_tiles<BM, BN, STAGES>(smem, full, empty, &tmap_a_big, &tmap_a_small, &tmap_b,
                                      m0, n0, k_tiles);
  } else {
    setmaxnreg_inc<CONSUMER_REGS>();
    const int c = threadIdx.x / 128 - 1;
    const ConsumerLane place = consumer_lane(c);
    const int lane = place.lane, g = place.g, t = place.t, box = place.box, chunk = place.chunk;
    const unsigned frag_lo = place.frag_lo, frag_hi = place.frag_hi;

    float d[BM / 2];      // the wgmma accumulator (restarted every PROMOTE k tiles)
    float total[BM / 2];  // promotion: the FP32 sum of the periods' partials
    consume_k_tiles<BM, STAGE, STAGES, IN_FLIGHT, ORDER, PROMOTE>(smem, full, empty, k_tiles, box,
                                                                  frag_lo, frag_hi, lane, d, total);

    const int n = n0 + box * 32 + 4 * chunk + 2 * (g & 1);
    store_tile<BM>(PROMOTE > 0 ? total : d, C, M, N, m0, n, t, alpha, beta);
  }
}
