// gemm/ffma_narrow.cu: the library's FP32 (FFMA) kernel for products with a narrow side of C (at
// most 32 rows or 96 columns) and a long K: each thread owns a line of C's wide side and keeps
// all of the narrow side in registers, so the wide operand is streamed once from DRAM in
// per-thread runs and the narrow operand's K chunk is read from shared memory by broadcast.
// gemm_ffma_skinny (chapter 24) serves the same products and is kept for the matrix-vector end;
// what differs here, and why:
// - Few columns (N <= WIDTH): a thread owns a row of A and of C (all N sums), not a warp: the
//   skinny layout has every lane read its own float4 of B's K slice from shared memory once per
//   column of C, WIDTH times as many shared-memory bytes as A's bytes from DRAM, which at 16 to
//   32 columns is the limit (its best was 0.29x to 0.35x cuBLAS at 11048 x 27 x 3851 and
//   4748 x 23 x 6078 on the H100). Here one broadcast float4 of B serves 4 FFMAs of every lane,
//   and no shuffles add the sums up. Up to 96 columns (a thread's sums are one row's): from about
//   40 columns a product is bound by the FFMAs, not by A's bytes, and the SIMT cores still beat
//   the tensor cores' 64-wide tiles there (cuBLAS TF32 took 23 us at 1156 x 65 x 4351 on the
//   H100; its 342 M FFMAs take about 10 us at the SIMT peak).
// - Few rows (M <= WIDTH): the block's warps lie side by side along N, each over the whole K
//   chunk, so A's chunk in shared memory serves WARPS x 128 columns and no warp's sums have to
//   be added to another's (the skinny layout cuts a block's K slice between its warps and adds
//   their sums in shared memory, and stages A again for every 32 x VEC columns).
// - The narrow operand's K slice is staged in chunks of CHUNK k, two buffers by cp.async (the
//   next chunk lands while this one is read), so a slice is as long as the grid wants: K slices
//   (grid.y, grid_slices.cuh) are cut for parallelism, not to fit shared memory. The last slice
//   to arrive adds them part by part (grid_slices_part_major.cuh): a thread's 20 to 128 sums
//   from up to 64 slices, each part's float4s loaded together rather than one float4 at a time.
// - STAGED: the streamed operand's chunk comes through shared memory too, copied by 4-byte
//   cp.async with consecutive threads on consecutive floats, so the copies coalesce whatever the
//   rows' alignment. Few columns: the block's THREADS rows of A x CHUNK k, each row padded by a
//   float so that lane t reading its row at k hits bank (t + k) % 32. Read straight from DRAM, a
//   lane's run is its own row: where K % 4 != 0 that is one float a load, and a warp's load then
//   touches 32 cache lines for 128 bytes (14792 x 10 x 3067: 0.80x cuBLAS at best on the H200,
//   the held-out minimum of both precisions). Few rows: CHUNK rows of B x the block's columns,
//   each lane then reading its 4 columns as one float4 where N % 4 != 0 had it load 4 floats.
// Any M, N, K, alpha, beta with M <= 32 < N or N <= 96, N <= M (the config's size rule). VEC 4 where the
// streamed operand's rows are 16-byte aligned (few rows: N % 4; few columns: K % 4), else single
// floats; VEC_C likewise for C's rows (N % 4). Element indices are 32-bit: the runner requires
// each matrix to hold fewer than 2^31 elements.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  few columns: WARPS * 32 rows of C x WIDTH columns, one K slice (grid.y)
//               few rows:    WIDTH rows of C x WARPS * 128 columns, one K slice, its chunks'
//                            k rows shared among WARPS_K groups of WARPS warps (added in smem)
//   warp tile   32 of the block's lines (rows or float4s of columns), the whole K slice
//   thread tile few columns: 1 row x WIDTH columns; few rows: WIDTH rows x 4 columns
#include "../include/common.cuh"
#include "../include/cp_async.cuh"
#include "../include/grid_slices.cuh"
#include "../include/grid_slices_part_major.cuh"
#include "../include/tile_store.cuh"

