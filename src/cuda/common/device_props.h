#pragma once
// What the planners need to know about a CUDA device, read once per device (the one place that queries device
// attributes; attribute calls never synchronise, and later calls read the cache, so planning inside a CUDA graph
// capture issues no CUDA call).
#include <cstddef>
#include <string>

namespace flashlite::cuda {

struct DeviceProps {
  int cc = 0;              // compute capability, major * 10 + minor
  int sms = 1;             // streaming multiprocessors
  int smem_optin = 0;      // bytes of shared memory one block may opt in to
  int l2_bytes = 1;        // L2 cache size
  bool clusters = false;   // thread-block cluster launch (sm_90+)
};

// Number of CUDA devices (0 when none is usable; clears the sticky "no device" error). why: the runtime's error when
// it reported none by one, else left as it is.
int device_count(std::string* why = nullptr);
// The properties of device `dev` (0 <= dev < device_count()); throws flashlite::Error when they cannot be read.
const DeviceProps& device_props(int dev);

// What `flashlite info` prints besides the properties (src/version.cpp); read on each call, never by a planner.
struct DeviceIdentity {
  std::string name;
  size_t global_bytes = 0;
};
DeviceIdentity device_identity(int dev);

}  // namespace flashlite::cuda
