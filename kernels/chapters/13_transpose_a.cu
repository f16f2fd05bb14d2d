// 13 seed 004, step 1: the "beating cuBLAS" chain's tiling kernel with A transposed in shared memory.
//
// The seed-004 chain (13-16) starts again from a plain 128 x 128 x 16 tiling kernel, written the
// way seed 004 wrote it: 256 threads as 8 warps in a 2 x 4 grid, each warp a 64 x 32 warp tile,
// each lane an 8 x 8 thread tile (8 lanes down, 4 across). Its geometry is fixed, as in the seed.
// What changed from the seed's starting kernel (and how it differs from our 06):
// - A is stored transposed (As[k][m]) so a lane's 8 values of A for one k are two LDS.128
//   instead of eight LDS.32; B was already row-major, two LDS.128.
// - Each thread loads two float4s of A (rows r and r + 64) and two of B (rows r and r + 8) per
//   K step, with every 4 threads covering one 16-float row of A: coalesced global reads.
// - The price, which 14 removes: the transposing scalar stores into As hit 4-way bank conflicts
//   (a warp's 32 stores go to 8 rows m x 4 k-groups, and the rows of As are 128 floats, so the 4
//   k-groups of one m share a bank).
// Predicted effect (seed 004, RTX 5060 Laptop): 18.76 -> 16.44 ms, 0.80 -> 0.91 of cuBLAS.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  128 x 128, k tiles of 16; warp tile 64 x 32 (2 x 4 warps); thread tile 8 x 8.
//   Needs M, N multiples of 128 and K a multiple of 16.
#include "../include/common.cuh"

__global__ void __launch_bounds__(256)
sgemm_transpose_a(int M, int N, int K, float alpha, const float* __restrict__ A,
                  const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int BM = 128, BN = 128, BK = 16, TM = 8, TN = 8;
  __shared__ __align__(16) float As[BK][BM];  // transposed
  __shared__ __align__(16) float Bs[BK][BN];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int load_a_row = tid / 4;             // 0..63 (and + 64)
  const int load_a_col = (tid % 4) * 4;       // 0, 4, 8, 12
  const int load_b_row = tid / 32;            // 0..7 (and + 8)
  const int load_b_col = (tid % 32) * 4;      // 0..124
  const int c_row = (warp / 4) * 64 + (lane / 4) * 8;  // warp tile row + lane row
  const int c_col = (warp % 4) * 32 + (lane % 4) * 8;  // warp tile col + lane col

  A += blockIdx.y * BM * K;
  B += blockIdx.x * BN;
  C += blockIdx.y * BM * N + blockIdx.x * BN;

  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    const float4 a0 = load_float4(&A[load_a_row * K + k0 + load_a_col]);
    const float4 a1 = load_float4(&A[(load_a_row + 64) * K + k0 + load_a_col]);
    As[load_a_col + 0][load_a_row] = a0.x;
    As[load_a_col + 1][load_a_row] = a0.y;
    As[load_a_col + 2][load_a_row] = a0.z;
    As[load_a_col + 3][load_a_row] = a0.w;
    As[load_a_col + 0][load_a_row + 64] = a1.x;
    As[load_a_col + 1][load_a_row + 64] = a1.y;
    As[load_a_col + 2][load_a_row + 64] = a1.z;
    As[load_a_col + 3][load_a_row + 64] = a1.w;
    store_float4(&Bs[load_b_row][load_b_col], load_float4(&B[(k0 + load_b_row) * N + load_b_col]));
    store_float4(&Bs[load_b_row + 8][load_b_col],
                 load_float4(&B[(k0 + load_b_row + 8) * N + load_b_col]));
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      *reinterpret_cast<float4*>(&a[0]) = load_float4(&As[k][c_row]);
      *reinterpret_cast<float4*>(&a[4]) = load_float4(&As[k][c_row + 4]);
      *reinterpret_cast<float4*>(&b[0]) = load_float4(&Bs[k][c_col]);
      *reinterpret_cast<float4*>(&b[4]) = load_float4(&Bs[k][c_col + 4]);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    store_axpby4(&C[(c_row + i) * N + c_col], &acc[i][0], alpha, beta);
    store_axpby4(&C[(c_row + i) * N + c_col + 4], &acc[i][4], alpha, beta);
  }
}
