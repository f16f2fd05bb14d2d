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

// A barrier for the first THREADS threads of the block (named barrier 1), or for the whole block
// when THREADS is 0: warp-specialized kernels (22) sync their consumer warps only.
template <int THREADS>
__device__ __forceinline__ void sync_threads() {
  if constexpr (THREADS == 0) __syncthreads();
  else asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
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
  __shared__ int arrived;
  for_each_fragment([&](int row, int col, float* v) {
    __stcg(reinterpret_cast<float4*>(&mine[row * BN + col]), make_float4(v[0], v[1], v[2], v[3]));
  });
  __threadfence();  // this block's partial is visible device-wide before its ticket
  sync_threads<SYNC_THREADS>();
  if (threadIdx.x == 0) arrived = atomicAdd(ticket, 1);
  sync_threads<SYNC_THREADS>();
  if (arrived != parts - 1) return false;
  __threadfence();
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next launch
  return true;
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

// The thread tile of the FFMA chapters (21, 22): TM x TN accumulators, fed per k by TM / 4 + TN / 4
// LDS.128 (A transposed in shared memory, As[k][m]; B as stored, Bs[k][n]). A lane's float4
// groups are LANE_ROWS * 4 rows (LANE_COLS * 4 columns) apart, so a warp reads whole row pieces.
// Fragments of one k from the stage addresses a_addr / b_addr plus the k's byte offsets A_OFFSET /
// B_OFFSET, which stay in the instructions (lds128).
template <int TM, int TN, int LANE_ROWS, int LANE_COLS, int A_OFFSET, int B_OFFSET>
__device__ __forceinline__ void load_ffma_fragments(float (&frag_a)[TM], float (&frag_b)[TN],
                                                    unsigned a_addr, unsigned b_addr) {
  static_for<0, TM / 4>([&](auto g_const) {
    constexpr int g = decltype(g_const)::value;
    const float4 v = lds128<A_OFFSET + 16 * g * LANE_ROWS>(a_addr);
    frag_a[g * 4 + 0] = v.x; frag_a[g * 4 + 1] = v.y;
    frag_a[g * 4 + 2] = v.z; frag_a[g * 4 + 3] = v.w;
  });
  static_for<0, TN / 4>([&](auto h_const) {
    constexpr int h = decltype(h_const)::value;
    const float4 v = lds128<B_OFFSET + 16 * h * LANE_COLS>(b_addr);
    frag_b[h * 4 + 0] = v.x; frag_b[h * 4 + 1] = v.y;
    frag_b[h * 4 + 2] = v.z; frag_b[h * 4 + 3] = v.w;
  });
}
// The outer product of one k. FMA_ORDER 1: row by row (the A value shared by consecutive FFMAs);
// 2: 4-row groups against column pairs, turning at each pair (cuBLAS's order); 3: serpentine
// rows (also the B value shared at each turn).
template <int FMA_ORDER, int TM, int TN>
__device__ __forceinline__ void ffma_outer_product(float (&acc)[TM][TN], const float (&frag_a)[TM],
                                                   const float (&frag_b)[TN]) {
  if (FMA_ORDER == 2) {
#pragma unroll
    for (int g = 0; g < TM / 4; ++g)
#pragma unroll
      for (int p = 0; p < TN / 2; ++p)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = g * 4 + ((p & 1) ? (q + 2) % 4 : q);
#pragma unroll
          for (int e = 0; e < 2; ++e) acc[r][2 * p + e] += frag_a[r] * frag_b[2 * p + e];
        }
  } else {
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int cc = 0; cc < TN; ++cc) {
        const int c = (FMA_ORDER == 3 && (r & 1)) ? TN - 1 - cc : cc;
        acc[r][c] += frag_a[r] * frag_b[c];
      }
  }
}
// Where a lane's float4 number f of accumulators (acc[f / (TN / 4)][f % (TN / 4) * 4 ..]) sits in
// the block tile, from the lane's first float4: TM / 4 groups of 4 rows, LANE_ROWS * 4 rows
// apart, and TN / 4 float4s of a row, LANE_COLS * 4 columns apart.
template <int LANE_ROWS, int LANE_COLS, int TN>
__device__ __forceinline__ int ffma_fragment_row(int f) {
  return f / (TN / 4) / 4 * LANE_ROWS * 4 + f / (TN / 4) % 4;
}
template <int LANE_ROWS, int LANE_COLS, int TN>
__device__ __forceinline__ int ffma_fragment_col(int f) {
  return f % (TN / 4) * LANE_COLS * 4;
}
// visit(row, col, v) for each float4 of accumulators v at (row, col) of the block tile, in
// float4 order (f = (g * 4 + e) * (TN / 4) + h); the lane's first float4 is at (row0, col0).
template <int LANE_ROWS, int LANE_COLS, int TM, int TN, typename Visit>
__device__ __forceinline__ void for_each_ffma_fragment(float (&acc)[TM][TN], int row0, int col0,
                                                       Visit&& visit) {
#pragma unroll
  for (int g = 0; g < TM / 4; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int h = 0; h < TN / 4; ++h)
        visit(row0 + g * LANE_ROWS * 4 + e, col0 + h * LANE_COLS * 4, &acc[g * 4 + e][h * 4]);
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

// One k tile of A and B into a shared-memory stage, laid out as 21 and 22 read it: A transposed
// on the way (As[k][m]) by 4-byte copies, B as stored (Bs[k][n]) by VEC-float copies, COPIERS
// threads in all. BK threads share a row of A (consecutive k), so one copy instruction reads
// whole pieces of rows; COPIERS / BK threads share a k row of B. This thread copies A at row
// a_row + l * COPIERS / BK, k a_k (to a_dst, from element a_base + l * COPIERS / BK * K + kt * BK)
// and B at k b_k, column b_col + l * COPIERS / BK * VEC (to b_dst, from b_base + kt * BK * N + ..),
// into the stage at byte `offset`. Interior tiles (the block inside M and N, all BK k inside K:
// k_left >= BK) copy without predicates; at the edges a source outside the matrix copies 0 bytes
// from the matrix's first element (zero fill).
template <int BM, int BN, int BK, int VEC, int COPIERS>
__device__ __forceinline__ void copy_ffma_stage(const float* A, const float* B, int M, int N, int K,
                                                unsigned a_dst, unsigned b_dst, unsigned offset,
                                                unsigned a_base, unsigned b_base, int kt, int k_left,
                                                bool interior, int a_row, int a_k, int b_col, int b_k) {
  constexpr int A_ROW_STEP = COPIERS / BK;   // rows of A between a thread's copies
  constexpr int B_LANES = COPIERS / BK;      // threads per k row of B
  constexpr int A_COPIES = BM * BK / COPIERS;
  constexpr int B_COPIES = BK * BN / VEC / COPIERS;
  if (interior && k_left >= BK) {
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l)
      cp_async_4_shared(a_dst + offset + 4 * l * A_ROW_STEP, A + (a_base + l * A_ROW_STEP * K + kt * BK), 4);
    const float* b_src = B + (b_base + kt * BK * N);
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      if (VEC == 4) cp_async_16_shared(b_dst + offset + 16 * l * B_LANES, b_src + 4 * l * B_LANES, 16);
      else cp_async_4_shared(b_dst + offset + 4 * l * B_LANES, b_src + l * B_LANES, 4);
    }
  } else {
#pragma unroll
    for (int l = 0; l < A_COPIES; ++l) {
      const bool inside = a_row + l * A_ROW_STEP < M && a_k < k_left;
      cp_async_4_shared(a_dst + offset + 4 * l * A_ROW_STEP,
                        A + (inside ? a_base + l * A_ROW_STEP * K + kt * BK : 0), inside ? 4 : 0);
    }
#pragma unroll
    for (int l = 0; l < B_COPIES; ++l) {
      const bool inside = b_col + l * B_LANES * VEC < N && b_k < k_left;
      const float* src = B + (inside ? b_base + kt * BK * N + l * B_LANES * VEC : 0);
      if (VEC == 4) cp_async_16_shared(b_dst + offset + 16 * l * B_LANES, src, inside ? 16 : 0);
      else cp_async_4_shared(b_dst + offset + 4 * l * B_LANES, src, inside ? 4 : 0);
    }
  }
}

