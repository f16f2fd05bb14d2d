// tile_order.cuh: which block tile (and which K slice of it) a block of a one-dimensional grid
// computes, in the grouped order that keeps the blocks resident at one time on a few rows of A
// and columns of B in L2. Used by 17 and 21 (grouped_block_tile, k_slice) and 22 (grouped_tile,
// with its own persistent and stream-K schedule on top).
#ifndef SGEMM_LAB_TILE_ORDER_CUH
#define SGEMM_LAB_TILE_ORDER_CUH
#include "common.cuh"

// Which block tile and K slice a block of a one-dimensional grid computes (17, 21). Slices are
// the slowest index. Within a slice consecutive blocks walk a column of GROUP_M block rows before
// moving right, so the blocks resident at one time share a few rows of A and columns of B in L2.
struct BlockTile {
  int tiles;          // block tiles of C
  int slice;          // which of the SPLIT_K slices of K
  int tile_m, tile_n; // block tile coordinates
  int tile;           // tile_m * tiles_n + tile_n
};
// The grouped order as a function of the position `pid` in it (0 .. tiles - 1).
template <int GROUP_M>
__device__ __forceinline__ void grouped_tile(int pid, int tiles_m, int tiles_n, int& tile_m,
                                             int& tile_n) {
  const int group_rows = GROUP_M * tiles_n;           // blocks in one group of GROUP_M block rows
  const int first_row = (pid / group_rows) * GROUP_M;
  const int rows_here = min(tiles_m - first_row, GROUP_M);
  tile_m = first_row + (pid % group_rows) % rows_here;
  tile_n = (pid % group_rows) / rows_here;
}
template <int BM, int BN, int GROUP_M>
__device__ __forceinline__ BlockTile grouped_block_tile(int M, int N) {
  const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
  const int tiles = tiles_m * tiles_n;
  int tile_m, tile_n;
  grouped_tile<GROUP_M>(blockIdx.x % tiles, tiles_m, tiles_n, tile_m, tile_n);
  const int slice = blockIdx.x / tiles;  // as unsigned, like the tile index
  return {tiles, slice, tile_m, tile_n, tile_m * tiles_n + tile_n};
}
// K slice `slice` of SPLIT_K in BK-wide k tiles: its first k tile and how many it has (the last
// slices may be short, or empty when there are fewer k tiles than slices).
struct KSlice {
  int k_tile_begin, k_tiles;
};
template <int BK, int SPLIT_K>
__device__ __forceinline__ KSlice k_slice(int K, int slice) {
  const int k_tiles_all = (K + BK - 1) / BK;
  const int k_tiles_per_slice = (k_tiles_all + SPLIT_K - 1) / SPLIT_K;
  const int k_tile_begin = slice * k_tiles_per_slice;
  return {k_tile_begin, max(0, min(k_tiles_all, k_tile_begin + k_tiles_per_slice) - k_tile_begin)};
}

#endif  // SGEMM_LAB_TILE_ORDER_CUH
