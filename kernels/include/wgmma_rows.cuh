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

// m64nNk8 for N = 8 .. 56: D (64 x N, N / 2 registers per lane) += A (registers) * B (shared), the
// operands as wgmma.cuh describes them for N = 64.
template <>
__device__ __forceinline__ void wgmma_rs<8>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0,%1,%2,%3}, "
               "{%4, %5, %6, %7}, %8, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<8>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0,%1,%2,%3}, "
               "{%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
               "{%8, %9, %10, %11}, %12, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
               "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<24>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n24k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, "
               "{%12, %13, %14, %15}, %16, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<24>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n24k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, "
               "{%12, %13, %14, %15}, %16, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<32>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
               "{%16, %17, %18, %19}, %20, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<32>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
               "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<40>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n40k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, "
               "{%20, %21, %22, %23}, %24, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<40>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %25, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n40k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, "
               "{%20, %21, %22, %23}, %24, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<48>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
               "{%24, %25, %26, %27}, %28, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<48>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
               "{%24, %25, %26, %27}, %28, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<56>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n56k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27}, "
               "{%28, %29, %30, %31}, %32, 1, 1, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
               : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<56>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %33, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n56k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27}, "
               "{%28, %29, %30, %31}, %32, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
               : "memory");
}

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
