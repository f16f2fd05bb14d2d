// Peer: CUTLASS's own 3xTF32 GEMM (conf/kernel/cutlass_3xtf32.yaml), built by
// src/job/cutlass_build.py with nvcc against the headers of the nvidia-cutlass wheel into a
// shared library that src/job/cutlass_gemm.py loads with ctypes.
//
// The kernel is cutlass::gemm::device::Gemm with arch::OpMultiplyAddFastF32: the "fast accurate"
// 3xTF32 path of CUTLASS's examples/27_ampere_3xtf32_fast_accurate_tensorop_gemm (each operand
// split into a TF32 big and small part, three mma.sync.m16n8k8.tf32 per step, FP32 accumulate).
// It is Sm80 tensor-core code; sm_90 runs it. Row-major A (M x K, lda = K), B (K x N, ldb = N),
// C (M x N, ldc = N): C = alpha * A @ B + beta * C, in place.
//
// Four instantiations, chosen per call by one rule (`choose`, documented there):
// two tiles (the CUTLASS profiler's first 3xTF32 tile, 128x128x16 in 8 warps of 32x64, 4
// stages; and 64x64x16 in 4 warps of 32x32, 3 stages, for problems too small to fill the GPU
// with the large tile) times two alignments (4 floats = 16-byte cp.async when the leading
// dimensions and the pointers allow it; 1 float, any M, N, K, otherwise).

#include <cstdint>

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm.h"
#include "cutlass/epilogue/thread/linear_combination.h"

namespace {

using Row = cutlass::layout::RowMajor;

template <int TileM, int TileN, int WarpM, int WarpN, int Stages, int Align>
using Gemm3xTF32 = cutlass::gemm::device::Gemm<
    float, Row, float, Row, float, Row, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TileM, TileN, 16>,
    cutlass::gemm::GemmShape<WarpM, WarpN, 16>,
    cutlass::gemm::GemmShape<16, 8, 8>,
    cutlass::epilogue::thread::LinearCombination<float, Align, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>,
    Stages, Align, Align,
    false,  // no serial split-K: no workspace
    cutlass::arch::OpMultiplyAddFastF32>;

using LargeAligned = Gemm3xTF32<128, 128, 32, 64, 4, 4>;
using LargeAny = Gemm3xTF32<128, 128, 32, 64, 4, 1>;
using SmallAligned = Gemm3xTF32<64, 64, 32, 32, 3, 4>;
using SmallAny = Gemm3xTF32<64, 64, 32, 32, 3, 1>;

const char* const kNames[4] = {
    "128x128x16 warp 32x64x16 stages 4 align 4",
    "128x128x16 warp 32x64x16 stages 4 align 1",
    "64x64x16 warp 32x32x16 stages 3 align 4",
    "64x64x16 warp 32x32x16 stages 3 align 1",
};

int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

// The rule: the large tile when its tiles alone fill every SM once (ceil(M/128) * ceil(N/128) >=
// SMs), else the small one (more, smaller blocks); alignment 4 when K and N are multiples of 4
// and A, B and C start on 16-byte boundaries (every row then does; CuPy allocations are
// 256-byte aligned), else 1. The pointers are checked here because can_implement checks an
// address only modulo the alignment in elements (4 bytes), not the 16 bytes cp.async needs.
int choose(int M, int N, int K, int sms, bool pointers_aligned) {
  bool large = static_cast<long long>((M + 127) / 128) * ((N + 127) / 128) >= sms;
  bool aligned = K % 4 == 0 && N % 4 == 0 && pointers_aligned;
  return (large ? 0 : 2) + (aligned ? 0 : 1);
}

template <typename Gemm>
int run(int M, int N, int K, float alpha, const float* A, const float* B, float beta, float* C,
        cudaStream_t stream) {
  typename Gemm::Arguments args({M, N, K}, {A, K}, {B, N}, {C, N}, {C, N}, {alpha, beta});
  cutlass::Status status = Gemm::can_implement(args);
  if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
  if (Gemm::get_workspace_size(args) != 0) {
    return static_cast<int>(cutlass::Status::kErrorWorkspaceNull);
  }
  Gemm gemm;
  return static_cast<int>(gemm(args, nullptr, stream));
}

}  // namespace

extern "C" {

// The current device's SM count (0 without a device), the rule's input.
int cutlass_3xtf32_sms() { return sm_count(); }

// Which instantiation cutlass_3xtf32_gemm runs at M x N x K on a device of `sms` SMs (0-3),
// `pointers_aligned` (0 or 1) saying whether A, B and C all start on 16-byte boundaries.
int cutlass_3xtf32_choose(int M, int N, int K, int sms, int pointers_aligned) {
  return choose(M, N, K, sms, pointers_aligned != 0);
}

const char* cutlass_3xtf32_config_name(int choice) {
  return choice >= 0 && choice < 4 ? kNames[choice] : "?";
}

// C = alpha * A @ B + beta * C on `stream` (a cudaStream_t; 0: the legacy default stream).
// Returns cutlass::Status as int (0: kSuccess).
int cutlass_3xtf32_gemm(int M, int N, int K, float alpha, const float* A, const float* B,
                        float beta, float* C, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  bool pointers_aligned = ((address(A) | address(B) | address(C)) % 16) == 0;
  switch (choose(M, N, K, sm_count(), pointers_aligned)) {
    case 0: return run<LargeAligned>(M, N, K, alpha, A, B, beta, C, s);
    case 1: return run<LargeAny>(M, N, K, alpha, A, B, beta, C, s);
    case 2: return run<SmallAligned>(M, N, K, alpha, A, B, beta, C, s);
    default: return run<SmallAny>(M, N, K, alpha, A, B, beta, C, s);
  }
}

// cutlass::Status's name (cutlass::cutlassGetStatusString), for error messages.
const char* cutlass_3xtf32_status_string(int status) {
  return cutlass::cutlassGetStatusString(static_cast<cutlass::Status>(status));
}

}  // extern "C"
