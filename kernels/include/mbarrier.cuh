// mbarrier.cuh: shared-memory barriers (mbarrier, sm_90) that hand pipeline stages between
// producer and consumer warps without __syncthreads (20, 22): init, arrive (also when a
// thread's cp.async copies land, or with a TMA byte count), wait (polling, or asleep), test.
#ifndef SGEMM_LAB_MBARRIER_CUH
#define SGEMM_LAB_MBARRIER_CUH

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

#endif  // SGEMM_LAB_MBARRIER_CUH
