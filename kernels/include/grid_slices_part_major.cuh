// grid_slices_part_major.cuh: grid_slices.cuh's add-up of a tile's K slices (the last block to
// arrive sums every slice's partial in K order), walked part by part instead of float4 by float4:
// for each part, a thread loads every float4 of its fragments before it adds any, so all of its
// fragments' loads wait on the L2 together. Walked float4 by float4, a thread with many sums and
// many slices (gemm_ffma_narrow: up to 128 sums, up to 64 slices) waits on the L2 once for every
// float4 and few parts. A thread with few fragments loads several parts before it adds any (up
// to 16 float4s in flight), so a tile of many slices waits on the L2 that many times fewer.
// Each element still sums 0 + part 0 + part 1 + ... in K order: the same floats, bit for bit, as
// grid_slices.cuh's add_up_grid_slices.
// A header of its own rather than a change to grid_slices.cuh: the dispatch candidates that
// include that one (gemm_ffma, gemm_mma_tf32) have their tuning evidence keyed to the exact
// source they were built from.
#ifndef SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
#define SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
#include "grid_slices.cuh"

// add_up_grid_slices with the part-major walk: the workspace holds [slices][tiles][BM * BN]
// partials, then a ticket a tile. Returns true in the block that then stores the tile: the only
// one without slices, the last to arrive with them, its accumulators then the tile's sums.
// FRAGMENTS: the float4s of sums a thread holds (the visits for_each_fragment makes).
template <int BM, int BN, int FRAGMENTS, typename ForEachFragment>
__device__ __forceinline__ bool add_up_grid_slices_part_major(float* workspace,
                                                              ForEachFragment&& for_each_fragment) {
  // parts loaded before any is added: up to 16 float4s (64 registers) a thread, at most 8 parts
  constexpr int IN_FLIGHT = FRAGMENTS >= 16 ? 1 : (16 / FRAGMENTS < 8 ? 16 / FRAGMENTS : 8);
  if (gridDim.y == 1) return true;
  const int tiles = gridDim.x, parts = gridDim.y;
  int* tickets = reinterpret_cast<int*>(workspace + (size_t)parts * tiles * BM * BN);
  auto slot = [&](int s) { return workspace + ((size_t)s * tiles + blockIdx.x) * BM * BN; };
  if (!publish_partial<BN, 0>(slot(blockIdx.y), parts, &tickets[blockIdx.x], for_each_fragment))
    return false;
  for_each_fragment([&](int, int, float* v) { v[0] = v[1] = v[2] = v[3] = 0.0f; });
#pragma unroll 1  // IN_FLIGHT parts' loads are the ones in flight together: no more registers than that
  for (int s0 = 0; s0 < parts; s0 += IN_FLIGHT) {
    float4 p[IN_FLIGHT][FRAGMENTS];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      if (s0 + u < parts) {
        const float* part = slot(s0 + u);
        int f = 0;  // the visit's index: a constant once the visits are unrolled
        for_each_fragment([&](int row, int col, float*) {
          p[u][f++] = __ldcg(reinterpret_cast<const float4*>(&part[row * BN + col]));
        });
      }
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {  // added in part order: s0, s0 + 1, ...
      if (s0 + u < parts) {
        int f = 0;
        for_each_fragment([&](int, int, float* v) {
          const float4 q = p[u][f++];
          v[0] += q.x; v[1] += q.y; v[2] += q.z; v[3] += q.w;
        });
      }
    }
  }
  return true;
}

#endif  // SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
