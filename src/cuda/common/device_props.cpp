// The per-device property cache (device_props.h).
#include "cuda/common/device_props.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>

#include "cuda/common/check.h"

namespace flashlite::cuda {

int device_count(std::string* why) {
  struct Count {
    int n = 0;
    std::string error;
  };
  static const Count count = [] {
    Count c;
    const cudaError_t err = cudaGetDeviceCount(&c.n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // the sticky "no device" error is an answer here
      c.n = 0;
      c.error = cudaGetErrorString(err);
    }
    return c;
  }();
  if (why != nullptr && !count.error.empty()) *why = count.error;
  return count.n;
}

const DeviceProps& device_props(int dev) {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceProps, kMaxDevices> props;
  static std::array<std::once_flag, kMaxDevices> read;
  if (dev < 0 || dev >= kMaxDevices) {
    throw Error(ErrorKind::invalid_value, "CUDA device " + std::to_string(dev) + " is out of range");
  }
  std::call_once(read[size_t(dev)], [dev] {
    const auto attr = [dev](cudaDeviceAttr a) {
      int v = 0;
      FL_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, dev));
      return v;
    };
    DeviceProps& d = props[size_t(dev)];
    d.cc = attr(cudaDevAttrComputeCapabilityMajor) * 10 + attr(cudaDevAttrComputeCapabilityMinor);
    d.sms = std::max(1, attr(cudaDevAttrMultiProcessorCount));
    d.smem_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    d.l2_bytes = std::max(1, attr(cudaDevAttrL2CacheSize));
    d.clusters = attr(cudaDevAttrClusterLaunch) != 0;
  });
  return props[size_t(dev)];
}

DeviceIdentity device_identity(int dev) {
  cudaDeviceProp prop{};
  FL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return {prop.name, prop.totalGlobalMem};
}

}  // namespace flashlite::cuda
