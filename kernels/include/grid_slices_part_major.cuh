// grid_slices_part_major.cuh: grid_slices.cuh's add-up of a tile's K slices (the last block to
// arrive sums every slice's partial in K order), walked part by part instead of float4 by float4:
// for each part, a thread loads every float4 of its fragments before it adds any, so all of its
// fragments' loads wait on the L2 together. Walked float4 by float4, a thread with many sums and
// many slices (gemm_ffma_narrow: up to 128 sums, up to 64 slices) waits on the L2 once for every
// float4 and few parts. Each element still sums 0 + part 0 + part 1 + ... in K order: the same
// floats, bit for bit, as grid_slices.cuh's add_up_grid_slices.
// A header of its own rather than a change to grid_slices.cuh: the dispatch candidates that
// include that one (gemm_ffma, gemm_mma_tf32) have their tuning evidence keyed to the exact
// source they were built from.
#ifndef SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
#define SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
#include "grid_slices.cuh"

// add_up_grid_slices with the part-major walk: the workspace holds [slices][tiles][BM * BN]
// partials, then a ticket a tile. Returns true in the block that then stores the tile: the only
// one without slices, the last to arrive with them, its accumulators then the tile's sums.
template <int BM, int BN, typename ForEachFragment>
__device__ __forceinline__ bool add_up_grid_slices_part_major(float* workspace,
                                                              ForEachFragment&& for_each_fragment) {
  if (gridDim.y == 1) return true;
  const int tiles = gridDim.x, parts = gridDim.y;
  int* tickets = reinterpret_cast<int*>(workspace + (size_t)parts * tiles * BM * BN);
  auto slot = [&](int s) { return workspace + ((size_t)s * tiles + blockIdx.x) * BM * BN; };
  if (!publish_partial<BN, 0>(slot(blockIdx.y), parts, &tickets[blockIdx.x], for_each_fragment))
    return false;
  for_each_fragment([&](int, int, float* v) { v[0] = v[1] = v[2] = v[3] = 0.0f; });
#pragma unroll 1  // a part's loads are the ones in flight together: no more registers than that
  for (int s = 0; s < parts; ++s) {
    const float* part = slot(s);
    for_each_fragment([&](int row, int col, float* v) {
      const float4 p = __ldcg(reinterpret_cast<const float4*>(&part[row * BN + col]));
      v[0] += p.x; v[1] += p.y; v[2] += p.z; v[3] += p.w;
    });
  }
  return true;
}

#endif  // SGEMM_LAB_GRID_SLICES_PART_MAJOR_CUH
