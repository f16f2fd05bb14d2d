// tma.cuh: the tensor memory accelerator (sm_90) as 20 and 23 use it: the tensor map a kernel
// receives by value (encoded on the host by src/job/tensor_maps.py), a 2-D box copy from global
// into shared memory whose completion is counted in bytes on an mbarrier, and the full / empty
// mbarrier pair per stage of a producer -> consumer ring of such copies. In its own header
// because both wgmma chapters feed their rings this way, and nothing else does.
#ifndef SGEMM_LAB_TMA_CUH
#define SGEMM_LAB_TMA_CUH
#include "mbarrier.cuh"

// A CUtensorMap (driver API), encoded on the host and passed by value (__grid_constant__).
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// A 2-D box of the tensor map at (x = inner coordinate, y = outer) into shared memory; the
// bytes land on `bar` (the producer announces them with mbar_arrive_expect_tx). Elements outside
// the matrix arrive as zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, u64* bar, int x,
                                            int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(x), "r"(y)
      : "memory");
}

// The ring's barriers, by thread 0 before the block's first __syncthreads: full[s] completes
// when the producer has arrived and the TMA's bytes have landed, empty[s] when each of the
// CONSUMERS warpgroups' 4 warps has released the stage.
template <int STAGES, int CONSUMERS>
__device__ __forceinline__ void init_stage_ring(u64* full, u64* empty) {
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    mbar_init(&full[s], 1);                   // the producer's arrive, plus the TMA's bytes
    mbar_init(&empty[s], CONSUMERS * 4);      // one arrive per consumer warp
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

#endif  // SGEMM_LAB_TMA_CUH
