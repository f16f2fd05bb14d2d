// mma_tf32.cuh: the warp-level TF32 MMA of the library's non-TMA TF32 kernel (gemm/mma_tf32.cu):
// mma.sync m16n8k8 (sm_80+) and its operands rounded from FP32. Chapter 19 teaches the fragment
// layout: lane (g = lane / 4, t = lane % 4) holds A(g, t), A(g + 8, t), A(g, t + 4),
// A(g + 8, t + 4); B(t, g), B(t + 4, g); and accumulators C(g, 2t), C(g, 2t + 1), C(g + 8, 2t),
// C(g + 8, 2t + 1).
#ifndef SGEMM_LAB_MMA_TF32_CUH
#define SGEMM_LAB_MMA_TF32_CUH

// FP32 -> TF32 bits, round to nearest with ties away (cvt.rna), as cuBLAS's TF32 mode rounds.
// wgmma.cuh has the same conversion for the TMA kernels; it is not shared from one header because
// a kernel's measurements are keyed by its whole expanded source, which moving it would change.
__device__ __forceinline__ unsigned tf32_bits(float x) {
  unsigned bits;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(bits) : "f"(x));
  return bits;
}

// 3xTF32: x = big + small (+ at most 2^-22 |x|), both TF32 bits (tf32_split.cuh's split for
// the wgmma kernels, where the error analysis is).
__device__ __forceinline__ void tf32_split_bits(float x, unsigned& big, unsigned& small) {
  big = tf32_bits(x);
  small = tf32_bits(x - __uint_as_float(big));
}

// acc (a 16 x 8 tile, FP32) += A (16 x 8, a[4]) * B (8 x 8, b[2]), TF32 operands.
__device__ __forceinline__ void mma_m16n8k8_tf32(float* acc, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif  // SGEMM_LAB_MMA_TF32_CUH
