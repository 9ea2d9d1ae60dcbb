#pragma once
// Device helpers shared by the KV-cache GPU suites (decode_gpu_test.cpp, prefill_gpu_test.cpp): the GPU check that
// lets every test skip cleanly without one, a CUDA error check, and an owning device buffer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace kvtest {

inline bool has_gpu() {
  static const bool yes = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
  }();
  return yes;
}
#define SKIP_WITHOUT_GPU() \
  if (!::kvtest::has_gpu()) GTEST_SKIP() << "no CUDA device"

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device copy of a host buffer (bytes; none copied when host is null), freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(const void* host, size_t bytes) : n(bytes) {
    ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    if (bytes && host) ck(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "H2D");
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
  void up(const void* host) { ck(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "H2D"); }
  void down(void* host) const { ck(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost), "D2H"); }
};

}  // namespace kvtest
