// wgmma_rows.cuh: a block tile of any multiple of 8 rows on wgmma's N side, for the library's
// kernels (gemm/tf32.cu, gemm/3xtf32.cu) whose `fit_m` sizes the tile to the shape: 19 rows run in
// a 24-row tile, 67 in a 72-row tile, instead of a 64-row one. wgmma.cuh has the m64n64/128/256k8
// forms the chapters use; this header adds m64n8k8 .. m64n56k8 and issues a tile of ROWS rows as
// pieces of 256, 128, 64 and the rest (72 = 64 + 8), each piece reading its rows of the same
// 128-byte-swizzled shared tile (8 rows are 1024 bytes, one swizzle period, so a piece starts in
// phase) into its own accumulators, which follow each other in the layout store_row_groups reads.
#ifndef SGEMM_LAB_WGMMA_ROWS_CUH
#define SGEMM_LAB_WGMMA_ROWS_CUH
#include "wgmma.cuh"

// Both forms of one m64nNk8 (always accumulating, and with the scale-d predicate): N, the "+f"
// accumulator operands (in parentheses), their placeholders, then those of A's four registers,
// of B's descriptor and of the predicate's value.
#define WGMMA_RS_UNWRAP(...) __VA_ARGS__
#define WGMMA_RS_FORMS(N, ACC, D, A, DESC, PRED)                                                 \
  template <>                                                                                    \
  __device__ __forceinline__ void wgmma_rs<N>(float* d, const unsigned* a, u64 desc_b) {        \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" D "}, {" A "}, "   \
                 DESC ", 1, 1, 1;\n"                                                             \
                 : WGMMA_RS_UNWRAP ACC                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)                       \
                 : "memory");                                                                    \
  }                                                                                              \
  template <>                                                                                    \
  __device__ __forceinline__ void wgmma_rs<N>(float* d, const unsigned* a, u64 desc_b,          \
                                              int accumulate) {                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                              \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" D "}, {" A "}, "    \
                 DESC ", p, 1, 1;\n}\n"                                                          \
                 : WGMMA_RS_UNWRAP ACC                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)      \
                 : "memory");                                                                    \
  }

// m64nNk8 for N = 8 .. 56: D (64 x N, N / 2 registers per lane) += A (registers) * B (shared), the
// operands as wgmma.cuh describes them for N = 64.
WGMMA_RS_FORMS(8, (WGMMA_ACC4(d, 0)),
               "%0,%1,%2,%3",
               "%4, %5, %6, %7", "%8", "%9")
WGMMA_RS_FORMS(16, (WGMMA_ACC4(d, 0), WGMMA_ACC4(d, 4)),
               "%0,%1,%2,%3,%4,%5,%6,%7",
               "%8, %9, %10, %11", "%12", "%13")
WGMMA_RS_FORMS(24, (WGMMA_ACC4(d, 0), WGMMA_ACC4(d, 4), WGMMA_ACC4(d, 8)),
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11",
               "%12, %13, %14, %15", "%16", "%17")
WGMMA_RS_FORMS(32, (WGMMA_ACC16(d, 0)),
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15",
               "%16, %17, %18, %19", "%20", "%21")
WGMMA_RS_FORMS(40, (WGMMA_ACC16(d, 0), WGMMA_ACC4(d, 16)),
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19",
               "%20, %21, %22, %23", "%24", "%25")
WGMMA_RS_FORMS(48, (WGMMA_ACC16(d, 0), WGMMA_ACC4(d, 16), WGMMA_ACC4(d, 20)),
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23",
               "%24, %25, %26, %27", "%28", "%29")
WGMMA_RS_FORMS(56, (WGMMA_ACC16(d, 0), WGMMA_ACC4(d, 16), WGMMA_ACC4(d, 20), WGMMA_ACC4(d, 24)),
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27",
               "%28, %29, %30, %31", "%32", "%33")

// D += A * (ROWS rows of the tile at `tile`, K-major, 128-byte swizzle) for ROWS a multiple of 8
// up to 256: the largest form that fits first, then the rest; d holds ROWS / 2 accumulators.
template <int ROWS>
__device__ __forceinline__ void wgmma_rows(float* d, const unsigned* a, unsigned tile) {
  static_assert(ROWS % 8 == 0 && ROWS >= 8 && ROWS <= 256, "wgmma's N: a multiple of 8 up to 256");
  constexpr int PIECE = ROWS >= 256 ? 256 : ROWS >= 128 ? 128 : ROWS >= 64 ? 64 : ROWS;
  wgmma_rs<PIECE>(d, a, smem_desc_k_sw128(tile));
  if constexpr (ROWS > PIECE) wgmma_rows<ROWS - PIECE>(d + PIECE / 2, a, tile + PIECE * 128);
}
// The same with the scale-d predicate (wgmma.cuh): each piece restarts or adds into its part of D.
template <int ROWS>
__device__ __forceinline__ void wgmma_rows(float* d, const unsigned* a, unsigned tile,
                                           int accumulate) {
  static_assert(ROWS % 8 == 0 && ROWS >= 8 && ROWS <= 256, "wgmma's N: a multiple of 8 up to 256");
  constexpr int PIECE = ROWS >= 256 ? 256 : ROWS >= 128 ? 128 : ROWS >= 64 ? 64 : ROWS;
  wgmma_rs<PIECE>(d, a, smem_desc_k_sw128(tile), accumulate);
  if constexpr (ROWS > PIECE)
    wgmma_rows<ROWS - PIECE>(d + PIECE / 2, a, tile + PIECE * 128, accumulate);
}

#endif  // SGEMM_LAB_WGMMA_ROWS_CUH
