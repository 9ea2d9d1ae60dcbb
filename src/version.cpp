#include "flashlite/version.h"

#include <omp.h>

#include <sstream>

#include "backends.h"
#include "flashlite/errors.h"

#if FLASHLITE_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/common/device_props.h"
#endif

namespace flashlite {

const char* version() { return FLASHLITE_VERSION_STRING; }

const char* cpu_simd_level() { return cpu_simd_name(cpu_simd_default()); }

int cpu_threads() { return omp_get_max_threads(); }

std::string build_info() {
  std::ostringstream os;
  os << "flashlite " << version() << "\n";
#if defined(__clang__)
  os << "compiler: clang " << __clang_major__ << "." << __clang_minor__ << "\n";
#elif defined(__GNUC__)
  os << "compiler: gcc " << __GNUC__ << "." << __GNUC_MINOR__ << "\n";
#endif
  os << "cuda backends: " << (FLASHLITE_WITH_CUDA ? "compiled in" : "not compiled (CPU-only build)") << "\n";
#if FLASHLITE_WITH_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  os << "cuda runtime: " << runtime / 1000 << "." << (runtime % 1000) / 10 << "\n";
#endif
  os << "openmp: " << _OPENMP << "\n";
  return os.str();
}

std::string cuda_devices_info() {
#if FLASHLITE_WITH_CUDA
  std::string why;
  const int count = cuda::device_count(&why);
  if (!why.empty()) return "no CUDA device: " + why;
  if (count == 0) return "no CUDA device found";
  std::ostringstream os;
  for (int i = 0; i < count; ++i) {
    const cuda::DeviceProps& props = cuda::device_props(i);
    const cuda::DeviceIdentity id = cuda::device_identity(i);
    os << "cuda:" << i << " " << id.name << ", sm_" << props.cc / 10 << props.cc % 10 << ", " << props.sms << " SMs, "
       << (id.global_bytes >> 20) << " MiB" << (i + 1 < count ? "\n" : "");
  }
  return os.str();
#else
  return "CUDA backends not compiled in";
#endif
}

int cuda_device_count() {
#if FLASHLITE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

CudaDeviceInfo cuda_device_info(int index) {
  const int count = cuda_device_count();
  if (index < 0 || index >= count) {
    throw Error(ErrorKind::invalid_value, "CUDA device " + std::to_string(index) + " does not exist; this process sees " +
                                              std::to_string(count) + " CUDA device(s)");
  }
  CudaDeviceInfo info;
#if FLASHLITE_WITH_CUDA
  const cuda::DeviceProps& props = cuda::device_props(index);
  const cuda::DeviceIdentity id = cuda::device_identity(index);
  info.name = id.name;
  info.global_bytes = id.global_bytes;
  info.cc = props.cc;
  info.sms = props.sms;
  info.smem_optin = props.smem_optin;
#endif
  return info;
}

}  // namespace flashlite
