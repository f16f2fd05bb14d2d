// gemm/ffma_skinny.cu: the library's FP32 (FFMA) kernel for products with at most 32 rows or
// columns of C, down to the matrix-vector product (chapter 24 teaches the idea). Such a product
// is bound by memory bandwidth: the big operand is streamed once in 16-byte `__ldcs` loads issued
// before any FFMA, the small operand's K slice sits in shared memory, and K is cut into slices
// (grid.y) until every SM has several blocks; the last slice to arrive adds the partials in K
// order (split_k.cuh's count_in), so the result does not depend on the order slices finish in.
// - Two layouts (FEW_ROWS, from the shape): few columns (N <= WIDTH), a warp walks whole rows of
//   A and adds a row's WIDTH sums across lanes by shuffles; few rows (M <= WIDTH), a lane owns a
//   float4 of columns of C and walks K down B's rows, the warps' sums added in shared memory.
// - PREFETCH (the config's rule: width 1 only) issues each warp's first loads of the big operand
//   before the small operand's slice is staged, so those two round trips overlap; at width 8 the
//   registers held across the staging cost more than the overlap saved (chapter 24's header).
// - Every build compiles to chapter 24's machine code byte for byte (tests/test_skinny_sass.py):
//   nvcc's register choices follow the source's form, so the forms 24 measured are kept.
// - Any M, N, K, alpha, beta with min(M, N) <= 32: VEC = 4 where the streamed operand's rows are
//   16-byte aligned, single floats where not.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  few columns: WARPS * ROWS_PER_WARP rows of C x all N columns, one K slice
//               few rows:    all M rows x 32 * VEC columns of C, one K slice
//   warp tile   few columns: ROWS_PER_WARP rows, one at a time, all of the K slice
//               few rows:    the block's columns, K_SLICE / WARPS of the K slice
//   thread tile few columns: WIDTH sums of one row over VEC k per chunk (CHUNKS chunks)
//               few rows:    WIDTH rows x VEC columns of C (WIDTH * VEC accumulators)
#include "../include/common.cuh"
#include "../include/split_k.cuh"

// C(m, n) = alpha * sum + beta * C(m, n), or the partial sum to its slice of the workspace.
__device__ __forceinline__ void store_or_publish(float* C, float* partial, int M, int N, int m,
                                                 int n, float sum, float alpha, float beta,
                                                 int slices) {
  if (slices == 1) store_axpby(&C[(size_t)m * N + n], sum, alpha, beta);
  else __stcg(&partial[(size_t)m * N + n], sum);
}

// The last slice to arrive adds every slice's partial at (m, n) in K order.
__device__ __forceinline__ void reduce_slices(float* C, const float* workspace, int M, int N,
                                              int m, int n, float alpha, float beta, int slices) {
  float sum = 0.0f;
  for (int s = 0; s < slices; ++s) sum += __ldcg(&workspace[((size_t)s * M + m) * N + n]);
  store_axpby(&C[(size_t)m * N + n], sum, alpha, beta);
}

// The streamed operand's loads, every one issued before any FFMA: A's row m from k0 (few
// columns), B's UNROLL rows from kw (few rows), zeros outside the operand. Macros, not functions:
// written inline (no PREFETCH) and inside the prefetching lambda (PREFETCH) they compile to
// chapter 24's code in each case, while nvcc numbers a conditional float4 load's registers in
// the other order when a function (lambda or helper) holds the load, and ptxas then allocates
// them differently (tests/test_skinny_sass.py).
#define LOAD_A_ROW(dst, m)                                                                        \
  {                                                                                               \
    const float* a_row = A + (size_t)(m) * K + k0;                                                \
    _Pragma("unroll") for (int c = 0; c < CHUNKS; ++c) {                                          \
      const int kk = (c * 32 + lane) * VEC;                                                       \
      if constexpr (VEC == 4) {                                                                   \
        const float4 v = kk < k_len ? __ldcs(reinterpret_cast<const float4*>(a_row + kk))         \
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);                        \
        dst[c][0] = v.x; dst[c][1] = v.y; dst[c][2] = v.z; dst[c][3] = v.w;                       \
      } else {                                                                                    \
        dst[c][0] = kk < k_len ? __ldcs(a_row + kk) : 0.0f;                                       \
      }                                                                                           \
    }                                                                                             \
  }
#define LOAD_B_ROWS(dst, kw)                                                                      \
  {                                                                                               \
    _Pragma("unroll") for (int u = 0; u < UNROLL; ++u) {                                          \
      const int kk = (kw) + u;                                                                    \
      const float* p = B + (size_t)(k0 + kk) * N + n;                                             \
      if constexpr (VEC == 4) {                                                                   \
        const float4 v = (inside && kk < k_len) ? __ldcs(reinterpret_cast<const float4*>(p))      \
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);            \
        dst[u][0] = v.x; dst[u][1] = v.y; dst[u][2] = v.z; dst[u][3] = v.w;                       \
      } else {                                                                                    \
        dst[u][0] = (inside && kk < k_len) ? __ldcs(p) : 0.0f;                                    \
      }                                                                                           \
    }                                                                                             \
  }

