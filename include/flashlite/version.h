#pragma once
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

}  // namespace flashlite
