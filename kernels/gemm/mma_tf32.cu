// gemm/mma_tf32.cu: the library's TF32 kernel without the TMA, for the products the TMA kernel
// (gemm/tf32.cu) serves worst: rows of A or B that are not 16-byte aligned (K or N not a multiple
// of 4), which gemm_tf32 first copies into padded buffers (a pass over the big operand that, in
// the first H100 tune, left narrow unaligned products at about half of cuBLAS TF32), and narrow or
// small products, where its 64-row wgmma tiles and its cluster-wide K slices cost more than the
// math. Chapter 19 teaches the MMA (mma.sync m16n8k8) and its fragment layout; gemm/ffma.cu is the
// same block with FFMA thread tiles. What it takes from each:
// - From gemm_ffma: K cut into slices from the shape at run time (grid.y), the last slice to
//   arrive adding the partials in K order (grid_slices.cuh); the stores (tile_store.cuh).
// - From 19: the warp tile of 16 x 8 MMA tiles and plain 32-bit fragment loads, here from padded
//   tiles filled by 16- or 4-byte copies (mma_stage.cuh: both the copies and the fragment loads
//   free of bank conflicts) instead of 19's XOR swizzle, which needs 16-byte copies, so rows of
//   any alignment are copied as they are.
// - The epilogue goes through shared memory: the accumulators (two columns a lane in each row of
//   an MMA tile) are written to a C tile there and read back as float4 groups, the unit the
//   slices' partials (grid_slices.cuh) and tile_store.cuh's stores work in.
// Any M, N, K, alpha, beta. PRODUCTS 1: TF32 products (cvt.rna), FP32 accumulation: TF32
// accuracy (conf/kernel/gemm_mma_tf32.yaml). PRODUCTS 3: 3xTF32 (chapter 23 teaches it): each
// fragment value split in registers into two TF32 values, big + small, and three products a step
// (small x big, big x small, big x big); each k tile's products summed apart and added into the
// FP32 total, as 23's promotion does, since a tensor-core sum over a long K drifts past FP32's
// tolerance: FP32 accuracy, for the narrow products with a long K where gemm_3xtf32's 64-row wgmma
// tiles sit half empty (conf/kernel/gemm_mma_3xtf32.yaml). A's 16-byte copies need K % 4 == 0
// (VEC_A 4), B's and C's float4 stores N % 4 == 0 (VEC 4), else 4-byte ones.
// Element indices are 32-bit: the runner requires each matrix to hold fewer than 2^31 elements.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, one K slice (grid.y) in k tiles of BK, STAGES stages
//   warp tile   WM x WN of 16 x 8 MMA tiles (WM / 16 x WN / 8 a warp, 4 accumulators each a lane)
#include "../include/common.cuh"
#include "../include/cp_async.cuh"
#include "../include/grid_slices.cuh"
#include "../include/mma_stage.cuh"
#include "../include/tile_store.cuh"
#include "../include/mma_tf32.cuh"

