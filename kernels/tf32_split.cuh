// tf32_split.cuh: the 3xTF32 split as 23 and 26 use it. An FP32 value x is split into two TF32
// values, x ~ big + small (23's header has the error analysis); the pre-pass writes A_big and
// A_small (and a copy of B when its rows are not 16-byte aligned) into the workspace; a consumer
// lane splits its B^T fragments in registers; the producer loads a stage's three tiles (A_big,
// A_small, B). In its own header because 26 runs 23's pipeline in K slices and 64-row tiles.
#ifndef SGEMM_LAB_TF32_SPLIT_CUH
#define SGEMM_LAB_TF32_SPLIT_CUH
#include "common.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

// x = big + small (+ at most 2^-22 |x|), both TF32 values held as FP32 bit patterns.
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));  // exact difference; -ftz flushes it below 2^-126
}

// --- Pre-pass: workspace = [A_big | A_small | B copy (only when N % 4 != 0)], row strides padded
// to 4 floats (16 bytes). Each thread handles 4 consecutive elements of a padded row; the pad
// columns get zeros (the tensor maps stop at K and N, so they are never read anyway).
__global__ void __launch_bounds__(256)
    split_tf32_operands(int M, int N, int K, float, const float* __restrict__ A,
                        const float* __restrict__ B, float, float*, float* __restrict__ workspace) {
  const int k_chunks = (K + 3) / 4, n_chunks = (N + 3) / 4;
  const size_t a_floats = (size_t)M * k_chunks * 4;
  float* a_big = workspace;
  float* a_small = workspace + a_floats;
  float* b_copy = workspace + 2 * a_floats;
  const size_t a_work = (size_t)M * k_chunks;
  const size_t b_work = N % 4 ? (size_t)K * n_chunks : 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < a_work + b_work;
       i += (size_t)gridDim.x * blockDim.x) {
    if (i < a_work) {
      const int row = i / k_chunks, col = (i % k_chunks) * 4;
      const float* src = A + (size_t)row * K + col;
      float v[4];
      if (K % 4 == 0) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = col + j < K ? src[j] : 0.0f;
      }
      unsigned big[4], small[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) split_tf32(v[j], big[j], small[j]);
      *reinterpret_cast<uint4*>(a_big + i * 4) = make_uint4(big[0], big[1], big[2], big[3]);
      *reinterpret_cast<uint4*>(a_small + i * 4) = make_uint4(small[0], small[1], small[2], small[3]);
    } else {
      const size_t j = i - a_work;
      const int row = j / n_chunks, col = (j % n_chunks) * 4;
      const float* src = B + (size_t)row * N + col;
      float4 v;
      v.x = src[0];  // col < N always: the first of a chunk is inside the row
      v.y = col + 1 < N ? src[1] : 0.0f;
      v.z = col + 2 < N ? src[2] : 0.0f;
      v.w = col + 3 < N ? src[3] : 0.0f;
      *reinterpret_cast<float4*>(b_copy + j * 4) = v;
    }
  }
}

struct Fragments {  // one 32-k stage of B^T for one lane, split: 16 values x 2 parts
  unsigned big[4][4], small[4][4];
};

// Producer (one thread of warpgroup 0): walks k tiles kt0 .. kt0 + k_tiles - 1 (all of K in 23,
// a K slice in 26), refilling each stage as soon as the consumers release it: A_big's and
// A_small's BM x 32 boxes, then BN / 32 boxes of B, one stage after another in `smem`.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void produce_split_k_tiles(unsigned char* smem, u64* full, u64* empty,
                                                      const TensorMap* tmap_a_big,
                                                      const TensorMap* tmap_a_small,
                                                      const TensorMap* tmap_b, int m0, int n0,
                                                      int kt0, int k_tiles) {
  constexpr int BK = 32, A_TILE = BM * BK * 4, B_BOX = BK * 32 * 4;
  constexpr int STAGE = 2 * A_TILE + (BN / 32) * B_BOX;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    const int k = (kt0 + kt) * BK;
    unsigned char* stage = smem + s * STAGE;
    mbar_wait(&empty[s], ((kt / STAGES) & 1) ^ 1);
    mbar_arrive_expect_tx(&full[s], STAGE);
    tma_load_2d(stage, tmap_a_big, &full[s], k, m0);
    tma_load_2d(stage + A_TILE, tmap_a_small, &full[s], k, m0);
#pragma unroll
    for (int i = 0; i < BN / 32; ++i)
      tma_load_2d(stage + 2 * A_TILE + i * B_BOX, tmap_b, &full[s], n0 + 32 * i, k);
  }
}

#endif  // SGEMM_LAB_TF32_SPLIT_CUH