// --- Warp specialization (20, 22): mbarriers hand pipeline stages between producer and consumer
// warps; setmaxnreg moves registers between warpgroups (sm_90a) ---------------------------------
typedef unsigned long long u64;  // NVRTC has no <cstdint>

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// A phase completes when its arrivals (and the TMA bytes it expects) are all in.
__device__ __forceinline__ void mbar_init(u64* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival on the barrier once all of this thread's earlier cp.async copies have landed
// (.noinc: the barrier's expected count includes these arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(u64* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
// Wait until the phase with this parity has completed (a fresh barrier counts the phase before
// its first, parity 1, as complete: that is how the producer's first pass finds every stage free).
// ACQUIRE_CLUSTER: the wait also sees what other blocks of the cluster stored before arriving
// (mbar_arrive_remote).
template <bool ACQUIRE_CLUSTER = false>
__device__ __forceinline__ void mbar_wait(u64* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    if constexpr (ACQUIRE_CLUSTER)
      asm volatile(
          "{\n.reg .pred p;\n"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
// Whether the phase with this parity has completed, without waiting (acquire when it has).
__device__ __forceinline__ bool mbar_test(u64* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  return done != 0;
}
// The same wait for a thread that has nothing else to do (a producer ahead of its consumers):
// the suspend-time hint lets the hardware keep the thread asleep until the phase completes
// (up to 10 ms), instead of the short default after which the loop polls again. Without it,
// 22's producer warps spent ~8% of the issued instructions polling (Nsight Compute at 1024).
__device__ __forceinline__ void mbar_wait_asleep(u64* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_addr(bar)), "r"(parity), "r"(10000000) : "memory");
  }
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// ---- Thread-block clusters (sm_90): distributed shared memory ---------------------------------
// All threads of all blocks of the cluster meet (release / acquire at cluster scope): after it,
// every block of the cluster has started and sees what the others did before it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address of the same shared-memory location in block `rank` of the cluster.
__device__ __forceinline__ unsigned cluster_map(unsigned smem_address, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address), "r"(rank));
  return remote;
}
__device__ __forceinline__ void st_cluster_f32x4(unsigned remote, float x, float y, float z, float w) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n"
               ::"r"(remote), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
// One arrival on another block's barrier, after (release) this thread's stores to its memory.
__device__ __forceinline__ void mbar_arrive_remote(unsigned remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
