#pragma once
// Programmatic dependent launch, device side (sm_90+; no-ops before), shared by the decode kernels and the engine's
// decode-step kernels: pdl_launch_dependents lets the grid launched after this one (as a programmatic dependent)
// start while this one runs; pdl_wait, in a grid launched as a programmatic dependent, waits for its predecessor's
// completion and memory flush. A kernel waits before it reads anything an earlier kernel wrote.
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

// Kernel parameters are read through the constant cache, and their lines are cold at every launch (each launch, and
// each node of a graph, has its own parameter buffer): a kernel whose phases first touch a field after the wait pays
// an L2 round trip there, in its critical path. Touching one word per 64 bytes of `p` before pdl_wait takes those
// misses while the predecessor still runs. `p` must be a __grid_constant__ parameter (its address is taken).
template <class P>
__device__ __forceinline__ void touch_params(const P& p) {
  const unsigned* w = reinterpret_cast<const unsigned*>(&p);
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < int(sizeof(P) / 4); i += 16) acc ^= w[i];
  asm volatile("" ::"r"(acc));
}

}  // namespace flashlite::cuda
