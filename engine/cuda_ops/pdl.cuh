#pragma once
// Programmatic dependent launch for the engine's decode-step kernels (sm_90; plain launches before): a kernel launched
// as a programmatic dependent starts while its predecessor drains, does what needs none of the predecessor's output
// (lets its own dependent launch, loads weights), then waits in griddepcontrol.wait for the predecessor's completion
// and memory. Every kernel launched this way waits before it reads anything an earlier kernel wrote.
#include <cuda_runtime.h>

#include <utility>

#include "flashlite/cuda/kernel_arch.h"
#include "flashlite/cuda/pdl.cuh"
#include "flashlite/version.h"  // cuda_device_info

namespace flashlite::engine::cuda_ops {

using ::flashlite::cuda::pdl_launch_dependents;  // device side: flashlite/cuda/pdl.cuh
using ::flashlite::cuda::pdl_wait;
using ::flashlite::cuda_device_count;
using ::flashlite::cuda_device_info;

// Whether the current device runs programmatic dependent launches (compute capability >= 9; read once per process).
inline bool device_has_pdl() {
  static const bool on = [] {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= cuda_device_count()) return false;
    return cuda_device_info(dev).cc >= 90;
  }();
  return on;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when `pdl` asks for it, the
// device has it and the kernel's loaded code has its griddepcontrol.wait (compiled for sm_90+: kernel_arch.h).
template <typename... Params, typename... Args>
cudaError_t launch_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs =
      pdl && device_has_pdl() && ::flashlite::cuda::kernel_has_sm90_code(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace flashlite::engine::cuda_ops
