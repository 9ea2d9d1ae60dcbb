// CPU attention sweep (seed 001's shapes): B=1, H=8, D=64, fp32, S = 128 ... 4096, naive vs the tiled cpu backend.
// Every case is checked before it is timed (against the float64 reference up to --max-check-seq, beyond that
// cpu against naive). Prints GFLOP/s against the measured fp32 FMA peak, the speedup, and the extra peak memory each
// backend needs beyond its inputs (measured: each case runs in a forked child; peak RSS minus RSS before the call).
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "flashlite/attention.h"
#include "flashlite/version.h"

double fma_peak_avx2_flops(int64_t iters);

namespace {

using namespace flashlite;
using Clock = std::chrono::steady_clock;

struct Options {
  bool quick = false;
  int64_t max_seq = 4096;
  int64_t max_check_seq = 1024;
  std::string json_path;
  std::string commit = "unknown";
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

double measure_fma_peak() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  const int64_t iters = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    const double flops = fma_peak_avx2_flops(iters);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, flops / s);
  }
  return best;
}

long current_rss_kib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct Result {
  double median_ms = 0;
  double max_abs_err = 0;
  double extra_peak_mib = 0;
  bool ok = true;
};

// Runs in a forked child: inputs, one checked call, timed calls, peak RSS. Returns through a pipe.
Result run_case(Backend backend, int64_t seq, bool causal, const Options& opt) {
  const int64_t b = 1, h = 8, d = 64;
  std::mt19937 rng(unsigned(seq * 7 + causal));
  std::normal_distribution<float> dist;
  std::vector<float> q(b * seq * h * d), k(q.size()), v(q.size()), out(q.size()), lse(b * h * seq);
  for (auto* t : {&q, &k, &v}) for (float& x : *t) x = dist(rng);
  std::fill(out.begin(), out.end(), 0.f);
  std::fill(lse.begin(), lse.end(), 0.f);
  ForwardArgs a;
  a.q = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.k = TensorView::contiguous(k.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.v = TensorView::contiguous(v.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.out = TensorView::contiguous(out.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.lse = TensorView::contiguous(lse.data(), DType::f32, Device::cpu(), {b, h, seq});
  a.options.causal = causal;
  a.backend = backend;

  Result r;
  const long rss_before = current_rss_kib();
  std::fill(out.begin(), out.end(), std::nanf(""));
  forward(a);  // the first call: checked, and its peak memory measured
  struct rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.extra_peak_mib = double(ru.ru_maxrss - rss_before) / 1024.0;

  // Check: float64 reference for small problems, else against the naive backend.
  std::vector<double> ref(q.size());
  if (seq <= opt.max_check_seq) {
    reference_forward_f64(a, ref.data(), nullptr);
  } else if (backend != Backend::naive) {
    std::vector<float> out2(q.size());
    ForwardArgs n = a;
    n.out = TensorView::contiguous(out2.data(), DType::f32, Device::cpu(), {b, seq, h, d});
    n.lse = {};
    n.backend = Backend::naive;
    forward(n);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = out2[i];
  } else {
    ref.assign(out.begin(), out.end());
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::abs(double(out[i]) - ref[i]);
    if (!(e == e)) r.ok = false;
    r.max_abs_err = std::max(r.max_abs_err, e);
  }
  if (r.max_abs_err >= 1e-4) r.ok = false;

  // Timing: median; fewer runs for the slow big cases.
  const double flops = 4.0 * b * h * seq * seq * d * (causal ? 0.5 : 1.0);
  const int runs = flops > 2e10 ? 1 : flops > 2e9 ? 3 : opt.quick ? 3 : 7;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    forward(a);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  r.median_ms = ms[ms.size() / 2];
  return r;
}

// Each case runs in a fresh process (this program re-executed with --case), so its peak RSS is its own. (A plain
// fork would inherit OpenMP's thread pool in a broken state and deadlock.)
std::string g_self;

Result run_in_child(Backend backend, int64_t seq, bool causal, const Options& opt) {
  const std::string cmd = g_self + " --case " + backend_name(backend) + " " + std::to_string(seq) + " " +
                          (causal ? "1" : "0") + " --max-check-seq " + std::to_string(opt.max_check_seq) +
                          (opt.quick ? " --quick" : "");
  Result r;
  r.ok = false;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  int ok = 0;
  if (std::fscanf(f, "%lf %lf %lf %d", &r.median_ms, &r.max_abs_err, &r.extra_peak_mib, &ok) == 4) r.ok = ok != 0;
  pclose(f);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  g_self = "/proc/" + std::to_string(getpid()) + "/exe";
  {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) g_self.assign(buf, size_t(n));
  }
  std::string case_backend;
  int64_t case_seq = 0;
  bool case_causal = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--case" && i + 3 < argc) {
      case_backend = argv[++i];
      case_seq = std::stoll(argv[++i]);
      case_causal = std::string(argv[++i]) == "1";
    } else if (arg == "--quick") opt.quick = true;
    else if (arg == "--json") opt.json_path = next("--json");
    else if (arg == "--max-seq") opt.max_seq = std::stoll(next("--max-seq"));
    else if (arg == "--max-check-seq") opt.max_check_seq = std::stoll(next("--max-check-seq"));
    else if (arg == "--commit") opt.commit = next("--commit");
    else {
      std::fprintf(stderr, "unknown argument '%s'; expected --quick, --json PATH, --max-seq N, --max-check-seq N, --commit ID\n", arg.c_str());
      return 2;
    }
  }
  if (opt.quick) opt.max_seq = std::min<int64_t>(opt.max_seq, 512);
  if (!case_backend.empty()) {  // child mode: one case, one line of results on stdout
    Result r;
    try {
      r = run_case(parse_backend(case_backend), case_seq, case_causal, opt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "case failed: %s\n", e.what());
      r.ok = false;
    }
    std::printf("%.6f %.6e %.3f %d\n", r.median_ms, r.max_abs_err, r.extra_peak_mib, r.ok ? 1 : 0);
    return r.ok ? 0 : 1;
  }

  const double peak = measure_fma_peak();
  const std::string model = cpu_model();
  std::printf("CPU: %s, %d threads, cpu backend SIMD path: %s\n", model.c_str(), omp_get_max_threads(), cpu_tiled_variant());
  std::printf("measured fp32 FMA peak (AVX2, all threads): %.1f GFLOP/s\n\n", peak / 1e9);
  std::printf("%-6s %-7s %-6s %10s %10s %8s %9s %12s %10s\n", "seq", "causal", "backend", "ms", "GFLOP/s", "%peak", "speedup",
              "extra MiB", "max err");

  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  for (bool causal : {false, true}) {
    for (int64_t seq = 128; seq <= opt.max_seq; seq *= 2) {
      const double flops = 4.0 * 8 * seq * seq * 64 * (causal ? 0.5 : 1.0);
      double naive_ms = 0;
      for (Backend backend : {Backend::naive, Backend::cpu}) {
        const Result r = run_in_child(backend, seq, causal, opt);
        all_ok = all_ok && r.ok;
        if (backend == Backend::naive) naive_ms = r.median_ms;
        const double gflops = flops / (r.median_ms * 1e6);
        const double speedup = naive_ms / r.median_ms;
        std::printf("%-6lld %-7s %-7s %10.3f %10.2f %7.1f%% %8.2fx %12.2f %10.2e%s\n", (long long)seq, causal ? "yes" : "no",
                    backend_name(backend), r.median_ms, gflops, peak > 0 ? 100 * gflops * 1e9 / peak : 0.0, speedup,
                    r.extra_peak_mib, r.max_abs_err, r.ok ? "" : "  CHECK FAILED");
        std::fflush(stdout);
        rows.push_back({{"seq", seq}, {"causal", causal}, {"backend", backend_name(backend)}, {"median_ms", r.median_ms},
                        {"gflops", gflops}, {"pct_of_fma_peak", peak > 0 ? 100 * gflops * 1e9 / peak : 0.0},
                        {"speedup_vs_naive", speedup}, {"extra_peak_rss_mib", r.extra_peak_mib},
                        {"max_abs_err", r.max_abs_err}, {"checked_ok", r.ok}});
      }
    }
  }
  if (!opt.json_path.empty()) {
    nlohmann::json j = {{"benchmark", "cpu attention sweep (B=1, H=8, D=64, fp32)"},
                        {"commit", opt.commit},
                        {"cpu_model", model},
                        {"threads", omp_get_max_threads()},
                        {"simd_variant", cpu_tiled_variant()},
                        {"flashlite_version", version()},
                        {"fma_peak_gflops", peak / 1e9},
                        {"memory_metric", "peak RSS growth during the first call, in a fresh child process (MiB)"},
                        {"rows", rows}};
    std::ofstream(opt.json_path) << j.dump(2) << "\n";
    std::printf("\nwrote %s\n", opt.json_path.c_str());
  }
  if (!all_ok) std::printf("\nSOME CHECKS FAILED\n");
  return all_ok ? 0 : 1;
}
