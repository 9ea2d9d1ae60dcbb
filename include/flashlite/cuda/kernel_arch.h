#pragma once
// Host side: whether the code the driver loaded for a kernel was compiled for sm_90 or later (PTX target >= 9.0).
// The sm_90 device features (griddepcontrol for programmatic dependent launch, thread-block clusters) sit behind
// __CUDA_ARCH__ >= 900. A GPU of compute capability >= 9 can still run a kernel built without them: an "80;90a" build
// on a newer architecture than sm_90a (the driver JIT-compiles the compute_80 PTX), or a build for sm_80 only on an
// H100. Such a kernel must not be launched as a programmatic dependent (it would not wait for its predecessor) nor
// take a cluster path, so the launchers (the library's and the engine's) ask the kernel, not the device. Cached per
// kernel; thread-safe.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

namespace flashlite::cuda {

inline bool kernel_has_sm90_code(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(kernel); it != cache.end()) return it->second;
  cudaFuncAttributes fa{};
  bool ok = false;
  if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess) {
    ok = fa.ptxVersion >= 90;
  } else {
    (void)cudaGetLastError();  // no attributes: treated as without sm_90 code (the safe side), not a sticky error
  }
  cache.emplace(kernel, ok);
  return ok;
}

}  // namespace flashlite::cuda
