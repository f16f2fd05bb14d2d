// 18 wmma_tf32: the same FP32 inputs, multiplied on the tensor cores in TF32 (seed 001's last
// step), through the CUDA C++ WMMA API.
//
// What changed from the FP32 chapters: the inner product is no longer FFMAs. Each warp owns a
// warp tile of C held as 16 x 16 accumulator fragments (FP32); per k step of 8 it loads 16 x 8
// fragments of A and 8 x 16 fragments of B from shared memory and issues one
// wmma::mma_sync (m16n16k8, TF32 inputs, FP32 accumulation) per accumulator fragment: the
// tensor cores do 16 x 16 x 8 multiply-adds per instruction where an FFMA does one.
// Why TF32 is different arithmetic: TF32 keeps FP32's 8-bit exponent but only 10 mantissa bits,
// so each product is rounded (relative error about 2^-11) and the result is checked against the
// TF32 tolerance (bench.tolerance.tf32). The inputs stay FP32 in memory; each fragment element
// is rounded to TF32 in the kernel with wmma::__float_to_tf32 (cvt.rna.tf32.f32: round to
// nearest, ties away from zero), as cuBLAS's TF32 mode rounds its FP32 inputs.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK (A and B staged in shared memory, float4 global loads)
//   warp tile   WM x WN of 16 x 16 accumulator fragments (a fragment's elements are spread over
//               the warp's 32 lanes in an unspecified layout, which is why the epilogue goes
//               through a small per-warp shared-memory tile before the alpha/beta store)
// Needs M, N, K multiples of the block tile (no edge handling: that is the later chapters' work).
#include "../include/common.cuh"
#include <mma.h>

template <int BM, int BN, int BK, int WM, int WN, int THREADS>
__global__ void sgemm_wmma_tf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                    const float* __restrict__ B, float beta, float* __restrict__ C) {
  using namespace nvcuda;
  constexpr int FM = WM / 16, FN = WN / 16;           // accumulator fragments per warp
  constexpr int WARPS_N = BN / WN;
  constexpr int A_LD = BK + 4, B_LD = BN + 4;          // padded rows (multiples of 4 floats)
  __shared__ __align__(32) float As[BM * A_LD];
  __shared__ __align__(32) float Bs[BK * B_LD];
  __shared__ __align__(32) float stage[THREADS / 32][16 * 16];  // epilogue, one tile per warp

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = (warp / WARPS_N) * WM, warp_col = (warp % WARPS_N) * WN;
  const float* a_block = A + (size_t)blockIdx.y * BM * K;
  const float* b_block = B + (size_t)blockIdx.x * BN;

  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int k0 = 0; k0 < K; k0 += BK) {
    // Block tile: A (BM x BK) and B (BK x BN) as float4s, every thread the same number.
#pragma unroll
    for (int f = threadIdx.x; f < BM * BK / 4; f += THREADS) {
      const int r = f / (BK / 4), c = (f % (BK / 4)) * 4;
      store_float4(&As[r * A_LD + c], load_float4(a_block + (size_t)r * K + k0 + c));
    }
#pragma unroll
    for (int f = threadIdx.x; f < BK * BN / 4; f += THREADS) {
      const int r = f / (BN / 4), c = (f % (BN / 4)) * 4;
      store_float4(&Bs[r * B_LD + c], load_float4(b_block + (size_t)(k0 + r) * N + c));
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        wmma::load_matrix_sync(a[i], &As[(warp_row + i * 16) * A_LD + kk], A_LD);
#pragma unroll
        for (int t = 0; t < a[i].num_elements; ++t) a[i].x[t] = wmma::__float_to_tf32(a[i].x[t]);
      }
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::load_matrix_sync(b[j], &Bs[kk * B_LD + warp_col + j * 16], B_LD);
#pragma unroll
        for (int t = 0; t < b[j].num_elements; ++t) b[j].x[t] = wmma::__float_to_tf32(b[j].x[t]);
      }
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Epilogue: each fragment through the warp's 16 x 16 staging tile, then C = alpha acc + beta C
  // with each lane storing 8 consecutive elements of one row (two float4s).
  float* tile = stage[warp];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(tile, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const int r = lane / 2, c = (lane % 2) * 8;
      float* out = C + (size_t)(blockIdx.y * BM + warp_row + i * 16 + r) * N +
                   blockIdx.x * BN + warp_col + j * 16 + c;
      store_axpby4(out, &tile[r * 16 + c], alpha, beta);
      store_axpby4(out + 4, &tile[r * 16 + c + 4], alpha, beta);
      __syncwarp();
    }
}
