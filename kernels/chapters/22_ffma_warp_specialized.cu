// 22 FFMA, warp-specialized and persistent: 21's compute warps fed by a producer warpgroup, one
// block per SM, the last wave split by stream-K; at small sizes a tile's K slices form a
// thread-block cluster. The first FP32 kernel here above cuBLAS, at 1024 by more than 1.2x.
//
// What changed from 21, and why. Nsight Compute left 21 at 81% of issue slots busy (cuBLAS 88%).
// What remained sat at the tile change, where every warp copies, waits and meets the others:
// scoreboard stalls on registers the copies still had to read, instruction-cache misses in the
// 2,000-instruction loop, and the whole block stalled together at __syncthreads.
// - A producer warpgroup (4 warps, one per SM sub-partition) issues all the cp.async copies; the
//   compute warps only load fragments and multiply. A STAGES-deep ring of shared-memory stages
//   is handed over with mbarriers: the producers' copies arrive on a stage's `full` barrier as
//   they land (cp.async.mbarrier.arrive), the consumers arrive on its `empty` barrier when they
//   have read it. No __syncthreads in the K loop: each consumer warp runs at its own pace.
//   setmaxnreg leaves the producers 48 registers and gives the consumers 224.
// - BK = 8: a tile change now costs a barrier test and an arrive, not copies, so the loop can be
//   half as long (1,100 instructions), which the instruction cache holds better.
// - Persistent blocks (SCHEDULE 2): one block per SM walks whole tiles, then the K loops of the
//   tiles of the last, partial wave are cut into equal runs, one per block (stream-K), so no SM
//   idles through a last wave (4096 at 128 x 256: 512 tiles = 3.88 waves of 132 SMs). The last
//   part of a split tile to finish adds the others' partials in K order (deterministic). When the
//   last wave is nearly full (2048: 128 tiles) whole tiles cost less than splitting.
// - The consumers' K loop runs over all of the block's k tiles, unit after unit, with each
//   unit's epilogue in between, and checks whether the next k tile has landed half a tile early
//   (mbarrier.test_wait), so that answer is in by the tile's last k.
// What the SASS needed (read with cuobjdump after each step; ptxas decides a lot here):
// - Epilogues must not constrain the accumulators' registers: storing them raw (a 16-byte store
//   wants four consecutive registers) or summing partials into them dropped the loop's in-place
//   FFMAs from 78% to 56%. Partials are stored as alpha * acc and summed in a plain loop.
// - That loop's trip count must not depend on the thread index, or the K loop's counters leave
//   the uniform registers (4% slower, and the same at sizes with no stream-K at all).
// - The lane's fragment offsets are made opaque, or ptxas recomputes them from the thread index
//   at every k tile.
// Measured effect (H200, benchmarks/variants.py, % of cuBLAS FP32 at 4096 / 8192): producer
// warpgroup with 21's BK = 16: 92-94%; BK = 8: 97.8 / 98.5%; persistent stream-K once the
// epilogue left the loop alone: 99.4 / 101.5% (one block per tile: 96.9 / 97.8%); opaque fragment
// offsets: 99.9 / 101.6%; the early barrier test: 102.2 / 104.2% (84% of the loop's FFMAs in
// place); 48 producer registers (40 spilled in the 4-byte-copy path), 224 for the consumers:
// 102.7 / 104.6%. Tried and left: 256 x 128 block tiles (91%), 8 x 16 thread tiles (96%), 128 x 32 warp
// tiles (99%), row-order FFMAs (90%), stages 4 vs 6 and group_m 4 / 8 / 16 (within 0.2%),
// sleeping producers between polls (no change). 1024 (32 tiles, each split in 4): 95%.
// Small sizes (SCHEDULE 3): 1024 is 32 tiles of 128 x 256 for 132 SMs. Stream-K cut them in four
// and paid for it after the K loops: each part wrote 128 KB of partial sums to L2 and the last
// part read them all back, one float4 in flight per thread (14 us at 1024; with eight in flight,
// 106% of cuBLAS). Clusters keep that traffic off L2: 128 x 128 tiles, each tile's two K halves
// one cluster of 2 blocks (64 tiles: 128 blocks), which add up through distributed shared
// memory. Each block owns half of every thread's accumulators, stores alpha * each half straight
// into the shared memory of the block that owns it (st.shared::cluster), arrives on its barrier
// and adds its own half up: 2.3 us after the K loop instead of 8-18. With BK = 16 (the K
// loop is shorter per tile): 127% of cuBLAS at 1024 on the H200 (BK = 8: 121%). Clusters of 4
// (128 x 256 tiles in 4 K slices) do not fit: 30 clusters of 4 blocks of this size are resident
// at once on an H100, and 1024 needs 32 (64%).
// Kept from 21: A transposed on its way into shared memory by 4-byte copies, both operands read
// as LDS.128 with the k offset in the instruction, fragments double-buffered in registers, the
// serpentine FFMA order, grouped tile order, split-K (SCHEDULE 1), any M, N, K, alpha, beta.
//
// Tile hierarchy (names: kernels/README.md, tile vocabulary):
//   block tile  BM x BN, k tiles of BK, STAGES stages in the producer -> consumer ring;
//               (SCHEDULE 1) SPLIT_K K slices, (2) stream-K pieces, (3) SPLIT_K K slices as
//               the blocks of one cluster
//   warp tile   WM x WN (consumer warps only), lane grid (WM / TM) x (WN / TN)
//   thread tile TM x TN as (TM / 4) x (TN / 4) float4 groups; fragments: TM of A, TN of B per
//               k, two register sets
#include "../include/common.cuh"
#include "../include/tile_order.cuh"
#include "../include/split_k.cuh"
#include "../include/ffma_stage.cuh"
#include "../include/ffma_thread_tile.cuh"
#include "../include/mbarrier.cuh"
#include "../include/warpgroup.cuh"
#include "../include/cluster.cuh"

