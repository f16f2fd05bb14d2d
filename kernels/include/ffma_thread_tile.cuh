// ffma_thread_tile.cuh: the FFMA thread tile of 21 and 22, read from a shared-memory stage laid
// out as ffma_stage.cuh writes it (A transposed, As[k][m]; B as stored, Bs[k][n]): per k the
// lane's fragments (TM / 4 + TN / 4 LDS.128 with the k offset in the instruction), the outer
// product in the chosen FFMA order, and the walk over the lane's accumulators for the epilogue.
#ifndef SGEMM_LAB_FFMA_THREAD_TILE_CUH
#define SGEMM_LAB_FFMA_THREAD_TILE_CUH
#include "common.cuh"

// A 16-byte shared-memory load at a shared-window address plus a compile-time byte offset: the
// offset stays in the instruction (LDS.128 [R+imm]), so unrolled loops over k need one address
// register instead of one per load. volatile keeps it ordered with the barriers around it.
template <int OFFSET>
__device__ __forceinline__ float4 lds128(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4 + %5];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr), "n"(OFFSET));
  return v;
}

// The thread tile of the FFMA chapters (21, 22): TM x TN accumulators, fed per k by TM / 4 + TN / 4
// LDS.128 (A transposed in shared memory, As[k][m]; B as stored, Bs[k][n]). A lane's float4
// groups are LANE_ROWS * 4 rows (LANE_COLS * 4 columns) apart, so a warp reads whole row pieces.
// Fragments of one k from the stage addresses a_addr / b_addr plus the k's byte offsets A_OFFSET /
// B_OFFSET, which stay in the instructions (lds128).
template <int TM, int TN, int LANE_ROWS, int LANE_COLS, int A_OFFSET, int B_OFFSET>
__device__ __forceinline__ void load_ffma_fragments(float (&frag_a)[TM], float (&frag_b)[TN],
                                                    unsigned a_addr, unsigned b_addr) {
  static_for<0, TM / 4>([&](auto g_const) {
    constexpr int g = decltype(g_const)::value;
    const float4 v = lds128<A_OFFSET + 16 * g * LANE_ROWS>(a_addr);
    frag_a[g * 4 + 0] = v.x; frag_a[g * 4 + 1] = v.y;
    frag_a[g * 4 + 2] = v.z; frag_a[g * 4 + 3] = v.w;
  });
  static_for<0, TN / 4>([&](auto h_const) {
    constexpr int h = decltype(h_const)::value;
    const float4 v = lds128<B_OFFSET + 16 * h * LANE_COLS>(b_addr);
    frag_b[h * 4 + 0] = v.x; frag_b[h * 4 + 1] = v.y;
    frag_b[h * 4 + 2] = v.z; frag_b[h * 4 + 3] = v.w;
  });
}
// The outer product of one k. FMA_ORDER 1: row by row (the A value shared by consecutive FFMAs);
// 2: 4-row groups against column pairs, turning at each pair (cuBLAS's order); 3: serpentine
// rows (also the B value shared at each turn).
template <int FMA_ORDER, int TM, int TN>
__device__ __forceinline__ void ffma_outer_product(float (&acc)[TM][TN], const float (&frag_a)[TM],
                                                   const float (&frag_b)[TN]) {
  if (FMA_ORDER == 2) {
#pragma unroll
    for (int g = 0; g < TM / 4; ++g)
#pragma unroll
      for (int p = 0; p < TN / 2; ++p)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = g * 4 + ((p & 1) ? (q + 2) % 4 : q);
#pragma unroll
          for (int e = 0; e < 2; ++e) acc[r][2 * p + e] += frag_a[r] * frag_b[2 * p + e];
        }
  } else {
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int cc = 0; cc < TN; ++cc) {
        const int c = (FMA_ORDER == 3 && (r & 1)) ? TN - 1 - cc : cc;
        acc[r][c] += frag_a[r] * frag_b[c];
      }
  }
}
// visit(row, col, v) for each float4 of accumulators v at (row, col) of the block tile, in
// float4 order (f = (g * 4 + e) * (TN / 4) + h); the lane's first float4 is at (row0, col0).
template <int LANE_ROWS, int LANE_COLS, int TM, int TN, typename Visit>
__device__ __forceinline__ void for_each_ffma_fragment(float (&acc)[TM][TN], int row0, int col0,
                                                       Visit&& visit) {
#pragma unroll
  for (int g = 0; g < TM / 4; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int h = 0; h < TN / 4; ++h)
        visit(row0 + g * LANE_ROWS * 4 + e, col0 + h * LANE_COLS * 4, &acc[g * 4 + e][h * 4]);
}

#endif  // SGEMM_LAB_FFMA_THREAD_TILE_CUH
