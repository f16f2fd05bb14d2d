// k_slices.cuh: a tile's K slices, computed by the blocks of one cluster, added up through
// distributed shared memory as 25 and 26 do it (25's header says why not through global memory).
// In its own header because the TF32 (25) and 3xTF32 (26) any-shape chapters split K the same
// way: which slice of which tile a block runs, and how the slices are added up.
#ifndef SGEMM_LAB_K_SLICES_CUH
#define SGEMM_LAB_K_SLICES_CUH
#include "common.cuh"
#include "mbarrier.cuh"
#include "cluster.cuh"

// Where a block works: a tile's K slices are consecutive blocks (one cluster), the tiles in 20's
// grouped order (GROUP_M block rows walked together); slice `slice` of the tile at (m0, n0)
// runs k tiles kt0 .. kt0 + k_tiles - 1 (the last slices may be shorter, or empty: a zero
// partial). With SLICES == 1 it is the whole K range of one tile. A launch runs the first
// gridDim.x / SLICES tiles of that order, or with LAST_TILES the last ones: the tail launch of a
// split tail (`split_tail`), the tiles a launch of the first ones leaves past its last full wave,
// their K sliced so that they fill one wave instead of idling most of the SMs for a whole round.
struct SliceOfTile {
  int m0, n0, slice, kt0, k_tiles;
};
template <int BM, int BN, int BK, int GROUP_M, int SLICES, bool LAST_TILES = false>
__device__ __forceinline__ SliceOfTile slice_of_tile(int M, int N, int K) {
  SliceOfTile w;
  const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
  int tile = blockIdx.x / SLICES;
  if constexpr (LAST_TILES) tile += tiles_m * tiles_n - (int)gridDim.x / SLICES;
  w.slice = blockIdx.x % SLICES;
  const int group_tiles = GROUP_M * tiles_n;
  const int first_m = (tile / group_tiles) * GROUP_M;
  const int rows_here = min(tiles_m - first_m, GROUP_M);
  w.m0 = (first_m + (tile % group_tiles) % rows_here) * BM;
  w.n0 = ((tile % group_tiles) / rows_here) * BN;
  const int k_tiles_all = CEIL_DIV(K, BK), per_slice = CEIL_DIV(k_tiles_all, SLICES);
  w.kt0 = w.slice * per_slice;
  w.k_tiles = max(0, min(per_slice, k_tiles_all - w.kt0));
  return w;
}

// Row (or column) groups of 8 a block of the cluster adds up and stores: an equal share, the
// last one shorter where GROUPS is not a multiple of SLICES.
__host__ __device__ constexpr int k_slice_share(int n, int slices) { return CEIL_DIV(n / 8, slices); }

// A cluster's K slices added up (SLICES > 1): every block has its partial tile in `d`, N / 2
// accumulators per consumer thread (wgmma m64nNk8) in groups of four: the row groups of 25's and
// 26's C^T layout, the column groups of 27's C layout. Block `rank` stores it into its own stage
// ring (idle once both consumers' K loops are done; each thread's float4 q at index
// q * CONSUMER_THREADS + ct: a warp's stores are 512 contiguous bytes), the cluster meets, and
// the block reads its share (groups rank * SHARE ...) of every block's partial, slice 0 first,
// into `sum`; the cluster meets again before any block may leave (its shared memory is read by
// the others until then).
template <int N, int CONSUMER_THREADS, int SLICES>
__device__ __forceinline__ void add_k_slices(const float* d, float* sum, unsigned char* ring,
                                             int rank, int ct) {
  // groups (float4s per thread) a block adds up; with N / 8 not a multiple of SLICES (a fitted
  // tile, wgmma_rows.cuh) the last block's share is shorter and its missing groups stay zero
  constexpr int SHARE = k_slice_share(N, SLICES);
  constexpr bool EVEN = (N / 8) % SLICES == 0;
  float4* mine = reinterpret_cast<float4*>(ring) + ct;
  // Both consumer warpgroups read the last stage's shared tiles: neither may overwrite the ring
  // before the other's wgmmas are done (named barrier 1, the consumers only; found on the H100 as
  // wrong results at two consumers and not at one).
  asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMER_THREADS) : "memory");
#pragma unroll
  for (int q = 0; q < N / 8; ++q)
    mine[q * CONSUMER_THREADS] = make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]);
  cluster_sync();
  const unsigned share = smem_addr(mine + rank * SHARE * CONSUMER_THREADS);
#pragma unroll
  for (int i = 0; i < 4 * SHARE; ++i) sum[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < SLICES; ++s) {
    const unsigned theirs = cluster_map(share, s);
#pragma unroll
    for (int j = 0; j < SHARE; ++j) {
      if (!EVEN && rank * SHARE + j >= N / 8) continue;  // beyond the tile: never read
      const float4 p = ld_cluster_f32x4(theirs + 16 * j * CONSUMER_THREADS);
      sum[4 * j] += p.x, sum[4 * j + 1] += p.y, sum[4 * j + 2] += p.z, sum[4 * j + 3] += p.w;
    }
  }
}

#endif  // SGEMM_LAB_K_SLICES_CUH
