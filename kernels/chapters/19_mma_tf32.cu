// 19 mma_tf32: 18's tensor-core arithmetic at the PTX level (mma.sync m16n8k8, TF32), fed by a
// multi-stage cp.async pipeline from XOR-swizzled shared-memory tiles: seed 004's TF32 chain.
//
// What changed from 18 and why:
// - The MMA is `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, whose fragment layout is
//   documented (PTX ISA), unlike WMMA's: lane (group g = lane / 4, t = lane % 4) holds
//   A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); B(t, g), B(t + 4, g); and accumulators
//   C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1). So fragments are loaded with plain
//   32-bit shared loads and the epilogue writes C straight from registers.
// - Global -> shared copies are cp.async (16 bytes, no registers) into STAGES buffers: while the
//   warps multiply tile k, the copies of tiles k + 1 .. k + STAGES - 1 are in flight (18 loaded,
//   waited and multiplied in turn).
// - The tiles are swizzled so the fragment loads are conflict-free: in A (BM x BK, k contiguous)
//   the 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows a fragment load
//   touches fall in 8 different bank groups; in B (BK x BN, n contiguous) chunk c of row k goes to
//   c ^ 2 (k % 4), so the 4 k rows of a B fragment load do too. The copies stay 16-byte chunks.
// - FP32 -> TF32: cvt.rna.tf32.f32 on each element as it leaves shared memory (round to nearest,
//   ties away; the inputs stay FP32 in memory).
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK, STAGES stages in flight
//   warp tile   WM x WN of 16 x 8 MMA tiles (WM / 16 x WN / 8 per warp, 4 accumulators each per
//               lane); fragments: the mma.sync operands of each MMA tile and 8 k
// Needs M, N, K multiples of the block tile (no edge handling).
#include "../include/common.cuh"
#include "../include/cp_async.cuh"

__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

template <int BM, int BN, int BK, int WM, int WN, int THREADS, int STAGES>
__global__ void __launch_bounds__(THREADS)
    sgemm_mma_tf32(int M, int N, int K, float alpha, const float* __restrict__ A,
                   const float* __restrict__ B, float beta, float* __restrict__ C) {
  constexpr int MI = WM / 16, NI = WN / 8;          // MMA tiles per warp
  constexpr int WARPS_N = BN / WN;
  constexpr int A_CHUNKS = BK / 4, B_CHUNKS = BN / 4;  // 16-byte chunks per smem row
  constexpr int A_TILE = BM * BK, B_TILE = BK * BN;    // floats per stage
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                                    // STAGES x A_TILE
  float* Bs = smem + STAGES * A_TILE;                  // STAGES x B_TILE

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_row = (warp / WARPS_N) * WM, warp_col = (warp % WARPS_N) * WN;
  const float* a_block = A + (size_t)blockIdx.y * BM * K;
  const float* b_block = B + (size_t)blockIdx.x * BN;

  // Swizzled float offsets inside one stage.
  auto a_at = [](int r, int k) { return r * BK + (((k >> 2) ^ (r & 7)) << 2) + (k & 3); };
  auto b_at = [](int k, int n) { return k * BN + (((n >> 2) ^ ((k & 3) << 1)) << 2) + (n & 3); };

  auto load_tile = [&](int stage, int k0) {
#pragma unroll
    for (int f = threadIdx.x; f < BM * A_CHUNKS; f += THREADS) {
      const int r = f / A_CHUNKS, c = f % A_CHUNKS;
      cp_async_16(&As[stage * A_TILE + a_at(r, c * 4)], a_block + (size_t)r * K + k0 + c * 4, 16);
    }
#pragma unroll
    for (int f = threadIdx.x; f < BK * B_CHUNKS; f += THREADS) {
      const int r = f / B_CHUNKS, c = f % B_CHUNKS;
      cp_async_16(&Bs[stage * B_TILE + b_at(r, c * 4)], b_block + (size_t)(k0 + r) * N + c * 4, 16);
    }
  };

  float acc[MI][NI][4] = {};
  const int tiles = K / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {  // prologue: the first STAGES - 1 tiles in flight
    if (s < tiles) load_tile(s, s * BK);
    cp_async_commit();
  }

  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread's copies) ...
    __syncthreads();              // ... and for everyone's; the stage read last iteration is free
    const int next = kt + STAGES - 1;
    if (next < tiles) load_tile(next % STAGES, next * BK);
    cp_async_commit();

    const float* as = As + (kt % STAGES) * A_TILE;
    const float* bs = Bs + (kt % STAGES) * B_TILE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      unsigned a[MI][4], b[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = warp_row + i * 16 + g;
        a[i][0] = to_tf32(as[a_at(r, kk + t)]);
        a[i][1] = to_tf32(as[a_at(r + 8, kk + t)]);
        a[i][2] = to_tf32(as[a_at(r, kk + t + 4)]);
        a[i][3] = to_tf32(as[a_at(r + 8, kk + t + 4)]);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int n = warp_col + j * 8 + g;
        b[j][0] = to_tf32(bs[b_at(kk + t, n)]);
        b[j][1] = to_tf32(bs[b_at(kk + t + 4, n)]);
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
          asm volatile(
              "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
              "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
              : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
              : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]),
                "r"(b[j][1]));
    }
  }
  cp_async_wait<0>();

  // Epilogue straight from the accumulators: lane (g, t) owns C(g, 2t..2t+1) and C(g+8, 2t..2t+1)
  // of each MMA tile.
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int row = blockIdx.y * BM + warp_row + i * 16 + g;
      const int col = blockIdx.x * BN + warp_col + j * 8 + 2 * t;
      float* c0 = C + (size_t)row * N + col;
      float* c1 = C + (size_t)(row + 8) * N + col;
      store_axpby(c0, acc[i][j][0], alpha, beta);
      store_axpby(c0 + 1, acc[i][j][1], alpha, beta);
      store_axpby(c1, acc[i][j][2], alpha, beta);
      store_axpby(c1 + 1, acc[i][j][3], alpha, beta);
    }
}
