// 15 seed 004, step 3: a lane's 8 columns split into two float4 groups 64 apart, for coalescing.
//
// What changed from 14:
// - In 13/14 a lane owns 8 consecutive columns: neighbouring lanes write float4s 32 bytes apart,
//   so every 32-byte sector of a store instruction carries 16 useful bytes (the seed's profiler
//   warning), and the second store instruction sends the same sectors again. Now lane l owns
//   columns 4l..4l+3 and 64 + 4l..64 + 4l + 3: 16 lanes write 256 contiguous bytes per row, and
//   read 256 contiguous bytes of Bs (conflict-free).
// - The warp grid goes with it: each warp covers 16 rows x all 128 columns (lanes 0-15 rows
//   0-7, lanes 16-31 rows 8-15 of its slice); a lane's 8 rows stay consecutive, and the two
//   distinct A addresses per warp are broadcasts.
// Predicted effect (seed 004): 15.71 -> 15.52 ms (0.96 of cuBLAS): small, the stores are once
// per tile.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  128 x 128, k tiles of 16; warp tile 16 x 128 (8 x 1 warps);
//   thread tile 8 x (4 + 4). Needs M, N multiples of 128 and K a multiple of 16.
#include "../include/common.cuh"

// Column of element (k, m) of the transposed A tile: k's bits 2-3 XORed into m's bits 3-4.
__device__ __forceinline__ int swizzle_a(int k, int m) { return m ^ ((k >> 2) << 3); }

__global__ void __launch_bounds__(256)
sgemm_coalesced_store(int M, int N, int K, float alpha, const float* __restrict__ A,
                  const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int BM = 128, BN = 128, BK = 16, TM = 8, TN = 8;
  __shared__ __align__(16) float As[BK][BM];  // transposed and swizzled: As[k][swizzle_a(k, m)]
  __shared__ __align__(16) float Bs[BK][BN];

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
  for (int k0 = 0; k0 < K; k0 += BK) {
    const float4 a0 = load_float4(&A[load_a_row * K + k0 + load_a_col]);
    const float4 a1 = load_float4(&A[(load_a_row + 64) * K + k0 + load_a_col]);
    As[load_a_col + 0][swizzle_a(load_a_col + 0, load_a_row)] = a0.x;
    As[load_a_col + 1][swizzle_a(load_a_col + 1, load_a_row)] = a0.y;
    As[load_a_col + 2][swizzle_a(load_a_col + 2, load_a_row)] = a0.z;
    As[load_a_col + 3][swizzle_a(load_a_col + 3, load_a_row)] = a0.w;
    As[load_a_col + 0][swizzle_a(load_a_col + 0, load_a_row + 64)] = a1.x;
    As[load_a_col + 1][swizzle_a(load_a_col + 1, load_a_row + 64)] = a1.y;
    As[load_a_col + 2][swizzle_a(load_a_col + 2, load_a_row + 64)] = a1.z;
    As[load_a_col + 3][swizzle_a(load_a_col + 3, load_a_row + 64)] = a1.w;
    store_float4(&Bs[load_b_row][load_b_col], load_float4(&B[(k0 + load_b_row) * N + load_b_col]));
    store_float4(&Bs[load_b_row + 8][load_b_col],
                 load_float4(&B[(k0 + load_b_row + 8) * N + load_b_col]));
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      *reinterpret_cast<float4*>(&a[0]) = load_float4(&As[k][swizzle_a(k, c_row)]);
      *reinterpret_cast<float4*>(&a[4]) = load_float4(&As[k][swizzle_a(k, c_row + 4)]);
      *reinterpret_cast<float4*>(&b[0]) = load_float4(&Bs[k][c_col]);
      *reinterpret_cast<float4*>(&b[4]) = load_float4(&Bs[k][c_col + 64]);
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
    store_axpby4(&C[(c_row + i) * N + c_col + 64], &acc[i][4], alpha, beta);
  }
}
