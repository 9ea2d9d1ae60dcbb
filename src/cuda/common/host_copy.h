#pragma once
// Per-call host arrays (varlen offsets past the inline table) on their way to the device: a stream-ordered
// allocation that is freed stream-ordered when the call ends, also when a launch throws, and a refusal under CUDA
// graph capture (the copy reads pageable host memory that is gone after the call, so a replay could not repeat it).
#include <cuda_runtime.h>

#include <string>

#include "flashlite/errors.h"

namespace flashlite::cuda {

// Throws a clear error when `stream` is being captured into a CUDA graph; `what` names the call's host array.
inline void refuse_host_copy_under_capture(cudaStream_t stream, const std::string& what) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (st != cudaStreamCaptureStatusNone) {
    throw Error(ErrorKind::invalid_value,
                what + " are copied from host memory on every call, which a CUDA graph cannot capture; call it "
                       "outside the capture, or with at most 128 sequences (offsets passed in the kernel arguments)");
  }
}

// A device buffer for one call, freed stream-ordered by the destructor unless free_now() already did.
struct CallBuffer {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  explicit CallBuffer(cudaStream_t s) : stream(s) {}
  CallBuffer(const CallBuffer&) = delete;
  CallBuffer& operator=(const CallBuffer&) = delete;
  // Frees now and reports the result (the success path checks it).
  cudaError_t free_now() {
    const cudaError_t e = ptr ? cudaFreeAsync(ptr, stream) : cudaSuccess;
    ptr = nullptr;
    return e;
  }
  ~CallBuffer() {
    if (ptr) (void)cudaFreeAsync(ptr, stream);
  }
};

}  // namespace flashlite::cuda
