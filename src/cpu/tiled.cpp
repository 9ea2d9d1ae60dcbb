// The `cpu` backend: picks the widest tiled-kernel build this CPU can run. FLASHLITE_CPU_SIMD=portable|avx2|avx512
// forces a variant (tests use it to cover every path the machine supports).
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends.h"
#include "flashlite/errors.h"

namespace flashlite {
namespace cpu_portable { void run_tiled(const AttentionProblem& p); }
namespace cpu_avx2 { void run_tiled(const AttentionProblem& p); }
namespace cpu_avx512 { void run_tiled(const AttentionProblem& p); }

namespace {

bool cpu_has(const char* level) {
  if (std::strcmp(level, "avx512") == 0) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }
  if (std::strcmp(level, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  return true;
}

const char* detect_variant() {
  if (const char* forced = std::getenv("FLASHLITE_CPU_SIMD"); forced && *forced) {
    for (const char* level : {"portable", "avx2", "avx512"}) {
      if (std::strcmp(forced, level) == 0) {
        if (!cpu_has(level)) {
          throw Error(ErrorKind::invalid_value, std::string("FLASHLITE_CPU_SIMD=") + forced + " but this CPU lacks " + level);
        }
        return level;
      }
    }
    throw Error(ErrorKind::invalid_value,
                std::string("FLASHLITE_CPU_SIMD is '") + forced + "'; expected portable, avx2 or avx512");
  }
  if (cpu_has("avx512")) return "avx512";
  if (cpu_has("avx2")) return "avx2";
  return "portable";
}

}  // namespace

const char* cpu_tiled_variant() { return detect_variant(); }

void run_cpu_tiled(const AttentionProblem& p) {
  const char* variant = detect_variant();
  if (std::strcmp(variant, "avx512") == 0) return cpu_avx512::run_tiled(p);
  if (std::strcmp(variant, "avx2") == 0) return cpu_avx2::run_tiled(p);
  cpu_portable::run_tiled(p);
}

}  // namespace flashlite
