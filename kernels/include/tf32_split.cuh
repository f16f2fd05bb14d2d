// tf32_split.cuh: the 3xTF32 split as gemm/3xtf32.cu uses it (chapter 23 teaches it with its own
// copy). An FP32 value x is split into two TF32 values, x ~ big + small (23's header has the error
// analysis); the pre-pass writes A_big and A_small (and a copy of B when its rows are not 16-byte
// aligned) into the workspace; a consumer lane splits its B^T fragments in registers; the producer
// loads a stage's three tiles (A_big, A_small, B) and a consumer warpgroup runs its k tiles through
// three wgmmas each. In its own header because the library's gemm_3xtf32 runs 23's pipeline in K
// slices, 64-row tiles, and with A split in registers (SPLIT_A: its register_operand 2).
#ifndef SGEMM_LAB_TF32_SPLIT_CUH
#define SGEMM_LAB_TF32_SPLIT_CUH
#include "common.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
#include "wgmma_rows.cuh"
#include "swizzled_rows.cuh"

// x = big + small (+ at most 2^-22 |x|), both TF32 values held as FP32 bit patterns.
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));  // exact difference; -ftz flushes it below 2^-126
}

// --- Pre-pass: workspace = [A_big | A_small | B copy (only when N % 4 != 0 and COPY_B: else
// the producer copies B's unaligned rows itself, swizzled_rows.cuh)], row strides padded to 4
// floats (16 bytes). Each thread handles 4 consecutive elements of a padded row; the pad columns
// get zeros (the tensor maps stop at K and N, so they are never read anyway).
template <int COPY_B>
__global__ void __launch_bounds__(256)
    split_tf32_operands(int M, int N, int K, float, const float* __restrict__ A,
                        const float* __restrict__ B, float, float*, float* __restrict__ workspace) {
  const int k_chunks = (K + 3) / 4, n_chunks = (N + 3) / 4;
  const size_t a_floats = (size_t)M * k_chunks * 4;
  float* a_big = workspace;
  float* a_small = workspace + a_floats;
  float* b_copy = workspace + 2 * a_floats;
  const size_t a_work = (size_t)M * k_chunks;
  const size_t b_work = COPY_B && N % 4 ? (size_t)K * n_chunks : 0;
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

// A consumer lane's share of its register operand for one 32-k stage, split: 16 values x 2
// parts, 4 per 8-k step in wgmma's A-fragment order (wgmma.cuh). The register operand is B^T in
// 23 and 26 (C^T = B^T A^T: the shared-memory operand is A, pre-split) and A in 27 (C = A B: the
// shared-memory operand is B^T, pre-split); the split is the same.
struct Fragments {
  unsigned big[4][4], small[4][4];
};

// 27: the lane's A fragments from a K-major, 128-byte-swizzled A tile (rows of 32 k), split.
// ldmatrix moves 8 x 8 matrices of 16-bit values: read as 8 rows of four FP32 values, lane
// (g = lane / 4, t = lane % 4) receives value t of row g, which is the TF32 A-fragment layout, so
// one ldmatrix.x4 brings a warp's 16 rows x 8 k: lanes 0-7 and 8-15 address rows 0-7 and 8-15
// at k 0-3 of the step, lanes 16-31 the same rows at k 4-7. `row_addr` is the shared address of
// this lane's row (its 16-byte chunk c sits at chunk c ^ (row % 8), row % 8 = lane % 8).
__device__ __forceinline__ void split_a_fragments(unsigned row_addr, int lane, Fragments& f) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const unsigned addr = row_addr + ((((2 * ks + (lane >> 4)) ^ (lane & 7))) << 4);
    unsigned x[4];
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
#pragma unroll
    for (int i = 0; i < 4; ++i) split_tf32(__uint_as_float(x[i]), f.big[ks][i], f.small[ks][i]);
  }
}

