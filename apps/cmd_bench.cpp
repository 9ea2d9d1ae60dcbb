// `flashlite bench cpu [--] ...`: runs the CPU benchmark program (flashlite_bench_cpu, built beside this tool) with the
// remaining arguments.
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "commands.h"
#include "flashlite/errors.h"

namespace flashlite::cli {

static std::string self_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, size_t(n));
  return path.substr(0, path.rfind('/'));
}

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: `bench cpu` sweeps naive vs tiled CPU attention");
  bench->require_subcommand(1);
  auto* cpu = bench->add_subcommand("cpu", "CPU sweep: naive vs tiled, GFLOP/s against the measured FMA peak, peak memory "
                                           "(the arguments that follow, after an optional --, go to flashlite_bench_cpu, "
                                           "e.g. -- --quick --json out.json)");
  cpu->prefix_command();  // everything after "cpu" goes to flashlite_bench_cpu (main drops a leading "--")
  cpu->callback([cpu] {
    std::vector<std::string> extra = cpu->remaining();
    const std::string dir = self_dir();
    std::vector<std::string> candidates = {dir + "/flashlite_bench_cpu", dir + "/../bench/flashlite_bench_cpu"};
    for (const std::string& exe : candidates) {
      if (access(exe.c_str(), X_OK) != 0) continue;
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (auto& a : extra) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(exe.c_str(), argv.data());
    }
    throw Error(ErrorKind::runtime, "flashlite_bench_cpu was not found next to this binary (" + dir +
                                        "); build it with -DFLASHLITE_BUILD_BENCH=ON");
  });
}

}  // namespace flashlite::cli
