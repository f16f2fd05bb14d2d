// swizzled_rows.cuh: a stage's TMA boxes filled by the producer warpgroup's own cp.async copies,
// for operands whose rows the TMA cannot read: its tensor maps need a row stride of whole 16-byte
// chunks, so A with K % 4 != 0 and B with N % 4 != 0 otherwise need a padded copy first (a
// pre-pass that reads and writes the whole operand: 87 MB, ~29 us, at 67 x 3579 x 2991 on an
// H100, more than cuBLAS's whole GEMM there). Here each of the 4 producer warps copies rows of
// 32 floats (one 128-byte box row) with 4-byte cp.async, lane = column, into the layout the TMA
// would have written: 128-byte swizzle, the 16-byte chunk index XOR the row within its 1024-byte
// period (the stage must start 1024-byte aligned); zeros outside the matrix, as the TMA fills.
// Each producer thread's copies of a stage count as one arrival on the stage's full barrier
// (cp.async.mbarrier.arrive.noinc), so full[s] expects 1 + 128 arrivals (stream_ring_init).
// The producer issues ~(BM + BN) / 4 copies a thread a k tile next to the consumers' wgmmas, so
// a copy must cost little more than its cp.async: a first version that computed each address
// from (row, column) ran 2 to 3 times slower than the pre-pass (H100, 2026-11-27).
#ifndef SGEMM_LAB_SWIZZLED_ROWS_CUH
#define SGEMM_LAB_SWIZZLED_ROWS_CUH
#include "mbarrier.cuh"
#include "cp_async.cuh"

constexpr int STREAM_THREADS = 128;  // the producer warpgroup

// The ring's barriers when producer threads copy: full[s] counts the TMA thread's arrive (with
// its bytes, if any operand still goes through the TMA) and ARRIVALS per producer thread (one
// for each kind of copy it makes into a stage).
template <int STAGES, int CONSUMERS, int ARRIVALS = 1>
__device__ __forceinline__ void stream_ring_init(u64* full, u64* empty) {
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    mbar_init(&full[s], 1 + ARRIVALS * STREAM_THREADS);
    mbar_init(&empty[s], CONSUMERS * 4);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// ROWS box rows of 32 floats, BOXES boxes side by side (box b: columns 32 b .. 32 b + 31, at
// dst + 4096 b: 32 rows of 128 bytes), into the swizzled layout at `dst`. Warp `warp` copies
// rows warp, warp + 4, ...: `src` is this lane's element of row `warp` in box 0, `stride` the
// floats between rows, `rows_left` the matrix's rows from row `warp` on, bit b of `cols_ok`
// whether this lane's column of box b is inside the matrix (else zeros, nothing read). Row
// warp + 4 j lands at 128 (warp + 4 j) bytes with its chunk index XOR (warp + 4 (j & 1)): two
// base addresses, every other offset an immediate, so a copy costs a select and the cp.async.
template <int ROWS, int BOXES>
__device__ __forceinline__ void copy_swizzled_rows(unsigned dst, const float* src, size_t stride,
                                                   int rows_left, unsigned cols_ok, int warp,
                                                   int lane) {
  const unsigned within = (lane & 3) * 4, row_base = dst + warp * 128 + within;
  const unsigned even = row_base + ((((lane >> 2) ^ warp) & 7) << 4);
  const unsigned odd = row_base + ((((lane >> 2) ^ (warp + 4)) & 7) << 4);
#pragma unroll
  for (int j = 0; j < ROWS / 4; ++j) {
    const bool row_ok = 4 * j < rows_left;
#pragma unroll
    for (int b = 0; b < BOXES; ++b) {
      const bool ok = row_ok && ((cols_ok >> b) & 1);
      cp_async_4_shared((j & 1 ? odd : even) + j * 512 + b * 4096, src + 32 * b, ok ? 4 : 0);
    }
    src += 4 * stride;
  }
}

// After a stage's copies: the full barrier hears of them once they have landed.
__device__ __forceinline__ void stream_arrive(u64* full) { cp_async_mbar_arrive(full); }

// A consumer, after waiting for a stage that producer threads wrote: their writes are generic
// proxy, wgmma reads its shared-memory operand through the async proxy.
__device__ __forceinline__ void stream_fence_for_wgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#endif  // SGEMM_LAB_SWIZZLED_ROWS_CUH