// A block's share of the work: k tiles [k_begin, k_end) of block tile `tile` (its position in
// the grouped order). `parts` blocks share the tile's K (1: this block computes it whole); this
// is part `part` of them in K order. Stream-K pieces also name the block computing part 0.
struct WorkUnit {
  int tile, k_begin, k_end;
  int parts, part, first_block;
};

// Stream-K over the tiles left after the last full wave (persistent blocks, SCHEDULE = 2).
// The first dp_tiles tiles go whole to blocks in turn (tile b, b + P, ...: P = the grid, one
// block per SM). The K loops of the other tiles are laid end to end and cut into one equal run
// per participating block, so every block ends at the same time instead of a last wave that
// leaves SMs idle (4096 at 128 x 256: 512 tiles = 3.88 waves of 132). At most SK_SPLIT
// participants per tile on average, which bounds the partial sums to add.
struct StreamK {
  int iters;             // k tiles per tile
  int dp_tiles;          // tiles computed whole
  int participants;      // blocks that share the rest
  long long sk_iters;    // k tiles of the rest, end to end
  __device__ __forceinline__ long long start(int b) const { return b * sk_iters / participants; }
  // how many whole tiles block b of a grid of P computes (tiles b, b + P, ...)
  __device__ __forceinline__ int whole_tiles(int b, int P) const {
    return b < dp_tiles ? CEIL_DIV(dp_tiles - b, P) : 0;
  }
  // the participant whose run holds k tile x of the rest
  __device__ __forceinline__ int owner(long long x) const {
    return static_cast<int>(((x + 1) * participants - 1) / sk_iters);
  }
};

// What every step of both roles reads: the GEMM's arguments and the grid of block tiles.
struct WsProblem {
  int M, N, K;
  float alpha;
  const float* A;
  const float* B;
  float beta;
  float* C;
  float* workspace;
  int tiles_m, tiles_n, tiles;
  int iters;  // k tiles per tile
};

// Where a consumer lane's thread tile sits: its warp tile's first row and column in the block
// tile, and the lane's row and column among the warp's LANE_ROWS x LANE_COLS lanes.
struct ConsumerLane {
  int warp_m, warp_n, lane_row, lane_col;
};