// Few columns: C(m, 0 .. N-1) = A(m, :) B for the block's rows. B's K slice is staged as
// b_slice[j][kk] (WIDTH rows of B_STRIDE, zero outside B); the 4 floats of padding per row put
// the WIDTH columns of one k on different banks, so the staging stores (read along B's rows,
// coalesced) do not conflict, and keep every row 16-byte aligned for the float4 reads.
template <int WIDTH, int WARPS, int VEC, int K_SLICE, int ROWS_PER_WARP, int PREFETCH>
__device__ __forceinline__ void few_columns(int M, int N, int K, float alpha,
                                            const float* __restrict__ A,
                                            const float* __restrict__ B, float beta,
                                            float* __restrict__ C, float* workspace,
                                            float* b_slice) {
  constexpr int CHUNKS = K_SLICE / (32 * VEC);  // float4s (VEC floats) of a row per lane
  constexpr int B_STRIDE = K_SLICE + 4;
  const int k0 = blockIdx.y * K_SLICE, slices = gridDim.y;
  const int k_len = min(K_SLICE, K - k0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // the block's first row, computed where chapter 24's build of each layout computes it (before
  // or after the staging): the position alone changes the registers ptxas picks
  int row0;
  float a[CHUNKS][VEC];
  auto load_row = [&](int m) { LOAD_A_ROW(a, m) };
  // PREFETCH: the warp's first row is requested before B's slice is staged, so the block's two
  // first memory round trips (A from DRAM, B's slice from L2) overlap instead of following each
  // other.
  if constexpr (PREFETCH) {
    row0 = blockIdx.x * WARPS * ROWS_PER_WARP;
    if (row0 + warp * ROWS_PER_WARP < M) load_row(row0 + warp * ROWS_PER_WARP);
  }
  for (int i = threadIdx.x; i < WIDTH * K_SLICE; i += WARPS * 32) {
    const int j = i % WIDTH, kk = i / WIDTH;
    b_slice[j * B_STRIDE + kk] = (j < N && kk < k_len) ? B[(size_t)(k0 + kk) * N + j] : 0.0f;
  }
  __syncthreads();

  if constexpr (!PREFETCH) row0 = blockIdx.x * WARPS * ROWS_PER_WARP;
  float* partial = workspace + (size_t)blockIdx.y * M * N;
  for (int r = 0; r < ROWS_PER_WARP; ++r) {
    const int m = row0 + warp * ROWS_PER_WARP + r;
    if (m >= M) break;  // warp-uniform
    if constexpr (PREFETCH) {
      if (r > 0) load_row(m);
    } else {
      LOAD_A_ROW(a, m)
    }
    float sum[WIDTH];
#pragma unroll
    for (int j = 0; j < WIDTH; ++j) sum[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int kk = (c * 32 + lane) * VEC;
#pragma unroll
      for (int j = 0; j < WIDTH; ++j) {
        if constexpr (VEC == 4) {
          const float4 b = *reinterpret_cast<const float4*>(&b_slice[j * B_STRIDE + kk]);
          sum[j] += a[c][0] * b.x + a[c][1] * b.y + a[c][2] * b.z + a[c][3] * b.w;
        } else {
          sum[j] += a[c][0] * b_slice[j * B_STRIDE + kk];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < WIDTH; ++j)
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], offset);
#pragma unroll
    for (int j = 0; j < WIDTH; ++j)
      if (lane == j && j < N) store_or_publish(C, partial, M, N, m, j, sum[j], alpha, beta, slices);
  }
  if (slices == 1) return;
  if (!count_in<0>(slices, reinterpret_cast<int*>(workspace + (size_t)slices * M * N) + blockIdx.x))
    return;
  const int rows = min(WARPS * ROWS_PER_WARP, M - row0);
  for (int i = threadIdx.x; i < rows * N; i += WARPS * 32)
    reduce_slices(C, workspace, M, N, row0 + i / N, i % N, alpha, beta, slices);
}

// Few rows: C(0 .. M-1, n .. n + VEC - 1) = A B(:, n ..) for the block's columns. A's K slice
// is staged k-major as a_slice[kk][i] (K_SLICE x WIDTH, zero outside A); after the K loop the
// same shared memory holds the warps' sums, sums[warp][i][col].
template <int WIDTH, int WARPS, int VEC, int K_SLICE, int UNROLL, int PREFETCH>
__device__ __forceinline__ void few_rows(int M, int N, int K, float alpha,
                                         const float* __restrict__ A,
                                         const float* __restrict__ B, float beta,
                                         float* __restrict__ C, float* workspace, float* smem) {
  constexpr int COLS = 32 * VEC, K_WARP = K_SLICE / WARPS;
  const int k0 = blockIdx.y * K_SLICE, slices = gridDim.y;
  const int k_len = min(K_SLICE, K - k0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * COLS, n = n0 + lane * VEC;
  // VEC = 4: N % 4 == 0, so a float4 of columns is in or out whole; set where each layout's
  // measured build sets it, as row0 in few_columns
  bool inside;
  float b_first[UNROLL][VEC];  // PREFETCH: the rows in flight, first loaded before the staging
  auto load_rows = [&](int kw) { LOAD_B_ROWS(b_first, kw) };
  // PREFETCH: the warp's first rows of B are requested before A's slice is staged, so the
  // block's two first memory round trips (B from DRAM, A's slice from L2) overlap instead of
  // following each other.
  if constexpr (PREFETCH) {
    inside = n < N;
    load_rows(warp * K_WARP);
  }
  float* a_slice = smem;
  for (int i = threadIdx.x; i < WIDTH * K_SLICE; i += WARPS * 32) {
    const int row = i / K_SLICE, kk = i % K_SLICE;  // coalesced along A's row
    a_slice[kk * WIDTH + row] = (row < M && kk < k_len) ? A[(size_t)row * K + k0 + kk] : 0.0f;
  }
  __syncthreads();

  float acc[WIDTH][VEC];
#pragma unroll
  for (int i = 0; i < WIDTH; ++i)
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[i][e] = 0.0f;
  if constexpr (!PREFETCH) inside = n < N;
  for (int kw = warp * K_WARP; kw < (warp + 1) * K_WARP; kw += UNROLL) {
    float b_step[UNROLL][VEC];  // without PREFETCH: this step's rows, declared in the loop as in 24
    float (&b)[UNROLL][VEC] = PREFETCH ? b_first : b_step;
    if constexpr (PREFETCH) {
      if (kw != warp * K_WARP) load_rows(kw);
    } else {
      LOAD_B_ROWS(b_step, kw)
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const float* a_k = &a_slice[(kw + u) * WIDTH];
#pragma unroll
      for (int i = 0; i < WIDTH; i += 4) {
        float a[4];
        if constexpr (WIDTH >= 4) {
          const float4 v = *reinterpret_cast<const float4*>(a_k + i);  // a broadcast
          a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) a[q] = q < WIDTH ? a_k[i + q] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < 4 && i + q < WIDTH; ++q)
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[i + q][e] += a[q] * b[u][e];
      }
    }
  }
  __syncthreads();  // every warp is done with a_slice: it becomes sums[WARPS][WIDTH][COLS]
  float* sums = smem;
#pragma unroll
  for (int i = 0; i < WIDTH; ++i) {
    float* out = &sums[(warp * WIDTH + i) * COLS + lane * VEC];
    if constexpr (VEC == 4) store_float4(out, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    else out[0] = acc[i][0];
  }
  __syncthreads();

  float* partial = workspace + (size_t)blockIdx.y * M * N;
  const int rows = min(M, WIDTH);
  for (int i = threadIdx.x; i < rows * COLS; i += WARPS * 32) {
    const int row = i / COLS, col = i % COLS;  // coalesced along C's row
    if (n0 + col >= N) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += sums[(w * WIDTH + row) * COLS + col];
    store_or_publish(C, partial, M, N, row, n0 + col, sum, alpha, beta, slices);
  }
  if (slices == 1) return;
  if (!count_in<0>(slices, reinterpret_cast<int*>(workspace + (size_t)slices * M * N) + blockIdx.x))
    return;
  for (int i = threadIdx.x; i < rows * COLS; i += WARPS * 32) {
    const int row = i / COLS, col = i % COLS;
    if (n0 + col < N) reduce_slices(C, workspace, M, N, row, n0 + col, alpha, beta, slices);
  }
}

#undef LOAD_A_ROW
#undef LOAD_B_ROWS

// FEW_ROWS 0: N <= WIDTH (few columns); 1: M <= WIDTH (few rows). grid.x walks the big side,
// grid.y the K slices. TUNE is ROWS_PER_WARP (few columns) or UNROLL (few rows). PREFETCH
// (width 1, the config's derived rule) issues the big operand's first loads before the small
// operand's slice is staged.
template <int FEW_ROWS, int WIDTH, int WARPS, int VEC, int K_SLICE, int TUNE, int PREFETCH>
__global__ void __launch_bounds__(WARPS * 32)
    gemm_ffma_skinny(int M, int N, int K, float alpha, const float* __restrict__ A,
                 const float* __restrict__ B, float beta, float* __restrict__ C,
                 float* __restrict__ workspace) {
  extern __shared__ __align__(16) float smem[];
  if constexpr (FEW_ROWS)
    few_rows<WIDTH, WARPS, VEC, K_SLICE, TUNE, PREFETCH>(M, N, K, alpha, A, B, beta, C, workspace,
                                                          smem);
  else
    few_columns<WIDTH, WARPS, VEC, K_SLICE, TUNE, PREFETCH>(M, N, K, alpha, A, B, beta, C,
                                                             workspace, smem);
}
