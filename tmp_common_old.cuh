// common.cuh: the few helpers every chapter shares.
//
// Every kernel computes C = alpha * A @ B + beta * C on row-major FP32 matrices,
// A is M x K, B is K x N, C is M x N, with the same argument list:
//   (int M, int N, int K, float alpha, const float* A, const float* B, float beta, float* C)
// The runner (src/compile.py) pastes this header into each kernel's source before
// handing it to NVRTC, so the compiled text (and CuPy's cache key) is self-contained.
#pragma once

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// The epilogue, C = alpha * acc + beta * C. BLAS convention: when beta == 0, C is output-only
// and is never read, so whatever it held before (uninitialised memory, NaN) cannot leak into the
// result; 0 * NaN would be NaN. It also saves the read of C. The branch is uniform across the grid.
__device__ __forceinline__ void store_axpby(float* c, float acc, float alpha, float beta) {
  *c = (beta == 0.0f) ? alpha * acc : alpha * acc + beta * *c;
}

// 16-byte views of 4 consecutive floats. The address must be 16-byte aligned:
// kernels that use them list `n % 4 == 0` / `k % 4 == 0` among their constraints.
__device__ __forceinline__ float4 load_float4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store_float4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

// Which block tile and K slice a block of a one-dimensional grid computes (17, 21). Slices are
// the slowest index. Within a slice consecutive blocks walk a column of GROUP_M block rows before
// moving right, so the blocks resident at one time share a few rows of A and columns of B in L2.
struct BlockTile {
  int tiles;          // block tiles of C
  int slice;          // which of the SPLIT_K slices of K
  int tile_m, tile_n; // block tile coordinates
  int tile;           // tile_m * tiles_n + tile_n
};
template <int BM, int BN, int GROUP_M>
__device__ __forceinline__ BlockTile grouped_block_tile(int M, int N) {
  const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
  const int tiles = tiles_m * tiles_n;
  const int pid = blockIdx.x % tiles;
  const int group_rows = GROUP_M * tiles_n;           // blocks in one group of GROUP_M block rows
  const int first_row = (pid / group_rows) * GROUP_M;
  const int rows_here = min(tiles_m - first_row, GROUP_M);
  const int tile_m = first_row + (pid % group_rows) % rows_here;
  const int tile_n = (pid % group_rows) / rows_here;
  const int slice = blockIdx.x / tiles;  // as unsigned, like the tile index
  return {tiles, slice, tile_m, tile_n, tile_m * tiles_n + tile_n};
}

// Split-K: every block of a tile writes its partial tile to the workspace ([SPLIT_K][tiles]
// [BM * BN], then one ticket per tile) and counts itself in on the tile's ticket; the last one to
// arrive sums the slices in slice order (so the result does not depend on arrival order) into
// its accumulators and resets the ticket. `for_each_fragment(visit)` calls visit(row, col, v)
// for each float4 of accumulators v at (row, col) of the block tile. Returns false in the blocks
// that are not last: their partial waits in the workspace and they are done.
template <int SPLIT_K, int BM, int BN, typename ForEachFragment>
__device__ __forceinline__ bool split_k_reduce(float* workspace, const BlockTile& at,
                                               ForEachFragment&& for_each_fragment) {
  float* partials = workspace;
  int* tickets = reinterpret_cast<int*>(workspace + (size_t)SPLIT_K * at.tiles * BM * BN);
  __shared__ int arrived;
  float* mine = partials + ((size_t)at.slice * at.tiles + at.tile) * BM * BN;
  for_each_fragment([&](int row, int col, float* v) {
    __stcg(reinterpret_cast<float4*>(&mine[row * BN + col]), make_float4(v[0], v[1], v[2], v[3]));
  });
  __threadfence();  // this block's partial is visible device-wide before its ticket
  __syncthreads();
  if (threadIdx.x == 0) arrived = atomicAdd(&tickets[at.tile], 1);
  __syncthreads();
  if (arrived != SPLIT_K - 1) return false;
  __threadfence();
  if (threadIdx.x == 0) tickets[at.tile] = 0;  // ready for the next launch
  for_each_fragment([&](int row, int col, float* v) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < SPLIT_K; ++s) {
      const float4 p = __ldcg(reinterpret_cast<const float4*>(
          &partials[((size_t)s * at.tiles + at.tile) * BM * BN + row * BN + col]));
      sum.x += p.x; sum.y += p.y; sum.z += p.z; sum.w += p.w;
    }
    v[0] = sum.x; v[1] = sum.y; v[2] = sum.z; v[3] = sum.w;
  });
  return true;
}

// A loop over I = BEGIN .. END-1 whose body gets I as a compile-time constant (Int<I>::value),
// for bodies that instantiate templates with it (e.g. lds128's offset).
template <int V>
struct Int {
  static constexpr int value = V;
};
template <int BEGIN, int END, typename Body>
__device__ __forceinline__ void static_for(Body&& body) {
  if constexpr (BEGIN < END) {
    body(Int<BEGIN>{});
    static_for<BEGIN + 1, END>(body);
  }
}

// A 16-byte shared-memory load at a shared-window address plus a compile-time byte offset: the
// offset stays in the instruction (LDS.128 [R+imm]), so unrolled loops over k need one address
// register instead of one per load. volatile keeps it ordered with the barriers around it.
template <int OFFSET>
__device__ __forceinline__ float4 lds128(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4 + %5];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr), "n"(OFFSET));
  return v;
}

// store_axpby for 4 consecutive elements of C (16-byte aligned), acc[0..3] the accumulators.
__device__ __forceinline__ void store_axpby4(float* c, const float* acc, float alpha, float beta) {
  float4 v;
  if (beta == 0.0f) {
    v = make_float4(alpha * acc[0], alpha * acc[1], alpha * acc[2], alpha * acc[3]);
  } else {
    v = load_float4(c);
    v.x = alpha * acc[0] + beta * v.x;
    v.y = alpha * acc[1] + beta * v.y;
    v.z = alpha * acc[2] + beta * v.z;
    v.w = alpha * acc[3] + beta * v.w;
  }
  store_float4(c, v);
}

// The j-th component of a float4; j must be a compile-time constant after unrolling, so the
// selection folds away and no register array is indexed at run time (no local memory).
__device__ __forceinline__ float component(const float4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

// Asynchronous global -> shared copies (sm_80+): the data goes straight to shared memory without
// passing through registers, and the thread can go on issuing work while it is in flight.
// `bytes_valid` < size copies that many bytes and zero-fills the rest (0: only zeros), which is
// how edge tiles are predicated without branches around the copy.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int bytes_valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(bytes_valid));
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int bytes_valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(bytes_valid));
}
// The same copies with the destination given as a shared-memory address (a 32-bit offset into
// the block's shared window), for kernels that keep precomputed destinations in registers.
__device__ __forceinline__ void cp_async_16_shared(unsigned smem, const void* gmem, int bytes_valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(bytes_valid));
}
__device__ __forceinline__ void cp_async_4_shared(unsigned smem, const void* gmem, int bytes_valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(bytes_valid));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}