// The kernel, one named step per member: the schedule (unit_at), the producer warpgroup's loop
// (produce), and the consumer warps' K loop (consume) with its epilogue (store_unit: a whole
// tile; add_up_split_tile: split-K and stream-K parts through the workspace; add_up_in_cluster:
// a cluster's K slices through distributed shared memory).
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES, int GROUP_M,
          int SPLIT_K, int VEC, int FMA_ORDER, int SCHEDULE, int SK_SPLIT, int SK_IDLE_PCT>
struct FfmaWs {
  static constexpr bool PERSISTENT = SCHEDULE == 2;             // else one block per tile and K slice
  static constexpr bool CLUSTER = SCHEDULE == 3;                // a tile's K slices are one cluster
  static constexpr int CONSUMERS = 32 * (BM / WM) * (BN / WN);  // compute threads: warps 0 ..
  static constexpr int PRODUCERS = 128;                          // the last warpgroup copies
  static constexpr int THREADS = CONSUMERS + PRODUCERS;
  // Registers: the launch gives every thread ENTRY_REGS; the producers hand theirs down to
  // PRODUCER_REGS and the consumers take what that frees (setmaxnreg counts in multiples of 8).
  static constexpr int ENTRY_REGS = (65536 / THREADS / 8) * 8 > 255 ? 255 : (65536 / THREADS / 8) * 8;
  static constexpr int PRODUCER_REGS = 48;
  static constexpr int CONSUMER_REGS_FREE =
      ((ENTRY_REGS + (ENTRY_REGS - PRODUCER_REGS) * PRODUCERS / CONSUMERS) / 8) * 8;
  static constexpr int CONSUMER_REGS = CONSUMER_REGS_FREE > 248 ? 248 : CONSUMER_REGS_FREE;
  static constexpr int LANE_ROWS = WM / TM;            // lanes down a warp tile
  static constexpr int LANE_COLS = WN / TN;            // lanes across it
  static constexpr int AS_STRIDE = BM + 4;             // A transposed: As[k][m], one float4 of padding
  static constexpr int AS_SIZE = BK * AS_STRIDE;
  static constexpr int BS_SIZE = BK * BN;              // B as stored: Bs[k][n]
  static constexpr unsigned STAGE_BYTES = 4 * (AS_SIZE + BS_SIZE);
  static_assert(LANE_ROWS * LANE_COLS == 32, "a warp's lanes tile its warp tile");
  static_assert((BM * BN / 4) % CONSUMERS == 0, "the fixup loop gives every consumer thread as many float4s");

