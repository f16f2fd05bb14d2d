// wgmma_epilogue.cuh: writing a wgmma consumer's accumulators back to C for any M and N, as 25 and
// the library's kernels use it (23 keeps its own copy, to read on its own). A consumer lane of 20's
// layout (C^T = B^T A^T in the accumulators) holds two adjacent columns n, n + 1 of C for BM / 4
// rows (store_row_groups); one of 27's layout (C = A B, A from registers) holds two rows m, m + 8
// of C for pairs of adjacent columns (store_column_groups). Both store alpha * acc + beta * C,
// predicated on M and N. In its own header because every chapter that runs rows not 16-byte aligned
// needs the same predicated stores (20 keeps its own pair-only epilogue: its N is a multiple of 4).
#ifndef SGEMM_LAB_WGMMA_EPILOGUE_CUH
#define SGEMM_LAB_WGMMA_EPILOGUE_CUH

// The epilogue: C(m, n .. n + 1) for GROUPS row groups of this lane (rows m0 + 8j + 2t and
// m0 + 8j + 2t + 1 for j < GROUPS; acc[4j + {0, 2}] and acc[4j + {1, 3}] as in wgmma.cuh), any
// GROUPS (a fitted tile's 9 groups: a batch of 8, then 1), any
// N (a pair of columns is read and stored as a float2 only when N is even, so its address is
// 8-byte aligned). With beta != 0 the old C is read in batches of EPI_BATCH row groups, all loads
// before any store, as in 20: one row at a time, each row waited a full global-memory latency.
template <int GROUPS>
__device__ __forceinline__ void store_row_groups(const float* acc, float* C, int M, int N, int m0,
                                                 int n, int t, float alpha, float beta) {
  constexpr int EPI_BATCH = GROUPS < 8 ? GROUPS : 8;  // up to 16 float2 loads in flight per thread
  constexpr int WHOLE = GROUPS / EPI_BATCH * EPI_BATCH;  // the rest (GROUPS not a multiple of 8) after
  if (n >= N) return;
  const bool pair = n + 1 < N && N % 2 == 0;
  const bool second = n + 1 < N;  // this lane's second column is inside C
#pragma unroll
  for (int j0 = 0; j0 < WHOLE; j0 += EPI_BATCH) {
    float2 old[EPI_BATCH][2];
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        const float* p = C + (size_t)m * N + n;
        old[j][h] = make_float2(0.0f, 0.0f);
        if (beta != 0.0f && m < M) {
          if (pair) old[j][h] = *reinterpret_cast<const float2*>(p);
          else old[j][h] = make_float2(p[0], second ? p[1] : 0.0f);
        }
      }
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + 8 * (j0 + j) + 2 * t + h;
        if (m >= M) continue;
        float* p = C + (size_t)m * N + n;
        const float* v = acc + 4 * (j0 + j) + h;
        const float2 out = make_float2(alpha * v[0] + beta * old[j][h].x,
                                       alpha * v[2] + beta * old[j][h].y);
        if (pair) {
          *reinterpret_cast<float2*>(p) = out;
        } else {
          p[0] = out.x;
          if (second) p[1] = out.y;
        }
      }
  }
  if constexpr (GROUPS > WHOLE)
    store_row_groups<GROUPS - WHOLE>(acc + 4 * WHOLE, C, M, N, m0 + 8 * WHOLE, n, t, alpha, beta);
}

// The same epilogue with the old C read from a copy of the block's tile in shared memory (row r,
// column c of the tile at old[r * STRIDE + c], rows from m0, columns from n0), which the producer
// threads filled while the main loop ran: no global load after the main loop. N % 4 == 0 (the copy
// moved whole 16-byte chunks), so a lane's two columns are a float2 in C. With beta 0 nothing was
// copied and nothing is read.
template <int GROUPS, int STRIDE>
__device__ __forceinline__ void store_row_groups_from(const float* acc, const float* old, float* C,
                                                      int M, int N, int m0, int n0, int n, int t,
                                                      float alpha, float beta) {
  if (n >= N) return;
#pragma unroll
  for (int j = 0; j < GROUPS; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 8 * j + 2 * t + h, m = m0 + r;
      if (m >= M) continue;
      const float2 was = beta != 0.0f
          ? *reinterpret_cast<const float2*>(old + r * STRIDE + (n - n0))
          : make_float2(0.0f, 0.0f);
      const float* v = acc + 4 * j + h;
      *reinterpret_cast<float2*>(C + (size_t)m * N + n) =
          make_float2(alpha * v[0] + beta * was.x, alpha * v[2] + beta * was.y);
    }
}

// A consumer lane's whole block tile: BM / 4 rows, BM / 8 row groups.
template <int BM>
__device__ __forceinline__ void store_tile(const float* acc, float* C, int M, int N, int m0,
                                           int n, int t, float alpha, float beta) {
  store_row_groups<BM / 8>(acc, C, M, N, m0, n, t, alpha, beta);
}

// 27's layout: C(m, n + 8j .. n + 8j + 1) in acc[4j + {0, 1}] and C(m + 8, ...) in acc[4j + {2,
// 3}] for GROUPS column groups j (wgmma.cuh's D with m = 16w + g and n = 2t), any M and N, with
// the old C read in batches of EPI_BATCH column groups before any store, as above; columns from
// cols_end on are left alone (N, or a fitted tile's end where its K slices' shares are uneven).
template <int GROUPS>
__device__ __forceinline__ void store_column_groups(const float* acc, float* C, int M, int N,
                                                    int m, int n, float alpha, float beta,
                                                    int cols_end) {
  constexpr int EPI_BATCH = GROUPS < 8 ? GROUPS : 8;
  constexpr int WHOLE = GROUPS / EPI_BATCH * EPI_BATCH;  // the rest (GROUPS not a multiple of 8) after
#pragma unroll
  for (int j0 = 0; j0 < WHOLE; j0 += EPI_BATCH) {
    float2 old[EPI_BATCH][2];
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m + 8 * h, col = n + 8 * (j0 + j);
        const float* p = C + (size_t)row * N + col;
        old[j][h] = make_float2(0.0f, 0.0f);
        if (beta != 0.0f && row < M && col < cols_end) {
          if (col + 1 < cols_end && N % 2 == 0) old[j][h] = *reinterpret_cast<const float2*>(p);
          else old[j][h] = make_float2(p[0], col + 1 < cols_end ? p[1] : 0.0f);
        }
      }
#pragma unroll
    for (int j = 0; j < EPI_BATCH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m + 8 * h, col = n + 8 * (j0 + j);
        if (row >= M || col >= cols_end) continue;
        float* p = C + (size_t)row * N + col;
        const float* v = acc + 4 * (j0 + j) + 2 * h;
        const float2 out = make_float2(alpha * v[0] + beta * old[j][h].x,
                                       alpha * v[1] + beta * old[j][h].y);
        if (col + 1 < cols_end && N % 2 == 0) {
          *reinterpret_cast<float2*>(p) = out;
        } else {
          p[0] = out.x;
          if (col + 1 < cols_end) p[1] = out.y;
        }
      }
  }
  if constexpr (GROUPS > WHOLE)
    store_column_groups<GROUPS - WHOLE>(acc + 4 * WHOLE, C, M, N, m, n + 8 * WHOLE, alpha, beta,
                                        cols_end);
}

#endif  // SGEMM_LAB_WGMMA_EPILOGUE_CUH