// A producer thread's own copies of A's rows in k tile kt's stage (copy_swizzled_rows<BM, 1>:
// the same addresses, so no other thread's copies are waited for) split in place: TF32 big where
// the FP32 value was, small at the same place of the A_small tile after it, as the pre-pass would
// have written them (the same split_tf32). Generic-proxy stores read by wgmma through the async
// proxy: fenced before the thread's arrival on the stage's full barrier.
template <int BM, int STAGE>
__device__ __forceinline__ void split_in_stage(unsigned char* smem, u64* full, int kt, int stages,
                                               int warp, int lane) {
  constexpr int A_TILE = BM * 32 * 4;
  const int s = kt % stages;
  const unsigned dst = smem_addr(smem + s * STAGE);
  const unsigned within = (lane & 3) * 4, row_base = dst + warp * 128 + within;
  const unsigned even = row_base + ((((lane >> 2) ^ warp) & 7) << 4);
  const unsigned odd = row_base + ((((lane >> 2) ^ (warp + 4)) & 7) << 4);
#pragma unroll
  for (int j = 0; j < BM / 4; ++j) {
    const unsigned at = (j & 1 ? odd : even) + j * 512;
    float x;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(at) : "memory");
    unsigned big, small;
    split_tf32(x, big, small);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(big) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + A_TILE), "r"(small) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  mbar_arrive(&full[s]);
}