  // ---- The schedule ---------------------------------------------------------------------------
  static __device__ __forceinline__ StreamK stream_k(const WsProblem& p) {
    const int P = gridDim.x;
    StreamK sk;
    sk.iters = p.iters;
    // Whole tiles only when the last wave would leave at most SK_IDLE_PCT % of the SMs idle:
    // splitting costs a partial write and read per piece (2048: 128 tiles on 132 SMs, 91% of
    // cuBLAS split, 97% whole).
    const int rest = p.tiles % P;
    sk.dp_tiles = 100 * (P - rest) <= SK_IDLE_PCT * P ? p.tiles : p.tiles - rest;
    sk.sk_iters = static_cast<long long>(p.tiles - sk.dp_tiles) * p.iters;
    // every participant's run holds at least one k tile
    sk.participants = static_cast<int>(
        min(static_cast<long long>(min(P, (p.tiles - sk.dp_tiles) * SK_SPLIT)), sk.sk_iters));
    return sk;
  }
  // This block's work unit number u (false past its last). Both roles walk the same list: the
  // producers fill the ring in this order, the consumers read it in this order. Each role calls
  // it after its setmaxnreg: values computed before the hand-over would be live across it, under
  // the entry's register cap.
  static __device__ __forceinline__ bool unit_at(const WsProblem& p, int u, WorkUnit& unit) {
    const int iters = p.iters;
    if constexpr (!PERSISTENT) {  // one unit: tile blockIdx % tiles, K slice blockIdx / tiles
      // (cluster: a tile's slices are consecutive blocks, tile blockIdx / SPLIT_K)
      const int slice = CLUSTER ? blockIdx.x % SPLIT_K : blockIdx.x / p.tiles;
      const int per_slice = CEIL_DIV(iters, SPLIT_K);
      const int k_begin = min(iters, slice * per_slice);
      unit = WorkUnit{static_cast<int>(CLUSTER ? blockIdx.x / SPLIT_K : blockIdx.x % p.tiles), k_begin,
                      min(iters, k_begin + per_slice), SPLIT_K, slice, 0};
      return u == 0;
    } else {
      const int P = gridDim.x, b = blockIdx.x;
      const StreamK sk = stream_k(p);
      const int dp_units = sk.whole_tiles(b, P);
      if (u < dp_units) {  // whole tiles b, b + P, ... first
        unit = WorkUnit{b + u * P, 0, iters, 1, 0, 0};
        return true;
      }
      if (b >= sk.participants) return false;
      // then the stream-K run's pieces, one per tile it touches
      const long long run_begin = sk.start(b), run_end = sk.start(b + 1);
      const int j = static_cast<int>(run_begin / iters) + (u - dp_units);
      const long long tile_begin = static_cast<long long>(j) * iters;
      const long long x = max(run_begin, tile_begin);
      if (x >= run_end) return false;
      const int first = sk.owner(tile_begin);
      const int last = sk.owner(tile_begin + iters - 1);
      unit = WorkUnit{sk.dp_tiles + j, static_cast<int>(x - tile_begin),
                      static_cast<int>(min(static_cast<long long>(iters), run_end - tile_begin)),
                      last - first + 1, b - first, first};
      return true;
    }
  }
  // All k tiles this block computes, over all its units.
  static __device__ __forceinline__ int block_k_tiles(const WsProblem& p) {
    if constexpr (!PERSISTENT) {
      WorkUnit unit;
      unit_at(p, 0, unit);
      return unit.k_end - unit.k_begin;
    } else {
      const int P = gridDim.x, b = blockIdx.x;
      const StreamK sk = stream_k(p);
      return sk.whole_tiles(b, P) * p.iters +
             (b < sk.participants ? static_cast<int>(sk.start(b + 1) - sk.start(b)) : 0);
    }
  }

