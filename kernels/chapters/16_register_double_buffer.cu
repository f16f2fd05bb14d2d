// 16 seed 004, step 4: register-staged double buffering of the shared-memory tiles.
//
// What changed from 15:
// - Two copies of As and Bs. Each K step first issues the global loads of the next tile into
//   registers (4 float4s), then computes on the current buffer while they are in flight, then
//   writes them (transposed, swizzled) into the other buffer: one __syncthreads per K step
//   instead of two, and the global latency hidden behind 16 x 64 FFMAs per thread.
// - No cp.async (seed 004 deliberately used plain loads and stores); 12 is the cp.async version.
// - The 16 staging registers push the kernel past 128 registers per thread (137 without a cap),
//   which would leave one 256-thread block per SM. Seed 004 trimmed address variables by hand to
//   get back under 128; here __launch_bounds__(256, 2) asks the compiler for the same budget
//   (two blocks per SM), and the resource report confirms it fits without spilling.
// Predicted effect (seed 004): 15.52 -> 14.19 ms, 1.06x cuBLAS on an RTX 5060 Laptop GPU.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  128 x 128, k tiles of 16, two stages; warp tile 16 x 128;
//   thread tile 8 x (4 + 4). Needs M, N multiples of 128 and K a multiple of 16.
#include "../include/common.cuh"

// Column of element (k, m) of the transposed A tile: k's bits 2-3 XORed into m's bits 3-4.
__device__ __forceinline__ int swizzle_a(int k, int m) { return m ^ ((k >> 2) << 3); }

__global__ void __launch_bounds__(256, 2)  // <= 128 registers: two blocks per SM
sgemm_register_double_buffer(int M, int N, int K, float alpha, const float* __restrict__ A,
                  const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int BM = 128, BN = 128, BK = 16, TM = 8, TN = 8;
  __shared__ __align__(16) float As[2][BK][BM];  // transposed and swizzled: As[buf][k][swizzle_a(k, m)]
  __shared__ __align__(16) float Bs[2][BK][BN];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int load_a_row = tid / 4;             // 0..63 (and + 64)
  const int load_a_col = (tid % 4) * 4;       // 0, 4, 8, 12
  const int load_b_row = tid / 32;            // 0..7 (and + 8)
  const int load_b_col = (tid % 32) * 4;      // 0..124
  const int c_row = warp * 16 + (lane / 16) * 8;  // warp slice row + lane row
  const int c_col = (lane % 16) * 4;              // and c_col + 64

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += blockIdx.y * BM * N + blockIdx.x * BN;

  float acc[TM][TN] = {};
  float4 a0, a1, b0, b1;  // the next tile, staged in registers
  auto load_tile = [&](int k0) {
    a0 = load_float4(&A[load_a_row * K + k0 + load_a_col]);
    a1 = load_float4(&A[(load_a_row + 64) * K + k0 + load_a_col]);
    b0 = load_float4(&B[(k0 + load_b_row) * N + load_b_col]);
    b1 = load_float4(&B[(k0 + load_b_row + 8) * N + load_b_col]);
  };
  auto store_tile = [&](int buf) {
    As[buf][load_a_col + 0][swizzle_a(load_a_col + 0, load_a_row)] = a0.x;
    As[buf][load_a_col + 1][swizzle_a(load_a_col + 1, load_a_row)] = a0.y;
    As[buf][load_a_col + 2][swizzle_a(load_a_col + 2, load_a_row)] = a0.z;
    As[buf][load_a_col + 3][swizzle_a(load_a_col + 3, load_a_row)] = a0.w;
    As[buf][load_a_col + 0][swizzle_a(load_a_col + 0, load_a_row + 64)] = a1.x;
    As[buf][load_a_col + 1][swizzle_a(load_a_col + 1, load_a_row + 64)] = a1.y;
    As[buf][load_a_col + 2][swizzle_a(load_a_col + 2, load_a_row + 64)] = a1.z;
    As[buf][load_a_col + 3][swizzle_a(load_a_col + 3, load_a_row + 64)] = a1.w;
    store_float4(&Bs[buf][load_b_row][load_b_col], b0);
    store_float4(&Bs[buf][load_b_row + 8][load_b_col], b1);
  };

  load_tile(0);
  store_tile(0);
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += BK) {
    const int buf = (k0 / BK) & 1;
    const bool more = k0 + BK < K;
    if (more) load_tile(k0 + BK);  // in flight during the FFMAs below
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      *reinterpret_cast<float4*>(&a[0]) = load_float4(&As[buf][k][swizzle_a(k, c_row)]);
      *reinterpret_cast<float4*>(&a[4]) = load_float4(&As[buf][k][swizzle_a(k, c_row + 4)]);
      *reinterpret_cast<float4*>(&b[0]) = load_float4(&Bs[buf][k][c_col]);
      *reinterpret_cast<float4*>(&b[4]) = load_float4(&Bs[buf][k][c_col + 64]);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    if (more) store_tile(buf ^ 1);  // buffer buf ^ 1 was last read before the previous barrier
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    store_axpby4(&C[(c_row + i) * N + c_col], &acc[i][0], alpha, beta);
    store_axpby4(&C[(c_row + i) * N + c_col + 64], &acc[i][4], alpha, beta);
  }
}
