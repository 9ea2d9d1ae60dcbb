#pragma once
// Programmatic dependent launch, device side (sm_90+; no-ops before), for CUDA kernels built on flashlite (the
// library's decode kernels, the engine's decode-step kernels): pdl_launch_dependents lets the grid launched after
// this one (as a programmatic dependent) start while this one runs; pdl_wait, in a grid launched as a programmatic
// dependent, waits for its predecessor's completion and memory flush. A kernel waits before it reads anything an
// earlier kernel wrote. Whether a kernel may be launched that way: flashlite/cuda/kernel_arch.h.
namespace flashlite::cuda {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace flashlite::cuda