// The narrow operand's CHUNK k rows from k_first into a buffer as buf[kk * STRIDE + i] (i: the
// narrow side's index, row of A or column of B), zero outside the operand and past k_end.
// Consecutive threads copy consecutive floats of the operand (A along its rows, B along its
// rows), so the reads coalesce.
template <int FEW_ROWS, int WIDTH, int STRIDE, int CHUNK, int THREADS>
__device__ __forceinline__ void stage_narrow(float* buf, const float* __restrict__ A,
                                             const float* __restrict__ B, int M, int N, int K,
                                             int k_first, int k_end) {
#pragma unroll 4
  for (int e = threadIdx.x; e < CHUNK * WIDTH; e += THREADS) {
    const int i = FEW_ROWS ? e / CHUNK : e % WIDTH;   // the narrow index
    const int kk = FEW_ROWS ? e % CHUNK : e / WIDTH;  // the k row of the chunk
    const int k = k_first + kk;
    const bool inside = k < k_end && i < (FEW_ROWS ? M : N);
    const float* src = FEW_ROWS ? A + (inside ? i * K + k : 0) : B + (inside ? k * N + i : 0);
    cp_async_4(&buf[kk * STRIDE + i], src, inside ? 4 : 0);
  }
}

// STAGED: the streamed operand's CHUNK k from k_first for the block's lines, zero outside it and
// past k_end. Few columns: A's THREADS rows as buf[r * (CHUNK + 1) + kk]; few rows: B's CHUNK
// rows at the block's BN columns as buf[kk * BN + c]. Consecutive threads copy consecutive
// floats of a row, so the reads coalesce whatever the rows' alignment.
template <int FEW_ROWS, int CHUNK, int THREADS, int BN>
__device__ __forceinline__ void stage_stream(float* buf, const float* __restrict__ A,
                                             const float* __restrict__ B, int M, int N, int K,
                                             int block_row, int block_col, int k_first, int k_end) {
  constexpr int LINE = FEW_ROWS ? BN : CHUNK;  // floats a copied row holds
#pragma unroll 4
  for (int e = threadIdx.x; e < CHUNK * (FEW_ROWS ? BN : THREADS); e += THREADS) {
    const int r = e / LINE, c = e % LINE;  // few columns: a row of A and its k; few rows: a k and a column
    const int k = k_first + (FEW_ROWS ? r : c);
    const bool inside = k < k_end && (FEW_ROWS ? block_col + c < N : block_row + r < M);
    const float* src = FEW_ROWS ? B + (inside ? k * N + block_col + c : 0)
                                : A + (inside ? (block_row + r) * K + k : 0);
    cp_async_4(&buf[FEW_ROWS ? r * BN + c : r * (CHUNK + 1) + c], src, inside ? 4 : 0);
  }
}

// STEP k values of the streamed operand for this thread, zero outside it: few columns, A's row
// `line` from k (VEC floats a load); few rows, B's rows k .. k + STEP - 1 at the 4 columns from
// `line` (one float4, or 4 floats, a row).
template <int FEW_ROWS, int VEC, int STEP>
__device__ __forceinline__ void load_stream(float (&v)[STEP][FEW_ROWS ? 4 : 1],
                                            const float* __restrict__ A,
                                            const float* __restrict__ B, int M, int N, int K,
                                            int line, int k, int k_end) {
  if constexpr (FEW_ROWS) {
#pragma unroll
    for (int s = 0; s < STEP; ++s) {
      const bool row_in = k + s < k_end;
      const float* p = B + (row_in ? (k + s) * N + line : 0);  // no index past B, even unread
      if constexpr (VEC == 4) {
        const float4 x = (row_in && line < N) ? __ldcs(reinterpret_cast<const float4*>(p))
                                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[s][0] = x.x; v[s][1] = x.y; v[s][2] = x.z; v[s][3] = x.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[s][e] = (row_in && line + e < N) ? __ldcs(p + e) : 0.0f;
      }
    }
  } else {
    const bool row_in = line < M;
    const float* p = A + (row_in ? line * K + k : 0);  // no index past A, even unread
#pragma unroll
    for (int s = 0; s < STEP; s += VEC) {
      if constexpr (VEC == 4) {  // K % 4 == 0: a float4 is inside k_end whole or not at all
        const float4 x = (row_in && k + s < k_end) ? __ldcs(reinterpret_cast<const float4*>(p + s))
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[s][0] = x.x; v[s + 1][0] = x.y; v[s + 2][0] = x.z; v[s + 3][0] = x.w;
      } else {  // single floats: a 32-byte sector serves two or more steps, so it is cached
        v[s][0] = (row_in && k + s < k_end) ? __ldg(p + s) : 0.0f;  // normally, not evict-first
      }
    }
  }
}

// __launch_bounds__ names 1 block per SM as the minimum, as gemm_ffma does: the widest builds
// (32 rows x 4 columns of sums) need their registers more than a second block.
// WARPS_K (few rows, STAGED): groups of WARPS warps side by side along N, each group over its own
// share of every staged chunk's k rows; their sums are added in shared memory, in group order,
// before the K slices' add-up, so a tile needs WARPS_K times fewer K slices (grid.y) for the same
// number of warps, and the last block to arrive adds that many fewer parts.
template <int FEW_ROWS, int WIDTH, int WARPS, int VEC, int VEC_C, int STEP, int CHUNK, int STAGED,
          int WARPS_K>
