#pragma once
// Owning device and page-locked host allocations of the CUDA model, and its CUDA error check.
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail_runtime("CUDA " + what + " failed: " + cudaGetErrorString(e));
}

// Owning device allocation that grows on demand (reserve), never shrinks. The counters are per device (tensor-
// parallel ranks allocate from their own threads at once).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  int device = 0;  // where ptr lives (the current device at reserve)
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes), device(o.device) {
    o.ptr = nullptr;
    o.bytes = 0;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
    allocated(device) -= bytes;
  }
  void reserve(size_t n, const char* what) {
    if (n <= bytes) return;
    if (ptr) cudaFree(ptr);
    allocated(device) -= bytes;
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaMalloc(&ptr, n), std::string("allocation of ") + std::to_string(n) + " bytes for " + what);
    bytes = n;
    allocated(device) += n;
    ++generation(device);
  }
  // Bumped by every allocation on `device`: a captured CUDA graph holds raw pointers and is stale once this moves.
  static std::atomic<uint64_t>& generation(int device) {
    static std::atomic<uint64_t> g[kDevices];
    return g[unsigned(device) % kDevices];
  }
  // Bytes held by the DeviceBuffers of the process on `device` (reported as the engine's device memory).
  static std::atomic<size_t>& allocated(int device) {
    static std::atomic<size_t> total[kDevices];
    return total[unsigned(device) % kDevices];
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  char* bytes_ptr() const { return static_cast<char*>(ptr); }

 private:
  static constexpr int kDevices = 64;
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