// Producer (thread 0 of warpgroup 0, or all of it with STREAM): walks k tiles kt0 .. kt0 + k_tiles - 1 (all of K in 23,
// a K slice in 26 and 27), refilling each stage as soon as the consumers release it, one stage
// after another in `smem`: A_big's and A_small's BM x 32 boxes, then BN / 32 boxes of B (23, 26:
// maps a_big, a_small, b), or with SPLIT_A A's BM x 32 box (FP32), then B_big^T's and B_small^T's
// BN x 32 boxes (27: maps a, b_big, b_small); B_big^T's alone with PARTS 1 (one TF32 product,
// gemm_tf32_swapped: B^T rounded to TF32 is B_big^T). STREAM (the register operand's rows not
// 16-byte aligned: B's, N % 4, or with SPLIT_A A's, K % 4): every producer thread copies its rows
// of that operand's boxes by cp.async instead of the TMA reading a padded copy; the stage's full
// barrier then counts those threads too. `src` is that operand (B, or A with SPLIT_A), `rows` its
// rows (K, or M) and `cols` its columns (N, or K). STREAM is a set of bits: 1 the register
// operand's rows as above; 2 (role 0 only, gemm_3xtf32's split_by 2) A's rows too, copied by
// every producer thread into the A_big tile and split there in place into A_big and A_small
// (split_in_stage), instead of the pre-pass splitting all of A into the workspace first: at small
// and mid shapes that pre-pass is a launch of its own, a third of the GEMM's time (H100, 22 x 739
// x 326: 3.1 of 9.9 us, ncu); 4 with 2 (K % 4 == 0): the TMA brings those rows instead, on
// the stage's `loaded` barrier, which the producer threads wait on before splitting. `a_src` is
// A, `a_rows` M, `a_cols` K.
template <int BM, int BN, int STAGES, bool SPLIT_A = false, int PARTS = 2, int STREAM = 0>
__device__ __forceinline__ void produce_split_k_tiles(unsigned char* smem, u64* full, u64* empty,
                                                      const TensorMap* tmap_a_big,
                                                      const TensorMap* tmap_a_small,
                                                      const TensorMap* tmap_b, int m0, int n0,
                                                      int kt0, int k_tiles,
                                                      const float* src = nullptr, int rows = 0,
                                                      int cols = 0, const float* a_src = nullptr,
                                                      int a_rows = 0, int a_cols = 0,
                                                      u64* loaded = nullptr) {
  constexpr int BK = 32, A_TILE = BM * BK * 4, B_BOX = BK * 32 * 4, B_TILE = BN * BK * 4;
  constexpr int STAGE = SPLIT_A ? A_TILE + PARTS * B_TILE : 2 * A_TILE + (BN / 32) * B_BOX;
  constexpr bool COPY_ROWS = STREAM & 1, SPLIT_IN_STAGE = !SPLIT_A && (STREAM & 2);
  constexpr bool A_BY_TMA = SPLIT_IN_STAGE && (STREAM & 4);  // else copied by cp.async
  // the bytes the TMA brings a stage: all of it, or what the producer threads do not copy
  constexpr int TMA_BYTES = SPLIT_A ? (COPY_ROWS ? PARTS * B_TILE : STAGE)
                                    : (COPY_ROWS ? 0 : STAGE - 2 * A_TILE) +
                                          (SPLIT_IN_STAGE ? 0 : 2 * A_TILE);
  // SPLIT_IN_STAGE: a k tile's A rows are split once LAG later tiles' copies are issued; the
  // consumers (IN_FLIGHT 2) release a stage only once the next tile is ready, so the producer's
  // wait for a free stage needs tile kt - STAGES + 1 split before it: LAG = STAGES - 2
  constexpr int LAG = STAGES - 2;
  // STREAM (every producer thread): this lane's element of the warp's first box row as of k = 0
  // (B: row k = warp, column n0 + lane; A: row m0 + warp, column lane), and for B which boxes'
  // columns exist (A's columns are k: only the last k tile has some outside)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* row = !COPY_ROWS ? nullptr
                     : SPLIT_A ? src + (size_t)(m0 + warp) * cols + lane
                               : src + (size_t)warp * cols + n0 + lane;
  const float* a_row =
      SPLIT_IN_STAGE && !A_BY_TMA ? a_src + (size_t)(m0 + warp) * a_cols + lane : nullptr;
  unsigned b_cols_ok = 0;
#pragma unroll
  for (int i = 0; i < BN / 32; ++i) b_cols_ok |= (n0 + 32 * i + lane < cols ? 1u : 0u) << i;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    const int k = (kt0 + kt) * BK;
    unsigned char* stage = smem + s * STAGE;
    mbar_wait(&empty[s], ((kt / STAGES) & 1) ^ 1);
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&full[s], TMA_BYTES);
      if constexpr (SPLIT_A) {
        if constexpr (!STREAM)
          tma_load_2d(stage, tmap_a_big, &full[s], k, m0);                      // A
        tma_load_2d(stage + A_TILE, tmap_a_small, &full[s], k, n0);             // B_big^T
        if constexpr (PARTS == 2)
          tma_load_2d(stage + A_TILE + B_TILE, tmap_b, &full[s], k, n0);        // B_small^T
      } else {
        if constexpr (A_BY_TMA) {  // A's FP32 box into the A_big tile (map a_big: A itself)
          mbar_arrive_expect_tx(&loaded[s], A_TILE);
          tma_load_2d(stage, tmap_a_big, &loaded[s], k, m0);
        } else if constexpr (!SPLIT_IN_STAGE) {
          tma_load_2d(stage, tmap_a_big, &full[s], k, m0);
          tma_load_2d(stage + A_TILE, tmap_a_small, &full[s], k, m0);
        }
        if constexpr (!COPY_ROWS) {
#pragma unroll
          for (int i = 0; i < BN / 32; ++i)
            tma_load_2d(stage + 2 * A_TILE + i * B_BOX, tmap_b, &full[s], n0 + 32 * i, k);
        }
      }
    }
    if constexpr (COPY_ROWS && SPLIT_A) {
      // A's tile: BM rows (m) of one 32-float box row each (k .. k + 31), at byte 0 of the stage
      copy_swizzled_rows<BM, 1>(smem_addr(stage), row + k, cols, rows - m0 - warp,
                                k + lane < cols ? 1u : 0u, warp, lane);
      stream_arrive(&full[s]);
    } else if constexpr (COPY_ROWS) {
      copy_swizzled_rows<BK, BN / 32>(smem_addr(stage + 2 * A_TILE), row + (size_t)k * cols, cols,
                                      rows - k - warp, b_cols_ok, warp, lane);
      stream_arrive(&full[s]);
    }
    if constexpr (A_BY_TMA) {
      if (kt >= LAG) {
        mbar_wait(&loaded[(kt - LAG) % STAGES], ((kt - LAG) / STAGES) & 1);
        split_in_stage<BM, STAGE>(smem, full, kt - LAG, STAGES, warp, lane);
      }
    } else if constexpr (SPLIT_IN_STAGE) {
      // A's FP32 rows into the A_big tile, as the TMA would lay them out; split LAG tiles later
      copy_swizzled_rows<BM, 1>(smem_addr(stage), a_row + k, a_cols, a_rows - m0 - warp,
                                k + lane < a_cols ? 1u : 0u, warp, lane);
      cp_async_commit();
      if (kt >= LAG) {
        cp_async_wait<LAG>();  // this thread's copies of tile kt - LAG have landed
        split_in_stage<BM, STAGE>(smem, full, kt - LAG, STAGES, warp, lane);
      }
    }
  }
  if constexpr (STREAM) asm volatile("cp.async.wait_all;\n" ::: "memory");
  if constexpr (SPLIT_IN_STAGE) {
    for (int kt = k_tiles > LAG ? k_tiles - LAG : 0; kt < k_tiles; ++kt) {
      if constexpr (A_BY_TMA) mbar_wait(&loaded[kt % STAGES], (kt / STAGES) & 1);
      split_in_stage<BM, STAGE>(smem, full, kt, STAGES, warp, lane);
    }
  }
}

