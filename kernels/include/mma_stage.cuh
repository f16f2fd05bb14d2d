// mma_stage.cuh: one k tile of A and B copied into a shared-memory stage of the library's non-TMA
// TF32 kernel (gemm/mma_tf32.cu), both operands as stored: As[m][k] in rows of BK + 4 floats and
// Bs[k][n] in rows of BN + 8, by 16-byte cp.async where the rows allow it (VEC_A 4: K % 4 == 0;
// VEC_B 4: N % 4 == 0), else by 4-byte ones, so no operand needs a padded copy; edges zero-fill.
// The paddings keep both the copies' stores and the MMA fragment loads free of bank conflicts:
// consecutive threads store consecutive floats of a row, and lane (g, t) of a fragment load reads
// A at bank 4g + t (20g + t with BK 16) and B at bank 8t + g.
#ifndef SGEMM_LAB_MMA_STAGE_CUH
#define SGEMM_LAB_MMA_STAGE_CUH
#include "cp_async.cuh"

// A ROWS x COLS piece of a row-major matrix (`ld` floats a row; `src` its first element, of which
// rows_left rows and cols_left columns lie inside the matrix) into `dst` (DST_STRIDE floats a
// row), VEC floats a copy (4: the matrix's rows are 16-byte aligned and cols_left a multiple of
// 4, so a copy is all inside or all outside).
template <int ROWS, int COLS, int VEC, int DST_STRIDE, int THREADS>
__device__ __forceinline__ void copy_rows(const float* src, int ld, int rows_left, int cols_left,
                                          float* dst) {
  constexpr int PIECES = COLS / VEC;  // copies a row
  static_assert(ROWS * PIECES % THREADS == 0, "every thread makes the same number of copies");
#pragma unroll
  for (int l = 0; l < ROWS * PIECES / THREADS; ++l) {
    const int piece = threadIdx.x + l * THREADS;
    const int r = piece / PIECES, c = (piece % PIECES) * VEC;
    const bool inside = r < rows_left && c < cols_left;
    const float* from = src + (inside ? r * ld + c : 0);
    if (VEC == 4) cp_async_16(&dst[r * DST_STRIDE + c], from, inside ? 16 : 0);
    else cp_async_4(&dst[r * DST_STRIDE + c], from, inside ? 4 : 0);
  }
}

// The k tile from k0 of the block tile at (row0, col0): A's BM x BK piece, B's BK x BN piece.
template <int BM, int BN, int BK, int VEC_A, int VEC_B, int THREADS>
__device__ __forceinline__ void copy_mma_stage(const float* A, const float* B, int M, int N, int K,
                                               float* as, float* bs, int row0, int col0, int k0) {
  copy_rows<BM, BK, VEC_A, BK + 4, THREADS>(A + row0 * K + k0, K, M - row0, K - k0, as);
  copy_rows<BK, BN, VEC_B, BN + 8, THREADS>(B + k0 * N + col0, N, K - k0, N - col0, bs);
}

#endif  // SGEMM_LAB_MMA_STAGE_CUH
