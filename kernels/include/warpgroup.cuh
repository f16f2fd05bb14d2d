// warpgroup.cuh: setmaxnreg (sm_90a), which moves registers between warpgroups of a
// warp-specialized block: the producers hand theirs down, the consumers take what that frees
// (20, 22). The count is per thread, a multiple of 8, and the same for the whole warpgroup.
#ifndef SGEMM_LAB_WARPGROUP_CUH
#define SGEMM_LAB_WARPGROUP_CUH

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

#endif  // SGEMM_LAB_WARPGROUP_CUH
