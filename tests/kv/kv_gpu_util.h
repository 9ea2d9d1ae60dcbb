#pragma once
// Device helpers shared by the KV-cache GPU suites (decode_gpu_test.cpp, prefill_gpu_test.cpp): tests/gpu's GPU check
// and CUDA error check under the suites' names, and an owning device buffer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "gpu_util.h"

namespace kvtest {

using fltest::has_gpu;
#define SKIP_WITHOUT_GPU() FL_SKIP_WITHOUT_GPU()
inline void ck(cudaError_t e, const char* what) { fltest::cuda_check(e, what); }

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