__global__ void __launch_bounds__(WARPS * WARPS_K * 32, 1)
    gemm_ffma_narrow(int M, int N, int K, float alpha, const float* __restrict__ A,
                     const float* __restrict__ B, float beta, float* __restrict__ C,
                     float* __restrict__ workspace) {
  constexpr int THREADS = WARPS * WARPS_K * 32;
  constexpr int LANE_COLS = FEW_ROWS ? 4 : 1;          // columns of C a thread owns per narrow line
  constexpr int BM = FEW_ROWS ? WIDTH : THREADS;       // the block tile
  constexpr int BN = FEW_ROWS ? WARPS * 32 * 4 : WIDTH;
  static_assert(WARPS_K == 1 || (FEW_ROWS && STAGED && CHUNK % (WARPS_K * STEP) == 0 &&
                                 WIDTH % WARPS_K == 0),
                "warps along K: few rows, the streamed chunk staged, whole steps of it and whole "
                "rows of the tile a group");
  constexpr int STRIDE = FEW_ROWS ? WIDTH + 4 : WIDTH;  // few rows: + 4 spreads the staging stores' banks
  static_assert(WIDTH % 4 == 0 && WIDTH <= (FEW_ROWS ? 32 : 96),
                "the narrow side is read as float4s: at most 32 rows (4 columns each) or 96 columns");
  static_assert(STEP % 4 == 0 && CHUNK % STEP == 0, "a chunk is whole steps, a step whole float4s");
  // STAGED: a buffer of the streamed operand's chunk; few columns, rows of A padded a float (banks)
  constexpr int STREAM_FLOATS = FEW_ROWS ? CHUNK * BN : THREADS * (CHUNK + 1);
  // two chunk buffers of CHUNK x STRIDE floats, then (STAGED) two of STREAM_FLOATS
  extern __shared__ __align__(16) float smem[];
  float* const stream_smem = smem + 2 * CHUNK * STRIDE;  // 16-byte aligned: STRIDE is whole float4s

  const GridSlice at = grid_slice<BM, BN, STEP>(N, K);  // the tile (grid.x), the K slice (grid.y)
  const int k_begin = at.kt0 * STEP, k_end = min(K, (at.kt0 + at.k_tiles) * STEP);
  // the thread's place in its group along N, and its group along K (warp-uniform: 0 if WARPS_K 1)
  const int lane_line = threadIdx.x % (WARPS * 32), group_k = threadIdx.x / (WARPS * 32);
  // the thread's line of C's wide side: a row (few columns) or its first column (few rows)
  const int line = FEW_ROWS ? at.block_col + lane_line * 4 : at.block_row + threadIdx.x;

  float acc[FEW_ROWS ? WIDTH : 1][FEW_ROWS ? 4 : WIDTH];  // [narrow rows][4 cols] or [1][narrow cols]
#pragma unroll
  for (int i = 0; i < (FEW_ROWS ? WIDTH : 1); ++i)
#pragma unroll
    for (int j = 0; j < (FEW_ROWS ? 4 : WIDTH); ++j) acc[i][j] = 0.0f;

  float now[STEP][LANE_COLS], next[STEP][LANE_COLS];
  if constexpr (!STAGED) load_stream<FEW_ROWS, VEC, STEP>(now, A, B, M, N, K, line, k_begin, k_end);
  if (k_begin < k_end) {
    stage_narrow<FEW_ROWS, WIDTH, STRIDE, CHUNK, THREADS>(smem, A, B, M, N, K, k_begin, k_end);
    if constexpr (STAGED)
      stage_stream<FEW_ROWS, CHUNK, THREADS, BN>(stream_smem, A, B, M, N, K, at.block_row, at.block_col,
                                                 k_begin, k_end);
  }
  cp_async_commit();
  int buf = 0;
  for (int c0 = k_begin; c0 < k_end; c0 += CHUNK, buf ^= 1) {
    if (c0 + CHUNK < k_end) {  // the next chunk lands in the other buffer while this one is read
      stage_narrow<FEW_ROWS, WIDTH, STRIDE, CHUNK, THREADS>(smem + (buf ^ 1) * CHUNK * STRIDE, A, B,
                                                           M, N, K, c0 + CHUNK, k_end);
      if constexpr (STAGED)
        stage_stream<FEW_ROWS, CHUNK, THREADS, BN>(stream_smem + (buf ^ 1) * STREAM_FLOATS, A, B, M, N,
                                                   K, at.block_row, at.block_col, c0 + CHUNK, k_end);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const float* chunk = smem + buf * CHUNK * STRIDE;
    // STAGED: the thread's line in this chunk: its row of A (few columns), its 4 columns of B (few rows)
    const float* mine = stream_smem + buf * STREAM_FLOATS + lane_line * (FEW_ROWS ? 4 : CHUNK + 1);
    // the group's share of the chunk's k rows (WARPS_K 1: all of them)
    const int kk_first = group_k * (CHUNK / WARPS_K);
    const int kk_last = min(k_end - c0, kk_first + CHUNK / WARPS_K);
    for (int kk = kk_first; kk < kk_last; kk += STEP) {
      if constexpr (STAGED) {  // this step's k of the thread's line, zero past k_end as staged
#pragma unroll
        for (int s = 0; s < STEP; ++s) {
          if constexpr (FEW_ROWS) {
            const float4 x = load_float4(mine + (kk + s) * BN);
            now[s][0] = x.x; now[s][1] = x.y; now[s][2] = x.z; now[s][3] = x.w;
          } else {
            now[s][0] = mine[kk + s];
          }
        }
      } else {
        load_stream<FEW_ROWS, VEC, STEP>(next, A, B, M, N, K, line, c0 + kk + STEP, k_end);
      }
#pragma unroll
      for (int s = 0; s < STEP; ++s) {
        const float* narrow = chunk + (kk + s) * STRIDE;  // the same address in every lane: a broadcast
#pragma unroll
        for (int i = 0; i < WIDTH; i += 4) {
          const float4 x = load_float4(narrow + i);
          if constexpr (FEW_ROWS) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              acc[i][e] += x.x * now[s][e];
              acc[i + 1][e] += x.y * now[s][e];
              acc[i + 2][e] += x.z * now[s][e];
              acc[i + 3][e] += x.w * now[s][e];
            }
          } else {
            acc[0][i] += now[s][0] * x.x;
            acc[0][i + 1] += now[s][0] * x.y;
            acc[0][i + 2] += now[s][0] * x.z;
            acc[0][i + 3] += now[s][0] * x.w;
          }
        }
      }
      if constexpr (!STAGED) {
#pragma unroll
        for (int s = 0; s < STEP; ++s)
#pragma unroll
          for (int e = 0; e < LANE_COLS; ++e) now[s][e] = next[s][e];
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is staged again
  }
  cp_async_wait<0>();

  // WARPS_K: the groups' sums added in shared memory (the chunk buffers, free now), each group
  // then holding WIDTH / WARPS_K rows of the tile: the sums of groups 0, 1, ... in that order.
  constexpr int ROWS = FEW_ROWS ? WIDTH / WARPS_K : WIDTH;  // rows of the tile a thread holds
  if constexpr (WARPS_K > 1) {
    __syncthreads();  // every thread's copies have landed and every chunk has been read
#pragma unroll
    for (int i = 0; i < WIDTH; ++i)
      *reinterpret_cast<float4*>(&smem[(group_k * WIDTH + i) * BN + lane_line * 4]) =
          make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int g = 0; g < WARPS_K; ++g) {
        const float4 p = load_float4(&smem[(g * WIDTH + group_k * ROWS + i) * BN + lane_line * 4]);
        sum.x += p.x; sum.y += p.y; sum.z += p.z; sum.w += p.w;
      }
      acc[i][0] = sum.x; acc[i][1] = sum.y; acc[i][2] = sum.z; acc[i][3] = sum.w;
    }
  }

  // The thread's sums as float4 groups of C's block tile: (row, col) within it.
  auto for_each_fragment = [&](auto&& visit) {
    if constexpr (FEW_ROWS) {
#pragma unroll
      for (int i = 0; i < ROWS; ++i) visit(group_k * ROWS + i, lane_line * 4, acc[i]);
    } else {
#pragma unroll
      for (int j = 0; j < WIDTH; j += 4) visit(static_cast<int>(threadIdx.x), j, &acc[0][j]);
    }
  };
  // K slices: the last to arrive adds them, every fragment's float4 of one or more parts in flight at once
  constexpr int FRAGMENTS = FEW_ROWS ? ROWS : WIDTH / 4;  // float4s of sums a thread holds
  if (!add_up_grid_slices_part_major<BM, BN, FRAGMENTS>(workspace, for_each_fragment)) return;
  for_each_fragment([&](int tile_row, int tile_col, float* v) {
    store_axpby_group<VEC_C>(C, M, N, at.block_row + tile_row, at.block_col + tile_col, v, alpha,
                             beta);
  });
}
