// split_k.cuh: adding up a block tile whose K range was cut between several blocks (split-K
// slices in 17, 21 and 22, stream-K pieces in 22). Each part leaves its partial tile in a global
// workspace and takes a ticket; the last part to arrive adds the partials in K order, so the
// result does not depend on arrival order, and resets the ticket for the next launch.
#ifndef SGEMM_LAB_SPLIT_K_CUH
#define SGEMM_LAB_SPLIT_K_CUH
#include "tile_order.cuh"

// A barrier for the first THREADS threads of the block (named barrier 1), or for the whole block
// when THREADS is 0: warp-specialized kernels (22) sync their consumer warps only.
template <int THREADS>
__device__ __forceinline__ void sync_threads() {
  if constexpr (THREADS == 0) __syncthreads();
  else asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
}

// After this block has written its part of a split result to the workspace: counts it in on
// `ticket`. Returns true in the last of the `parts` blocks to arrive, which may then read every
// part's writes (and has reset the ticket for the next launch); false in the others.
template <int SYNC_THREADS>
__device__ __forceinline__ bool count_in(int parts, int* ticket) {
  __shared__ int arrived;
  __threadfence();  // this block's part is visible device-wide before its ticket
  sync_threads<SYNC_THREADS>();
  if (threadIdx.x == 0) arrived = atomicAdd(ticket, 1);
  sync_threads<SYNC_THREADS>();
  if (arrived != parts - 1) return false;
  __threadfence();
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next launch
  return true;
}

// A tile whose K range was split between `parts` blocks (split-K slices in 17, 21 and 22,
// stream-K pieces in 22): every part writes its partial tile to its slot of the workspace
// (BM x BN floats, row-major) and counts itself in on the tile's ticket. Returns true in the
// last part to arrive, which then has every part's partial to add (and has reset the ticket for
// the next launch); the others are done with the tile. `for_each_fragment(visit)` calls
// visit(row, col, v) for each float4 of accumulators v at (row, col) of the block tile.
// SYNC_THREADS: the threads that hold accumulators and take part (0: all of the block's).
template <int BN, int SYNC_THREADS, typename ForEachFragment>
__device__ __forceinline__ bool publish_partial(float* mine, int parts, int* ticket,
                                                ForEachFragment&& for_each_fragment) {
  for_each_fragment([&](int row, int col, float* v) {
    __stcg(reinterpret_cast<float4*>(&mine[row * BN + col]), make_float4(v[0], v[1], v[2], v[3]));
  });
  return count_in<SYNC_THREADS>(parts, ticket);
}

// The last part sums the parts into its accumulators, in part order (so the result does not
// depend on arrival order); slot(i) is where part i's partial is. Returns false in the others.
template <int BM, int BN, int SYNC_THREADS, typename Slot, typename ForEachFragment>
__device__ __forceinline__ bool reduce_partial_tile(Slot&& slot, int parts, int part, int* ticket,
                                                    ForEachFragment&& for_each_fragment) {
  if (!publish_partial<BN, SYNC_THREADS>(slot(part), parts, ticket, for_each_fragment)) return false;
  for_each_fragment([&](int row, int col, float* v) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < parts; ++s) {
      const float4 p = __ldcg(reinterpret_cast<const float4*>(&slot(s)[row * BN + col]));
      sum.x += p.x; sum.y += p.y; sum.z += p.z; sum.w += p.w;
    }
    v[0] = sum.x; v[1] = sum.y; v[2] = sum.z; v[3] = sum.w;
  });
  return true;
}

// Split-K: the workspace holds [SPLIT_K][tiles][BM * BN] partials, then one ticket per tile.
template <int SPLIT_K, int BM, int BN, int SYNC_THREADS = 0, typename ForEachFragment>
__device__ __forceinline__ bool split_k_reduce(float* workspace, const BlockTile& at,
                                               ForEachFragment&& for_each_fragment) {
  int* tickets = reinterpret_cast<int*>(workspace + (size_t)SPLIT_K * at.tiles * BM * BN);
  auto slot = [&](int s) { return workspace + ((size_t)s * at.tiles + at.tile) * BM * BN; };
  return reduce_partial_tile<BM, BN, SYNC_THREADS>(slot, SPLIT_K, at.slice, &tickets[at.tile],
                                                   for_each_fragment);
}

#endif  // SGEMM_LAB_SPLIT_K_CUH