  // ---- Producer warpgroup: keeps the ring full, unit after unit --------------------------------
  static __device__ __forceinline__ void produce(const WsProblem& p, unsigned smem_base, u64* full,
                                                 u64* empty) {
    if constexpr (CONSUMER_REGS > ENTRY_REGS) setmaxnreg_dec<PRODUCER_REGS>();
    // Who copies what, as in 21 with 128 threads (copy_ffma_stage, ffma_stage.cuh): BK threads per
    // row of A (consecutive k), PRODUCERS / BK threads per k row of B.
    const int t = threadIdx.x - CONSUMERS;
    const int a_m = t / BK, a_k = t % BK;
    const int b_k = t / (PRODUCERS / BK), b_n = (t % (PRODUCERS / BK)) * VEC;
    const unsigned a_dst = smem_base + 4 * (a_k * AS_STRIDE + a_m);
    const unsigned b_dst = smem_base + 4 * (AS_SIZE + b_k * BN + b_n);
    int stage = 0;
    unsigned phase = 0;
    WorkUnit unit;
    for (int u = 0; unit_at(p, u, unit); ++u) {
      int tile_m, tile_n;
      grouped_tile<GROUP_M>(unit.tile, p.tiles_m, p.tiles_n, tile_m, tile_n);
      const int block_row = tile_m * BM, block_col = tile_n * BN;
      const bool interior = block_row + BM <= p.M && block_col + BN <= p.N;
      // Element indices (32-bit: the runner requires each matrix to have < 2^31 elements).
      const unsigned a_base = (block_row + a_m) * p.K + unit.k_begin * BK + a_k;
      const unsigned b_base = (unit.k_begin * BK + b_k) * p.N + block_col + b_n;
      for (int kt = 0; kt < unit.k_end - unit.k_begin; ++kt) {
        // the consumers are done with the stage's last tile
        mbar_wait_asleep(&empty[stage], phase ^ 1);
        copy_ffma_stage<BM, BN, BK, VEC, PRODUCERS>(
            p.A, p.B, p.M, p.N, p.K, a_dst, b_dst, stage * STAGE_BYTES, a_base, b_base, kt,
            p.K - (unit.k_begin + kt) * BK, interior, block_row + a_m, a_k, block_col + b_n, b_k);
        cp_async_mbar_arrive(&full[stage]);  // arrives when this thread's copies have landed
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // nothing in flight when the warp exits
  }

  // ---- Consumer epilogues ---------------------------------------------------------------------
  // visit(row, col, v) for each float4 v of the lane's accumulators at (row, col) of the block tile.
  template <typename Visit>
  static __device__ __forceinline__ void for_each_fragment(float (&acc)[TM][TN], const ConsumerLane& l,
                                                           Visit&& visit) {
    for_each_ffma_fragment<LANE_ROWS, LANE_COLS>(acc, l.warp_m + l.lane_row * 4, l.warp_n + l.lane_col * 4, visit);
  }
  // C = scale * v + beta * C for the float4 v at (row, col) of C, inside the matrix only.
  static __device__ __forceinline__ void store(const WsProblem& p, int row, int col, const float* v,
                                               float scale) {
    if (row >= p.M) return;
    if (VEC == 4) {
      if (col < p.N) store_axpby4(&p.C[row * p.N + col], v, scale, p.beta);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col + e < p.N) store_axpby(&p.C[row * p.N + col + e], v[e], scale, p.beta);
    }
  }
  // Cluster (SCHEDULE 3): the SPLIT_K slices of a tile are the blocks of one cluster and add
  // up their partials through distributed shared memory, not global memory: slice r owns the
  // r-th share of every thread's float4s of accumulators (the same thread in each slice holds
  // the same elements). Each slice stores alpha * each share into its owner's inbox (its own
  // share into its own), arrives on every owner's `received` barrier, waits for its own, and
  // adds its share up in K order.
  static __device__ __forceinline__ void add_up_in_cluster(const WsProblem& p, float (&acc)[TM][TN],
                                                           const ConsumerLane& l, int rank,
                                                           int block_row, int block_col,
                                                           float* smem, u64* received) {
    constexpr int FRAGS = TM * TN / 4;                   // float4s of accumulators per thread
    constexpr int SHARE = FRAGS / SPLIT_K;
    // a block's inbox: [sender][SHARE][CONSUMERS] float4s, after the ring
    float4* inbox = reinterpret_cast<float4*>(smem + STAGES * (AS_SIZE + BS_SIZE)) + threadIdx.x;
    // this thread's slot in each owner's inbox, in the cluster's shared-memory window
    unsigned outbox[SPLIT_K];
#pragma unroll
    for (int q = 0; q < SPLIT_K; ++q)
      outbox[q] = cluster_map(smem_addr(inbox + rank * SHARE * CONSUMERS), q);
    // The accumulators are read once, in fragment order, with offsets known at compile time.
    // Anything more here cost the K loop in-place FFMAs: with the owner reading its share from
    // its registers and a copy of this code per rank, ptxas kept 76-90% of them in place.
    int f = 0;
    for_each_fragment(acc, l, [&](int, int, float* v) {
      st_cluster_f32x4(outbox[f / SHARE] + 16 * (f % SHARE) * CONSUMERS, p.alpha * v[0],
                       p.alpha * v[1], p.alpha * v[2], p.alpha * v[3]);
      ++f;
    });
#pragma unroll
    for (int q = 0; q < SPLIT_K; ++q) mbar_arrive_remote(cluster_map(smem_addr(received), q));
    mbar_wait<true>(received, 0);
    // This block's share: the thread's float4 number rank * SHARE + j, at the row and column
    // for_each_ffma_fragment gives float4 number (g * 4 + e) * (TN / 4) + h.
#pragma unroll
    for (int j = 0; j < SHARE; ++j) {
      const int frag = rank * SHARE + j;
      const int g = frag / (TN / 4) / 4, e = frag / (TN / 4) % 4, h = frag % (TN / 4);
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int q = 0; q < SPLIT_K; ++q) {  // the slices in K order
        const float4 v = inbox[(q * SHARE + j) * CONSUMERS];
        sum[0] += v.x; sum[1] += v.y; sum[2] += v.z; sum[3] += v.w;
      }
      store(p, block_row + l.warp_m + l.lane_row * 4 + g * LANE_ROWS * 4 + e,
            block_col + l.warp_n + l.lane_col * 4 + h * LANE_COLS * 4, sum, 1.0f);
    }
  }
  // Split-K slices (SCHEDULE 1) and stream-K pieces (SCHEDULE 2) of a tile: each part leaves
  // alpha * its partial in the workspace; the last to finish adds them up in K order (so the
  // result does not depend on arrival order) in a plain loop over the tile, not into the
  // accumulators.
  static __device__ __forceinline__ void add_up_split_tile(const WsProblem& p, float (&acc)[TM][TN],
                                                           const ConsumerLane& l, const WorkUnit& unit,
                                                           int block_row, int block_col, int* tickets) {
    float* workspace = p.workspace;
    auto slot = [&](int i) {
      if (!PERSISTENT) return workspace + ((size_t)i * p.tiles + unit.tile) * BM * BN;
      // Stream-K: part i is block first_block + i. A block's partial pieces are at most two:
      // where its run starts inside a tile (it is not part 0 there: slot 0) and where it ends
      // inside one (it is part 0 there: slot 1).
      return workspace + ((size_t)2 * (unit.first_block + i) + (i == 0)) * BM * BN;
    };
    auto for_each_scaled = [&](auto&& visit) {
      for_each_fragment(acc, l, [&](int tile_row, int tile_col, float* v) {
        float scaled[4] = {p.alpha * v[0], p.alpha * v[1], p.alpha * v[2], p.alpha * v[3]};
        visit(tile_row, tile_col, scaled);
      });
    };
    if (!publish_partial<BN, CONSUMERS>(slot(unit.part), unit.parts, &tickets[unit.tile],
                                        for_each_scaled))
      return;
    // BATCH float4s per thread in flight per part: one at a time, the loop waited out an L2
    // round trip per load (a 4-part 128 x 256 tile took 14 us to add up).
    constexpr int PER_THREAD = BM * BN / 4 / CONSUMERS;
    constexpr int BATCH = PER_THREAD % 8 == 0 ? 8 : PER_THREAD % 4 == 0 ? 4 : 1;
#pragma unroll 1
    for (int it = 0; it < PER_THREAD; it += BATCH) {
      float4 sum[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; ++b) sum[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int part = 0; part < unit.parts; ++part) {
        const float4* partial = reinterpret_cast<const float4*>(slot(part));
        float4 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) v[b] = __ldcg(&partial[(it + b) * CONSUMERS + threadIdx.x]);
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
          sum[b].x += v[b].x; sum[b].y += v[b].y; sum[b].z += v[b].z; sum[b].w += v[b].w;
        }
      }
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int i = (it + b) * CONSUMERS + threadIdx.x;  // the float4 at 4 * i of the tile
        const float v[4] = {sum[b].x, sum[b].y, sum[b].z, sum[b].w};
        store(p, block_row + i / (BN / 4), block_col + (i % (BN / 4)) * 4, v, 1.0f);
      }
    }
  }
  // The epilogue of a unit, C = alpha * acc + beta * C over the tile. Neither way of adding up
  // parts touches the accumulators in a way that constrains their registers: summing into them,
  // or storing them unscaled (16-byte stores want four consecutive registers), cost the K loop
  // its in-place FFMAs (58% of them in place instead of 78%).
  static __device__ __forceinline__ void store_unit(const WsProblem& p, float (&acc)[TM][TN],
                                                    const ConsumerLane& l, const WorkUnit& unit,
                                                    int* tickets, float* smem, u64* received) {
    int tile_m, tile_n;
    grouped_tile<GROUP_M>(unit.tile, p.tiles_m, p.tiles_n, tile_m, tile_n);
    const int block_row = tile_m * BM, block_col = tile_n * BN;
    if (unit.parts == 1) {
      for_each_fragment(acc, l, [&](int tile_row, int tile_col, float* v) {
        store(p, block_row + tile_row, block_col + tile_col, v, p.alpha);
      });
      return;
    }
    if constexpr (CLUSTER) add_up_in_cluster(p, acc, l, unit.part, block_row, block_col, smem, received);
    else add_up_split_tile(p, acc, l, unit, block_row, block_col, tickets);
  }

  // ---- Consumer warps: wait for a stage, multiply it, hand it back -----------------------------
  // One K loop over all of the block's k tiles, unit after unit, the way the ring delivers
  // them; a unit's epilogue runs between its last k tile and the next unit's first. At the last
  // k of a k tile the warp waits for the next one, hands this one's stage back (its last
  // fragments were loaded a whole outer product ago) and loads the next one's first fragments
  // before this one's last outer product: no shared-load latency at a tile change, nor at a
  // unit change.
  static __device__ __forceinline__ void consume(const WsProblem& p, unsigned smem_base, float* smem,
                                                 u64* full, u64* empty, u64* received) {
    if constexpr (CONSUMER_REGS > ENTRY_REGS) setmaxnreg_inc<CONSUMER_REGS>();
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const ConsumerLane l{(warp / (BN / WN)) * WM, (warp % (BN / WN)) * WN, lane / LANE_COLS,
                         lane % LANE_COLS};

    float acc[TM][TN];
    float frag_a[2][TM], frag_b[2][TN];
    // The lane's fragments of k step KK from the stage at shared address `stage_addr`: TM / 4
    // float4s of A (rows lane_row * 4 + g * LANE_ROWS * 4) and TN / 4 of B.
    // Byte offsets of the lane's fragments in a stage, made opaque so that ptxas keeps them in two
    // registers instead of recomputing them from the thread index at every k tile.
    unsigned a_frag = 4 * (l.warp_m + l.lane_row * 4);
    unsigned b_frag = 4 * (AS_SIZE + l.warp_n + l.lane_col * 4);
    asm volatile("mov.u32 %0, %0;\n" : "+r"(a_frag));
    asm volatile("mov.u32 %0, %0;\n" : "+r"(b_frag));
    auto load_fragments = [&](auto kk_const, int buf, unsigned stage_addr) {
      constexpr int KK = decltype(kk_const)::value;
      load_ffma_fragments<TM, TN, LANE_ROWS, LANE_COLS, 4 * KK * AS_STRIDE, 4 * KK * BN>(
          frag_a[buf], frag_b[buf], stage_addr + a_frag, stage_addr + b_frag);
    };
    // The outer product of one k, in 21's orders (ffma_thread_tile.cuh): 1 rows, 3 serpentine rows.
    auto outer_product = [&](int buf) { ffma_outer_product<FMA_ORDER>(acc, frag_a[buf], frag_b[buf]); };
    // Partial tiles: split-K slices at [SPLIT_K][tiles][BM * BN], stream-K pieces at [block][2]
    // [BM * BN] (a block's run starts in one tile and ends in another: at most 2 partial pieces),
    // then one ticket per tile.
    int* tickets = reinterpret_cast<int*>(
        p.workspace + (size_t)(PERSISTENT ? 2 * gridDim.x : SPLIT_K * p.tiles) * BM * BN);
    auto zero_accumulators = [&] {
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;
    };

    int stage = 0;
    unsigned phase = 0;
    const int total = block_k_tiles(p);
    WorkUnit unit;
    int u = 0;
    bool more = unit_at(p, 0, unit);
    int left = unit.k_end - unit.k_begin;  // k tiles left in this unit
    zero_accumulators();
    if (total > 0) {
      mbar_wait(&full[stage], phase);
      load_fragments(Int<0>{}, 0, smem_base + stage * STAGE_BYTES);
    }
    for (int g = 0; more;) {
      if (left == 0) {  // the unit's k tiles are done
        store_unit(p, acc, l, unit, tickets, smem, received);
        zero_accumulators();
        more = unit_at(p, ++u, unit);
        left = unit.k_end - unit.k_begin;
        continue;
      }
      const unsigned read = smem_base + stage * STAGE_BYTES;
      bool next_ready = false;
      static_for<0, BK>([&](auto kk_const) {
        constexpr int kk = decltype(kk_const)::value;
        if constexpr (kk == BK / 2) {  // ask early whether the next k tile has landed, so that the
          // barrier's answer is in by the last k (it nearly always has: the ring runs ahead)
          const int next = stage + 1 == STAGES ? 0 : stage + 1;
          next_ready = mbar_test(&full[next], stage + 1 == STAGES ? phase ^ 1 : phase);
        }
        if constexpr (kk + 1 < BK) {
          load_fragments(Int<kk + 1>{}, (kk + 1) & 1, read);
        } else {
          const int done = stage;
          if (++stage == STAGES) { stage = 0; phase ^= 1; }
          if (g + 1 < total) {
            if (!next_ready) mbar_wait(&full[stage], phase);
            mbar_arrive(&empty[done]);
            load_fragments(Int<0>{}, 0, smem_base + stage * STAGE_BYTES);
          } else {
            mbar_arrive(&empty[done]);
          }
        }
        outer_product(kk & 1);
      });
      ++g;
      --left;
    }
  }

  // ---- The block: barriers, then each warp to its role -----------------------------------------
  static __device__ __forceinline__ void run(int M, int N, int K, float alpha, const float* A,
                                             const float* B, float beta, float* C, float* workspace) {
    extern __shared__ __align__(16) float smem[];   // the ring's STAGES stages
    __shared__ u64 full[STAGES], empty[STAGES];        // a full and an empty barrier per stage
    __shared__ u64 received;  // cluster: every slice's piece of this block's share has landed

    const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
    const WsProblem p{M, N, K, alpha, A, B, beta, C, workspace,
                      tiles_m, tiles_n, tiles_m * tiles_n, CEIL_DIV(K, BK)};

    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) {
        mbar_init(&full[s], PRODUCERS);   // each producer thread's copies of the stage have landed
        mbar_init(&empty[s], CONSUMERS);  // each consumer thread has read the stage
      }
      if constexpr (CLUSTER) mbar_init(&received, SPLIT_K * CONSUMERS);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // (cluster: the others' barriers are initialized, and they have started, before any block
    // stores into their shared memory)
    if constexpr (CLUSTER) cluster_sync();
    else __syncthreads();
    const unsigned smem_base = smem_addr(smem);

    if (threadIdx.x >= CONSUMERS) produce(p, smem_base, full, empty);
    else consume(p, smem_base, smem, full, empty, &received);
  }
};

