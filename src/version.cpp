#include "flashlite/version.h"

#include <omp.h>

#include <sstream>

#include "backends.h"

#if FLASHLITE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlite {

const char* version() { return FLASHLITE_VERSION_STRING; }

const char* cpu_simd_level() { return cpu_tiled_variant(); }

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
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device found";
  std::ostringstream os;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, i);
    os << "cuda:" << i << " " << prop.name << ", sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount
       << " SMs, " << (prop.totalGlobalMem >> 20) << " MiB" << (i + 1 < count ? "\n" : "");
  }
  return os.str();
#else
  return "CUDA backends not compiled in";
#endif
}

}  // namespace flashlite
