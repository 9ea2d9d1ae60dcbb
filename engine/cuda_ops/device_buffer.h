#pragma once
// Owning device and page-locked host allocations of the CUDA model, and its CUDA error check.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail_runtime("CUDA " + what + " failed: " + cudaGetErrorString(e));
}

// Owning device allocation that grows on demand (reserve), never shrinks.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) {
    o.ptr = nullptr;
    o.bytes = 0;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
    allocated() -= bytes;
  }
  void reserve(size_t n, const char* what) {
    if (n <= bytes) return;
    if (ptr) cudaFree(ptr);
    allocated() -= bytes;
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMalloc(&ptr, n), std::string("allocation of ") + std::to_string(n) + " bytes for " + what);
    bytes = n;
    allocated() += n;
    ++generation();
  }
  // Bumped by every allocation: a captured CUDA graph holds raw pointers and is stale once this moves.
  static uint64_t& generation() {
    static uint64_t g = 0;
    return g;
  }
  // Bytes held by all DeviceBuffers of the process (reported as the engine's device memory).
  static size_t& allocated() {
    static size_t total = 0;
    return total;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  char* bytes_ptr() const { return static_cast<char*>(ptr); }
};

// Page-locked host memory for what comes back each step (ids, top-k candidates): no staging copy, no pageable fault.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr) cudaFreeHost(ptr);
  }
  void reserve(size_t n) {
    if (n <= bytes) return;
    if (ptr) cudaFreeHost(ptr);
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMallocHost(&ptr, n), "pinned allocation of " + std::to_string(n) + " bytes");
    bytes = n;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

}  // namespace flashlite::engine::cuda_ops