// One block per tile and K slice, or persistent blocks (SCHEDULE 1, 2).
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES, int GROUP_M,
          int SPLIT_K, int VEC, int FMA_ORDER, int SCHEDULE, int SK_SPLIT, int SK_IDLE_PCT>
__global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN) + 128, 1)
sgemm_ffma_ws(int M, int N, int K, float alpha, const float* __restrict__ A,
              const float* __restrict__ B, float beta, float* __restrict__ C,
              float* __restrict__ workspace) {
  FfmaWs<BM, BN, BK, WM, WN, TM, TN, STAGES, GROUP_M, SPLIT_K, VEC, FMA_ORDER, SCHEDULE, SK_SPLIT,
         SK_IDLE_PCT>::run(M, N, K, alpha, A, B, beta, C, workspace);
}

// A tile's SPLIT_K slices as one thread-block cluster (SCHEDULE 3).
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES, int GROUP_M,
          int SPLIT_K, int VEC, int FMA_ORDER, int SCHEDULE, int SK_SPLIT, int SK_IDLE_PCT>
__global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN) + 128, 1) __cluster_dims__(SPLIT_K, 1, 1)
sgemm_ffma_ws_cluster(int M, int N, int K, float alpha, const float* __restrict__ A,
                      const float* __restrict__ B, float beta, float* __restrict__ C,
                      float* __restrict__ workspace) {
  FfmaWs<BM, BN, BK, WM, WN, TM, TN, STAGES, GROUP_M, SPLIT_K, VEC, FMA_ORDER, SCHEDULE, SK_SPLIT,
         SK_IDLE_PCT>::run(M, N, K, alpha, A, B, beta, C, workspace);
}
