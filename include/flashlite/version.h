#pragma once
#include <cstddef>
#include <string>

#define FLASHLITE_VERSION_MAJOR 0
#define FLASHLITE_VERSION_MINOR 1
#define FLASHLITE_VERSION_PATCH 0

namespace flashlite {

const char* version();
// Build facts for `flashlite info`: compiler, CUDA on/off, SIMD compiled in, OpenMP.
std::string build_info();
// The SIMD level the CPU backend uses on this machine: "avx512", "avx2" or "portable".
const char* cpu_simd_level();
int cpu_threads();
// One line per CUDA device, or a sentence saying why there is none.
std::string cuda_devices_info();

// A CUDA device as the library's planners see it (read once per device and cached; the engine and the CLI ask here
// instead of querying the runtime themselves).
struct CudaDeviceInfo {
  std::string name;
  int cc = 0;            // compute capability, major * 10 + minor
  int sms = 0;           // streaming multiprocessors
  int smem_optin = 0;    // bytes of shared memory one block may opt in to
  size_t global_bytes = 0;
};
// Number of usable CUDA devices (0 without CUDA or without a device).
int cuda_device_count();
// Device `index` (0 <= index < cuda_device_count()); throws flashlite::Error otherwise or when it cannot be read.
CudaDeviceInfo cuda_device_info(int index);

}  // namespace flashlite
