#pragma once
// Host-side CUDA error checking shared by every CUDA backend: a failed runtime call becomes a flashlite::Error
// (kind runtime, i.e. Python's RuntimeError) carrying the call, the place and CUDA's own error string.
#include <cuda_runtime.h>

#include <string>

#include "flashlite/errors.h"

namespace flashlite::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(ErrorKind::runtime, std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                                      cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
}

// Checks the error state right after a kernel launch (launch-configuration errors; asynchronous faults surface at
// the next synchronising call of the caller).
inline void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda_error(e, (std::string("launching ") + kernel).c_str(), file, line);
}

// Makes the tensors' device current for the scope and restores the caller's afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaError_t e = cudaGetDevice(&prev_);
    if (e != cudaSuccess) throw_cuda_error(e, "cudaGetDevice", __FILE__, __LINE__);
    if (prev_ == device) {
      prev_ = -1;
    } else if ((e = cudaSetDevice(device)) != cudaSuccess) {
      throw_cuda_error(e, "cudaSetDevice", __FILE__, __LINE__);
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace flashlite::cuda

// FL_CUDA_CHECK(cudaMemcpyAsync(...)): throws flashlite::Error with the expression and CUDA's message on failure.
#define FL_CUDA_CHECK(expr)                                                                  \
  do {                                                                                       \
    const cudaError_t fl_cuda_err_ = (expr);                                                 \
    if (fl_cuda_err_ != cudaSuccess)                                                         \
      ::flashlite::cuda::throw_cuda_error(fl_cuda_err_, #expr, __FILE__, __LINE__);          \
  } while (0)

// FL_CUDA_CHECK_LAUNCH("kernel_name") right after a <<<>>> launch.
#define FL_CUDA_CHECK_LAUNCH(name) ::flashlite::cuda::check_launch(name, __FILE__, __LINE__)
