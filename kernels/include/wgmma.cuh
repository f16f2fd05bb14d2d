// wgmma.cuh: Hopper's warpgroup MMA (sm_90a) in TF32 as 20 and 23 use it: FP32 -> TF32
// rounding, the fence / commit / wait around asynchronous wgmma groups, keeping register
// fragments live until their group completes (keep_fragments), the shared-memory
// descriptor of a K-major 128-byte-swizzled tile, the m64nNk8 instruction with its first operand
// (a slice of B^T) from registers, and the fragment layout by which a consumer lane loads that
// slice from a TMA box of B. In its own header because the wgmma chapters (20, 23, 25, 26) issue
// the same instructions on the same tiles (23 adds a scale-d predicate to restart the
// accumulator, 25 the m64n64k8 form for 64-row block tiles, 26 both).
#ifndef SGEMM_LAB_WGMMA_CUH
#define SGEMM_LAB_WGMMA_CUH
#include "mbarrier.cuh"

// FP32 -> TF32, rounded to nearest (ties away): the bit pattern of a float with 10 mantissa bits.
__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most PENDING of this warpgroup's committed wgmma groups are still running.
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}

// A wgmma reads its register fragments while it runs: they must keep their registers until
// its group has completed. The empty asm makes them live up to the call, so the compiler cannot
// hand those registers to the next tile's fragments earlier.
__device__ __forceinline__ void keep_fragments(unsigned (&frag)[4][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(frag[ks][i]));
}

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled tile: rows of 128 bytes (32
// floats of k), groups of 8 rows 1024 bytes apart (stride byte offset), tile 1024-byte aligned.
// Moving along k inside the swizzle row is a plain byte offset on the start address.
__device__ __forceinline__ u64 smem_desc_k_sw128(unsigned addr) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4)  // start address / 16
         | (1ull << 16)                                 // leading byte offset: unused (K-major SW128)
         | (static_cast<u64>(1024 >> 4) << 32)     // stride byte offset / 16
         | (1ull << 62);                                // layout: 128-byte swizzle
}

// D (64 x N, FP32, N / 2 registers per lane) += A (64 x 8 TF32, 4 registers per lane) * B (8 x N
// TF32 in shared memory, descriptor). Lane (warp w, g = lane / 4, t = lane % 4) supplies A rows
// 16w + g (a[0], a[2]) and 16w + g + 8 (a[1], a[3]) at k = t (a[0], a[1]) and t + 4 (a[2], a[3]),
// and holds D(16w + g, 8j + 2t + {0, 1}) in d[4j + {0, 1}], D(16w + g + 8, ...) in d[4j + {2, 3}].
// wgmma_rs(d, a, desc) always adds into D (20); wgmma_rs(d, a, desc, accumulate) adds into D
// only when `accumulate` is nonzero and otherwise starts D afresh (scale-d predicate, 23).
template <int N>
__device__ __forceinline__ void wgmma_rs(float* d, const unsigned* a, u64 desc_b);
template <int N>
__device__ __forceinline__ void wgmma_rs(float* d, const unsigned* a, u64 desc_b, int accumulate);

// The accumulator operands: "+f" constraints on d[0 .. 31], d[0 .. 63] or d[0 .. 127], and their
// placeholders in the instruction text.
#define WGMMA_ACC4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WGMMA_ACC16(d, i) WGMMA_ACC4(d, i), WGMMA_ACC4(d, i + 4), WGMMA_ACC4(d, i + 8), WGMMA_ACC4(d, i + 12)
#define WGMMA_ACC32(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16)
#define WGMMA_ACC64(d) WGMMA_ACC16(d, 0), WGMMA_ACC16(d, 16), WGMMA_ACC16(d, 32), WGMMA_ACC16(d, 48)
#define WGMMA_ACC128(d) \
  WGMMA_ACC64(d), WGMMA_ACC16(d, 64), WGMMA_ACC16(d, 80), WGMMA_ACC16(d, 96), WGMMA_ACC16(d, 112)
#define WGMMA_D32                                                   \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"          \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WGMMA_D64                                                   \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"          \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WGMMA_D128                                                                    \
  WGMMA_D64 ","                                                                       \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                  \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                  \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"      \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

template <>
__device__ __forceinline__ void wgmma_rs<64>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WGMMA_D32
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
      : WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<128>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WGMMA_D64
      "}, {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
      : WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<256>(float* d, const unsigned* a, u64 desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WGMMA_D128
      "}, {%128, %129, %130, %131}, %132, 1, 1, 1;\n"
      : WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<64>(float* d, const unsigned* a, u64 desc_b,
                                             int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WGMMA_D32
      "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<128>(float* d, const unsigned* a, u64 desc_b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WGMMA_D64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<256>(float* d, const unsigned* a, u64 desc_b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WGMMA_D128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)
      : "memory");
}

// A consumer lane's place in the fragment layout (consumer warpgroup c holds columns 64c ..
// 64c + 63 of the block tile): lane coordinates g = lane / 4, t = lane % 4, the 32-column box
// of the B tile it reads, the 16-byte chunk of its columns n(g), and the byte offsets of its two
// LDS.64 in a box for k rows t and t + 4 of each 8-k step (the swizzle moves chunk `chunk` of
// row k to chunk ^ (k % 8)). One definition for 20, 23, 25 and 26, which read B the same way.
struct ConsumerLane {
  int lane, g, t, box, chunk;
  unsigned frag_lo, frag_hi;
};
__device__ __forceinline__ ConsumerLane consumer_lane(int c) {
  ConsumerLane l;
  const int warp = (threadIdx.x / 32) % 4;
  l.lane = threadIdx.x % 32;
  l.g = l.lane / 4, l.t = l.lane % 4;
  l.box = 2 * c + warp / 2;
  l.chunk = 2 * (warp % 2) + (l.g >> 2) + 4 * ((l.g >> 1) & 1);
  l.frag_lo = l.t * 128 + ((l.chunk ^ l.t) << 4) + (l.g & 1) * 8;
  l.frag_hi = (l.t + 4) * 128 + ((l.chunk ^ (l.t + 4)) << 4) + (l.g & 1) * 8;
  return l;
}

#endif  // SGEMM_LAB_WGMMA_CUH
