// cp_async.cuh: wrappers for cp.async (sm_80+), the asynchronous global -> shared copies of the
// pipelined chapters (12, 17, 19, 21, 22): issue, commit a group, wait for groups.
#ifndef SGEMM_LAB_CP_ASYNC_CUH
#define SGEMM_LAB_CP_ASYNC_CUH

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

#endif  // SGEMM_LAB_CP_ASYNC_CUH
