// c_prefetch.cuh: a block's box of the old C requested into L2 before its epilogue, so that with
// beta != 0 the epilogue's reads of C find it there instead of waiting a DRAM round trip after the
// main loop (at a short K the epilogue's traffic is most of the kernel's).
#ifndef SGEMM_LAB_C_PREFETCH_CUH
#define SGEMM_LAB_C_PREFETCH_CUH
#include "cp_async.cuh"

// Rows [row0, row_end) x columns [col0, col_end) of C (both ends already clipped to M and N), one
// `prefetch.global.L2` per 128-byte line, the lines spread over THREADS threads (thread: this
// one's index among them).
template <int THREADS>
__device__ __forceinline__ void prefetch_c_box(const float* C, int N, int row0, int row_end,
                                               int col0, int col_end, int thread) {
  if (col_end <= col0 || row_end <= row0) return;
  const int lines = (col_end - col0 + 31) / 32 + 1;  // a row's columns from any 4-byte offset
  for (int i = thread; i < (row_end - row0) * lines; i += THREADS) {
    const int row = row0 + i / lines;
    const float* first = C + (size_t)row * N + col0;
    const unsigned long long line =
        (reinterpret_cast<unsigned long long>(first) & ~127ull) + 128ull * (i % lines);
    if (line <= reinterpret_cast<unsigned long long>(first + (col_end - col0) - 1))
      asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// Rows [row0, row_end) x columns [col0, col_end) of C copied into `tile` (row r at
// tile + r * STRIDE) with 16-byte cp.async spread over THREADS threads; N % 4 == 0 and
// col0 % 4 == 0, so every chunk is 16-byte aligned and inside its row. The caller arrives on a
// barrier when its copies land (cp_async_mbar_arrive).
template <int STRIDE, int THREADS>
__device__ __forceinline__ void copy_c_box(float* tile, const float* C, int N, int row0,
                                           int row_end, int col0, int col_end, int thread) {
  const int chunks = (col_end - col0) / 4;  // whole chunks: col_end is N or col0 + BN
  if (chunks <= 0) return;
  for (int i = thread; i < (row_end - row0) * chunks; i += THREADS) {
    const int r = i / chunks, c = 4 * (i % chunks);
    cp_async_16(tile + r * STRIDE + c, C + (size_t)(row0 + r) * N + col0 + c, 16);
  }
}

#endif  // SGEMM_LAB_C_PREFETCH_CUH
