// `flashlite info`: build options, CPU features and threads, CUDA devices, what --tp can use.
#include <fstream>
#include <iostream>
#include <string>

#include "commands.h"
#include "engine/parallel/parallel_model.h"
#include "flashlite/version.h"

namespace flashlite::cli {

static std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show build options, CPU features and threads, CUDA devices");
  cmd->callback([] {
    std::cout << build_info();
    std::cout << "cpu: " << cpu_model() << "\n";
    std::cout << "cpu simd path: " << cpu_simd_level() << " (avx2 " << (__builtin_cpu_supports("avx2") ? "yes" : "no")
              << ", fma " << (__builtin_cpu_supports("fma") ? "yes" : "no") << ", avx512f "
              << (__builtin_cpu_supports("avx512f") ? "yes" : "no") << ")\n";
    std::cout << "cpu threads: " << cpu_threads() << "\n";
    std::cout << "cuda devices: " << cuda_devices_info() << "\n";
    std::cout << "tensor parallelism (--tp): " << engine::tensor_parallel_support() << "\n";
  });
}

}  // namespace flashlite::cli
