// common.cuh: the basics every chapter shares: CEIL_DIV, the alpha / beta epilogue (one element
// or a float4 of them), 16-byte float4 views, and a compile-time loop.
//
// Every kernel computes C = alpha * A @ B + beta * C on row-major FP32 matrices,
// A is M x K, B is K x N, C is M x N, with the same argument list:
//   (int M, int N, int K, float alpha, const float* A, const float* B, float beta, float* C)
// What only some chapters need lives in its own header next to this one (tile_order.cuh,
// split_k.cuh, cp_async.cuh, ffma_stage.cuh, ffma_thread_tile.cuh, mbarrier.cuh, warpgroup.cuh,
// cluster.cuh, tma.cuh, wgmma.cuh; see kernels/README.md), and each chapter includes what it uses.
// The runner (src/job/compile.py expand_source) pastes a chapter's local includes into its source,
// recursively, before handing it to NVRTC, so the compiled text (and CuPy's cache key) is
// self-contained. A header reached twice (a chapter including two headers that both include
// this one) is pasted once, at its first include; each header still carries an include guard
// (not #pragma once, which means nothing once everything is one file).
#ifndef SGEMM_LAB_COMMON_CUH
#define SGEMM_LAB_COMMON_CUH

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// The epilogue, C = alpha * acc + beta * C. BLAS convention: when beta == 0, C is output-only
// and is never read, so whatever it held before (uninitialised memory, NaN) cannot leak into the
// result; 0 * NaN would be NaN. It also saves the read of C. The branch is uniform across the grid.
__device__ __forceinline__ void store_axpby(float* c, float acc, float alpha, float beta) {
  *c = (beta == 0.0f) ? alpha * acc : alpha * acc + beta * *c;
}

// 16-byte views of 4 consecutive floats. The address must be 16-byte aligned:
// kernels that use them list `n % 4 == 0` / `k % 4 == 0` among their constraints.
__device__ __forceinline__ float4 load_float4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store_float4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

// A loop over I = BEGIN .. END-1 whose body gets I as a compile-time constant (Int<I>::value),
// for bodies that instantiate templates with it (e.g. lds128's offset).
template <int V>
struct Int {
  static constexpr int value = V;
};
template <int BEGIN, int END, typename Body>
__device__ __forceinline__ void static_for(Body&& body) {
  if constexpr (BEGIN < END) {
    body(Int<BEGIN>{});
    static_for<BEGIN + 1, END>(body);
  }
}

// store_axpby for 4 consecutive elements of C (16-byte aligned), acc[0..3] the accumulators.
__device__ __forceinline__ void store_axpby4(float* c, const float* acc, float alpha, float beta) {
  float4 v;
  if (beta == 0.0f) {
    v = make_float4(alpha * acc[0], alpha * acc[1], alpha * acc[2], alpha * acc[3]);
  } else {
    v = load_float4(c);
    v.x = alpha * acc[0] + beta * v.x;
    v.y = alpha * acc[1] + beta * v.y;
    v.z = alpha * acc[2] + beta * v.z;
    v.w = alpha * acc[3] + beta * v.w;
  }
  store_float4(c, v);
}

// The j-th component of a float4; j must be a compile-time constant after unrolling, so the
// selection folds away and no register array is indexed at run time (no local memory).
__device__ __forceinline__ float component(const float4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

#endif  // SGEMM_LAB_COMMON_CUH