// Consumer warpgroup (23's K loop; a K slice in 26 and 27): k tiles 0 .. k_tiles - 1 of the
// ring of STAGE-byte stages. For each, the lane loads and splits its register operand: B^T's
// fragments from its 32-column box `box` of the B tile at byte 2 N x 128 of the stage (23, 26;
// consumer_lane's offsets frag_lo, frag_hi), or with SPLIT_A its rows of the A tile at byte 0
// (27; frag_lo is its row's byte offset). Three wgmmas m64nNk8 per 8 k then multiply it into `d`
// against the shared-memory operand's two TF32 parts, the tiles at bytes BIG and SMALL of the
// stage: register small x big, register big x small, register big x big (the accumulator
// restarted every PROMOTE k tiles) and, with promotion, `total` (the FP32 sum of the periods).
// The three products of a k step go small ones first (ORDER 1) or the big one first (ORDER 2).
// PRODUCTS 1: register big x big alone, one TF32 product (gemm_tf32_swapped: TF32, not FP32).
template <int N, int STAGE, int BIG, int SMALL, int STAGES, int IN_FLIGHT, int ORDER, int PROMOTE,
          bool SPLIT_A = false, int PRODUCTS = 3>
__device__ __forceinline__ void consume_split_k_tiles(const unsigned char* smem, u64* full,
                                                      u64* empty, int k_tiles, int box,
                                                      unsigned frag_lo, unsigned frag_hi,
                                                      int lane, float* d, float* total) {
  constexpr int BK = 32;
  constexpr int A_TILE = N * BK * 4;  // 23, 26: the bytes of one A part per stage
  constexpr int B_BOX = BK * 32 * 4;  // 23, 26: one TMA box of B
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = total[i] = 0.0f;

  auto release = [&](int s) {
    if (lane == 0) mbar_arrive(&empty[s]);
  };
  // Wait for k tile kt, split its register operand, issue its 3 x 4 wgmmas as one group. The
  // first wgmma of a promotion period starts the accumulator afresh (scale-d = 0).
  auto issue = [&](int kt, Fragments& f) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], (kt / STAGES) & 1);
    const unsigned char* stage = smem + s * STAGE;
    if constexpr (SPLIT_A) {
      split_a_fragments(smem_addr(stage) + frag_lo, lane, f);
    } else {
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
    }
    const unsigned big = smem_addr(stage) + BIG, small = big - BIG + SMALL;
    int accumulate = PROMOTE == 0 || kt % PROMOTE != 0 ? 1 : 0;
    auto mma = [&](const unsigned* frag, unsigned tile) {
      wgmma_rows<N>(d, frag, tile, accumulate);  // N: any multiple of 8 (a fitted tile)
      accumulate = 1;
    };
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks) {
      if constexpr (PRODUCTS == 1) {
        mma(f.big[ks], big + ks * 32);                // TF32: big x big alone
        continue;
      }
      if (ORDER == 2) mma(f.big[ks], big + ks * 32);  // big x big first
      mma(f.small[ks], big + ks * 32);                // register small x big
      mma(f.big[ks], small + ks * 32);                // register big x small
      if (ORDER == 1) mma(f.big[ks], big + ks * 32);  // big x big last
    }
    wgmma_commit();
  };
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
      for (int i = 0; i < N / 2; ++i) {
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
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i]));  // d only after the wait

}

#endif  // SGEMM_LAB_TF32_SPLIT_CUH
