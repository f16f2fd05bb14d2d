// cluster.cuh: thread-block clusters (sm_90), as 22 and 25 use them to add a tile's K slices up
// in distributed shared memory: a cluster-wide barrier, another block's address of a
// shared-memory location, a store or a load there, and an arrival on another block's mbarrier.
#ifndef SGEMM_LAB_CLUSTER_CUH
#define SGEMM_LAB_CLUSTER_CUH

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
__device__ __forceinline__ float4 ld_cluster_f32x4(unsigned remote) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}
// One arrival on another block's barrier, after (release) this thread's stores to its memory.
__device__ __forceinline__ void mbar_arrive_remote(unsigned remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// The producer warpgroup of a block whose K slice is summed across the cluster: done loading,
// it still meets the sum's two cluster barriers (.aligned: every thread of every block, the warp
// converged first), one before the partials are read and one before the block exits.
template <int SLICES>
__device__ __forceinline__ void producers_meet_slice_barriers() {
  if constexpr (SLICES > 1) {
    __syncwarp();
    cluster_sync();
    cluster_sync();
  }
}

#endif  // SGEMM_LAB_CLUSTER_CUH
