#pragma once
// Shared by the Python bridges (module.cpp: arrays through DLPack; torch_ops.cpp: the torch ops): when a call's scratch
// memory may be left to the backend's own allocation.
#include <cstddef>

#include "flashlite/tensor.h"

#if FLASHLITE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlite::py {

// Whether a scratch of `bytes` for a call on `stream` can be left to the backend's own stream-ordered allocation: a
// few bytes (the Hopper kernel's tile counter) outside a CUDA graph capture. That costs no host time beside a torch
// allocation through Python (4 us a call on the H100 machine); under capture the caller's allocator serves, so that
// the graph holds no memory node.
inline bool backend_allocates(size_t bytes, Device dev, void* stream) {
#if FLASHLITE_WITH_CUDA
  constexpr size_t kSmallScratch = 4096;
  if (bytes > kSmallScratch || dev.type != DeviceType::cuda) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the launch's error check to report; the caller's allocation serves
    return false;
  }
  return status == cudaStreamCaptureStatusNone;
#else
  (void)bytes, (void)dev, (void)stream;
  return false;
#endif
}

}  // namespace flashlite::py
