// ffma_stage.cuh: one k tile of A and B copied into a shared-memory stage of 21 and 22, A
// transposed on the way by 4-byte cp.async, B by VEC-float copies, edges zero-filled. Shared by
// 21 (every thread copies) and 22 (a producer warpgroup copies); ffma_thread_tile.cuh reads it.
#ifndef SGEMM_LAB_FFMA_STAGE_CUH
#define SGEMM_LAB_FFMA_STAGE_CUH
#include "cp_async.cuh"

// One k tile of A and B into a shared-memory stage, laid out as 21 and 22 read it: A transposed
// on the way (As[k][m]) by 4-byte copies, B as stored (Bs[k][n]) by VEC-float copies, COPIERS
// threads in all. BK threads share a row of A (consecutive k), so one copy instruction reads
// whole pieces of rows; COPIERS / BK threads share a k row of B. This thread copies A at row
// a_row + l * COPIERS / BK, k a_k (to a_dst, from element a_base + l * COPIERS / BK * K + kt * BK)
// and B at k b_k, column b_col + l * COPIERS / BK * VEC (to b_dst, from b_base + kt * BK * N + ..),
// into the stage at byte `offset`. Interior tiles (the block inside M and N, all BK k inside K:
// k_left >= BK) copy without predicates; at the edges a source outside the matrix copies 0 bytes
// from the matrix's first element (zero fill).
template <int BM, int BN, int BK, int VEC, int COPIERS>
__device__ __forceinline__ void copy_ffma_stage(const float* A, const float* B, int M, int N, int K,
                                                unsigned a_dst, unsigned b_dst, unsigned offset,
                                                unsigned a_base, unsigned b_base, int kt, int k_left,
                                                bool interior, int a_row, int a_k, int b_col, int b_k) {
  constexpr int A_ROW_STEP = COPIERS / BK;   // rows of A between a thread's copies
  constexpr int B_LANES = COPIERS / BK;      // threads per k row of B
  constexpr int A_COPIES = BM * BK / COPIERS;
  constexpr int B_COPIES = BK * BN / VEC / COPIERS;
  if (interior && k_left >= BK) {
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l)
      cp_async_4_shared(a_dst + offset + 4 * l * A_ROW_STEP, A + (a_base + l * A_ROW_STEP * K + kt * BK), 4);
    const float* b_src = B + (b_base + kt * BK * N);
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      if (VEC == 4) cp_async_16_shared(b_dst + offset + 16 * l * B_LANES, b_src + 4 * l * B_LANES, 16);
      else cp_async_4_shared(b_dst + offset + 4 * l * B_LANES, b_src + l * B_LANES, 4);
    }
  } else {
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l) {
      const bool inside = a_row + l * A_ROW_STEP < M && a_k < k_left;
      cp_async_4_shared(a_dst + offset + 4 * l * A_ROW_STEP,
                        A + (inside ? a_base + l * A_ROW_STEP * K + kt * BK : 0), inside ? 4 : 0);
    }
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      const bool inside = b_col + l * B_LANES * VEC < N && b_k < k_left;
      const float* src = B + (inside ? b_base + kt * BK * N + l * B_LANES * VEC : 0);
      if (VEC == 4) cp_async_16_shared(b_dst + offset + 16 * l * B_LANES, src, inside ? 16 : 0);
      else cp_async_4_shared(b_dst + offset + 4 * l * B_LANES, src, inside ? 4 : 0);
    }
  }
}

#endif  // SGEMM_LAB_FFMA_STAGE_CUH
