// grid_slices.cuh: the block tile and K slice of the library's small-tile kernels (gemm/ffma.cu,
// gemm/mma_tf32.cu), from the grid: grid.x the tile, row-major over C's tiles (a small C has few;
// nothing to gain from a grouped order), grid.y the K slice, the slices sharing K's k tiles
// equally (the last ones shorter, or empty: a zero part), so one build serves every K; and the
// add-up of the slices' partials through the global workspace (split_k.cuh), in K order.
#ifndef SGEMM_LAB_GRID_SLICES_CUH
#define SGEMM_LAB_GRID_SLICES_CUH
#include "common.cuh"
#include "split_k.cuh"

struct GridSlice {
  int block_row, block_col;  // the block tile's first row and column of C
  int kt0, k_tiles;          // the slice's first k tile, and how many it runs
};

template <int BM, int BN, int BK>
__device__ __forceinline__ GridSlice grid_slice(int N, int K) {
  GridSlice at;
  const int tiles_n = CEIL_DIV(N, BN);
  const int tile = blockIdx.x, slice = blockIdx.y, slices = gridDim.y;  // signed arithmetic below
  at.block_row = (tile / tiles_n) * BM;
  at.block_col = (tile % tiles_n) * BN;
  const int k_tiles_all = CEIL_DIV(K, BK), per_slice = CEIL_DIV(k_tiles_all, slices);
  at.kt0 = slice * per_slice;
  at.k_tiles = max(0, min(per_slice, k_tiles_all - at.kt0));
  return at;
}

// With K slices (grid.y > 1) the workspace holds [slices][tiles][BM * BN] partials, then a ticket
// a tile: every slice leaves its partial and the last to arrive adds them up (split_k.cuh).
// Returns true in the block that then stores the tile: the only one without slices, the last to
// arrive with them. The grid's size is read here again, not held across the K loop (held, it
// spilled 4-8 bytes in some of gemm_ffma's tiles).
template <int BM, int BN, typename ForEachFragment>
__device__ __forceinline__ bool add_up_grid_slices(float* workspace, ForEachFragment&& for_each_fragment) {
  if (gridDim.y > 1) {
    const int tiles = gridDim.x;
    int* tickets = reinterpret_cast<int*>(workspace + (size_t)gridDim.y * tiles * BM * BN);
    auto slot = [&](int s) { return workspace + ((size_t)s * tiles + blockIdx.x) * BM * BN; };
    return reduce_partial_tile<BM, BN, 0>(slot, gridDim.y, blockIdx.y, &tickets[blockIdx.x],
                                          for_each_fragment);
  }
  return true;
}

#endif  // SGEMM_LAB_GRID_SLICES_CUH
