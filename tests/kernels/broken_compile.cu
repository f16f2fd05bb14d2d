// Test-only (tests/test_faults.py): a kernel that does not compile, to check that the error
// shows NVRTC's log with this file's name and line.
#include "../../kernels/include/common.cuh"

__global__ void broken_compile(int M, int N, int K, float alpha, const float* A,
                               const float* B, float beta, float* C) {
  C[0] = alpha * undeclared_value;  // line 7: the deliberate error
}