template <int BM, int BN, int BK, int WM, int WN, int THREADS, int STAGES, int VEC_A, int VEC,
          int PRODUCTS>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_mma_tf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                  const float* __restrict__ B, float beta, float* __restrict__ C,
                  float* __restrict__ workspace) {
  constexpr int MI = WM / 16, NI = WN / 8;           // MMA tiles a warp
  constexpr int AS_STRIDE = BK + 4, BS_STRIDE = BN + 8;  // As[m][k], Bs[k][n] (mma_stage.cuh)
  constexpr int AS_SIZE = BM * AS_STRIDE, BS_SIZE = BK * BS_STRIDE;
  constexpr int STAGE_FLOATS = AS_SIZE + BS_SIZE;
  constexpr int CS_STRIDE = BN + 4;                  // the epilogue's C tile (float4 rows)
  constexpr int GROUPS = BM * BN / 4 / THREADS;      // float4 groups of C a thread stores
  static_assert(THREADS == 32 * (BM / WM) * (BN / WN), "one warp per warp tile");
  static_assert(BM * BN % (4 * THREADS) == 0, "the C tile splits into whole float4 groups a thread");
  static_assert(BK % 8 == 0 && WM % 16 == 0 && WN % 8 == 0, "whole MMA tiles and k steps");
  static_assert(PRODUCTS == 1 || PRODUCTS == 3, "TF32 (1 product) or 3xTF32 (3)");
  extern __shared__ __align__(16) float smem[];

  const GridSlice at = grid_slice<BM, BN, BK>(N, K);  // the tile (grid.x), the K slice (grid.y)
  const int block_row = at.block_row, block_col = at.block_col, kt0 = at.kt0, k_tiles = at.k_tiles;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = (warp / (BN / WN)) * WM, warp_n = (warp % (BN / WN)) * WN;
  const int g = lane / 4, t = lane % 4;

  auto copy_tile = [&](int s) {  // the slice's k tile s into stage s % STAGES
    float* as = smem + (s % STAGES) * STAGE_FLOATS;
    copy_mma_stage<BM, BN, BK, VEC_A, VEC, THREADS>(A, B, M, N, K, as, as + AS_SIZE, block_row,
                                                     block_col, (kt0 + s) * BK);
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // Prologue: STAGES - 1 tiles in flight; each step then waits for its tile, meets the block,
  // refills the stage the previous step read with the tile STAGES - 1 ahead, and runs its MMAs.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) copy_tile(s);
    cp_async_commit();
  }
  for (int s = 0; s < k_tiles; ++s) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (s + STAGES - 1 < k_tiles) copy_tile(s + STAGES - 1);
    cp_async_commit();
    // lane (g, t): A at rows warp_m + 16i + g (+ 8), k kk + t (+ 4); B at k kk + t (+ 4),
    // columns warp_n + 8j + g
    const float* as = smem + (s % STAGES) * STAGE_FLOATS + (warp_m + g) * AS_STRIDE + t;
    const float* bs = smem + (s % STAGES) * STAGE_FLOATS + AS_SIZE + t * BS_STRIDE + warp_n + g;
    // 3xTF32: this k tile's products, added into acc below; TF32: acc itself
    float part[PRODUCTS == 3 ? MI : 1][PRODUCTS == 3 ? NI : 1][4];
    if constexpr (PRODUCTS == 3) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      unsigned a[MI][4], b[NI][2], a_small[MI][4], b_small[NI][2];  // small: 3xTF32 only
      auto load = [&](float x, unsigned& big, unsigned& small) {
        if constexpr (PRODUCTS == 3) {
          tf32_split_bits(x, big, small);
        } else {
          big = tf32_bits(x);
        }
      };
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        load(as[i * 16 * AS_STRIDE + kk], a[i][0], a_small[i][0]);
        load(as[(i * 16 + 8) * AS_STRIDE + kk], a[i][1], a_small[i][1]);
        load(as[i * 16 * AS_STRIDE + kk + 4], a[i][2], a_small[i][2]);
        load(as[(i * 16 + 8) * AS_STRIDE + kk + 4], a[i][3], a_small[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        load(bs[kk * BS_STRIDE + j * 8], b[j][0], b_small[j][0]);
        load(bs[(kk + 4) * BS_STRIDE + j * 8], b[j][1], b_small[j][1]);
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          if constexpr (PRODUCTS == 3) {  // the small products first, then the big one
            mma_m16n8k8_tf32(part[i][j], a_small[i], b[j]);
            mma_m16n8k8_tf32(part[i][j], a[i], b_small[j]);
            mma_m16n8k8_tf32(part[i][j], a[i], b[j]);
          } else {
            mma_m16n8k8_tf32(acc[i][j], a[i], b[j]);
          }
        }
    }
    if constexpr (PRODUCTS == 3) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: the C tile reuses their memory

  // The accumulators into a C tile in shared memory (lane (g, t): two columns in rows g and g + 8
  // of each MMA tile), then back as the float4 groups this thread stores.
  float* cs = smem;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int row = warp_m + i * 16 + g, col = warp_n + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(&cs[row * CS_STRIDE + col]) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(&cs[(row + 8) * CS_STRIDE + col]) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  __syncthreads();
  float v[GROUPS][4];
#pragma unroll
  for (int q = 0; q < GROUPS; ++q) {
    const int group = threadIdx.x + q * THREADS, row = group / (BN / 4), col = (group % (BN / 4)) * 4;
    const float4 c = *reinterpret_cast<const float4*>(&cs[row * CS_STRIDE + col]);
    v[q][0] = c.x; v[q][1] = c.y; v[q][2] = c.z; v[q][3] = c.w;
  }
  auto for_each_fragment = [&](auto&& visit) {
#pragma unroll
    for (int q = 0; q < GROUPS; ++q) {
      const int group = threadIdx.x + q * THREADS;
      visit(group / (BN / 4), (group % (BN / 4)) * 4, v[q]);
    }
  };

  if (!add_up_grid_slices<BM, BN>(workspace, for_each_fragment)) return;  // K slices: the last adds
  for_each_fragment([&](int tile_row, int tile_col, float* c) {
    store_axpby_group<VEC>(C, M, N, block_row + tile_row, block_col + tile_col, c, alpha, beta);
  });
}
