#pragma once
// Programmatic dependent launch for the engine's decode-step kernels (sm_90; no-ops before): a kernel launched as a
// programmatic dependent starts while its predecessor drains, does what needs none of the predecessor's output (lets
// its own dependent launch, prefetches weights into L2), then waits in griddepcontrol.wait for the predecessor's
// completion and memory. Every kernel launched this way waits before it reads anything an earlier kernel wrote.
#include <cuda_runtime.h>

#include "engine/cuda_ops/env_switch.h"
#include "src/cuda/common/kernel_arch.h"
#include "src/cuda/common/pdl.cuh"

namespace flashlite::engine::cuda_ops {

using ::flashlite::cuda::pdl_launch_dependents;  // device side: src/cuda/common/pdl.cuh
using ::flashlite::cuda::pdl_wait;

// Whether to launch as programmatic dependents: compute capability >= 9 and FLASHLITE_ENGINE_PDL not off (a flag,
// env_switch.h; default on; read once per process, a value that is no flag throws here and on the next call again).
inline bool pdl_enabled() {
  static const bool on = [] {
    if (!env_switch::flag("FLASHLITE_ENGINE_PDL", true)) return false;
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major >= 9;
  }();
  return on;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when pdl_enabled() and the
// kernel's loaded code has its griddepcontrol.wait (compiled for sm_90+: src/cuda/common/kernel_arch.h).
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() && ::flashlite::cuda::kernel_has_sm90_code(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace flashlite::engine::cuda_ops
