// CPU attention sweep (issue 2; seed 001's shapes): B=1, H=8, D=64, fp32, S = 128 ... 4096, non-causal and causal,
// the naive three-step backend vs the tiled `cpu` backend (every SIMD build of it this CPU can run), in one run.
//
// - Checked before timed: every case against the float64 reference on the last min(S, 128) query rows (under the
//   bottom-right causal alignment those rows of the full problem are exactly a q_len = 128 problem over all keys),
//   output and LSE.
// - Time: median wall time of >= 3 timed runs after one untimed checked call (>= 0.5 s in all, at most 15 runs); a
//   call of more than 5 s is timed once.
// - GFLOP/s = 4 B H Sq Sk D / time (halved for causal), against the fp32 FMA peak measured here (all threads,
//   independent FMA chains, the widest ISA available).
// - Peak memory: each case runs in a fresh child process (this program re-executed with --case) that reports the
//   growth of its peak RSS (getrusage ru_maxrss) during its first call over its RSS just before: what the backend
//   allocates beyond inputs and outputs (naive: its S x S scores; tiled: per-thread tile scratch).
// - cpu util = CPU time of the timed runs / (wall time x threads). Below ~0.9 the machine was shared with other work
//   and every figure of that row understates the backend.
#include <omp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fma_peak.h"
#include "flashlite/attention.h"
#include "flashlite/version.h"

namespace {

using namespace flashlite;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 1, kHeads = 8, kHeadDim = 64;
constexpr int64_t kCheckRows = 128;

struct Options {
  bool quick = false;
  int64_t max_seq = 4096;
  std::string json_path;
  std::string commit;
};

// One (backend, SIMD build) row of the sweep.
struct Variant {
  Backend backend;
  std::string simd;  // the cpu backend's build ("" for naive)
  std::string label() const { return simd.empty() ? backend_name(backend) : std::string(backend_name(backend)) + "/" + simd; }
};

struct CaseResult {
  double median_ms = 0, min_ms = 0, max_abs_err = 0, max_lse_err = 0, extra_peak_mib = 0, cpu_util = 0;
  int runs = 0;
  bool ok = false;
};

double flops_of(int64_t seq, bool causal) {
  return 4.0 * kBatch * kHeads * double(seq) * double(seq) * kHeadDim * (causal ? 0.5 : 1.0);
}

std::string read_first_line(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[512];
    if (std::fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown-cpu";
}

std::string sanitise(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
    if (keep) out += c;
    else if (!out.empty() && out.back() != '_') out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "unknown-cpu" : out;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

double cpu_seconds() {
  struct rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

long rss_kib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// ---- The FMA ceiling.
struct Peak {
  double gflops = 0;
  std::string isa;
};

Peak measure_fma_peak() {
  Peak p;
  double (*kernel)(int64_t) = fma_peak_portable_flops;
  p.isa = "portable (SSE2 mul+add)";
  if (__builtin_cpu_supports("avx512f")) {
    kernel = fma_peak_avx512_flops, p.isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernel = fma_peak_avx2_flops, p.isa = "avx2+fma";
  }
  int64_t iters = 1'000'000;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = Clock::now();
    const double flops = kernel(iters);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    p.gflops = std::max(p.gflops, flops / s / 1e9);
    if (s < 0.1) iters *= 4;  // calibrate to ~0.1-0.4 s a run
  }
  return p;
}

// ---- Child mode: one case, one backend; prints one line of results.
CaseResult run_case(const Variant& var, int64_t seq, bool causal, bool quick) {
  if (!var.simd.empty()) setenv("FLASHLITE_CPU_SIMD", var.simd.c_str(), 1);
  const int64_t b = kBatch, h = kHeads, d = kHeadDim;
  std::mt19937 rng(unsigned(seq * 7 + (causal ? 1 : 0)));
  std::normal_distribution<float> dist;
  std::vector<float> q(size_t(b * seq * h * d)), k(q.size()), v(q.size()), out(q.size()), lse(size_t(b * h * seq));
  for (auto* t : {&q, &k, &v}) {
    for (float& x : *t) x = dist(rng);
  }
  std::fill(out.begin(), out.end(), std::nanf(""));
  std::fill(lse.begin(), lse.end(), std::nanf(""));
  ForwardArgs a;
  a.q = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.k = TensorView::contiguous(k.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.v = TensorView::contiguous(v.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.out = TensorView::contiguous(out.data(), DType::f32, Device::cpu(), {b, seq, h, d});
  a.lse = TensorView::contiguous(lse.data(), DType::f32, Device::cpu(), {b, h, seq});
  a.options.causal = causal;
  a.backend = var.backend;

  CaseResult r;
  const long rss_before = rss_kib();
  const auto t0 = Clock::now();
  forward(a);  // the first call: its memory measured, its result checked
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  struct rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.extra_peak_mib = double(ru.ru_maxrss - rss_before) / 1024.0;

  // Check the last rows: the same rows as a q_len = rows problem over all keys (b = 1).
  const int64_t rows = std::min(seq, kCheckRows), row0 = seq - rows;
  std::vector<double> ref(size_t(rows * h * d)), ref_lse(size_t(h * rows));
  ForwardArgs c = a;
  c.q = TensorView::contiguous(q.data() + row0 * h * d, DType::f32, Device::cpu(), {b, rows, h, d});
  c.out = TensorView::contiguous(out.data() + row0 * h * d, DType::f32, Device::cpu(), {b, rows, h, d});
  c.lse = {};
  reference_forward_f64(c, ref.data(), ref_lse.data());
  bool finite = true;
  for (int64_t i = 0; i < rows * h * d; ++i) {
    const double got = out[size_t(row0 * h * d + i)];
    finite = finite && std::isfinite(got);
    r.max_abs_err = std::max(r.max_abs_err, std::fabs(got - ref[size_t(i)]));
  }
  for (int64_t hh = 0; hh < h; ++hh) {
    for (int64_t i = 0; i < rows; ++i) {
      const double got = lse[size_t(hh * seq + row0 + i)], want = ref_lse[size_t(hh * rows + i)];
      finite = finite && std::isfinite(got);
      r.max_lse_err = std::max(r.max_lse_err, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
    }
  }
  r.ok = finite && r.max_abs_err < 1e-4 && r.max_lse_err < 1e-4;

  // Timed runs.
  std::vector<double> ms;
  double wall = 0, cpu = 0;
  if (first_ms > 5000) {
    ms.push_back(first_ms);  // too slow to repeat (naive at large S): its one checked call
  } else {
    const double min_total_ms = quick ? 100 : 500;
    const int min_runs = quick ? 2 : 3, max_runs = quick ? 5 : 15;
    const double cpu0 = cpu_seconds();
    while (int(ms.size()) < min_runs || (wall * 1e3 < min_total_ms && int(ms.size()) < max_runs)) {
      const auto s = Clock::now();
      forward(a);
      const double dt = std::chrono::duration<double>(Clock::now() - s).count();
      ms.push_back(dt * 1e3);
      wall += dt;
    }
    cpu = cpu_seconds() - cpu0;
  }
  std::sort(ms.begin(), ms.end());
  r.runs = int(ms.size());
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  r.cpu_util = wall > 0 ? cpu / (wall * omp_get_max_threads()) : 0;
  return r;
}

std::string g_self;  // this program, re-executed per case

CaseResult run_in_child(const Variant& var, int64_t seq, bool causal, bool quick) {
  const std::string cmd = "'" + g_self + "' --case " + backend_name(var.backend) + " " +
                          (var.simd.empty() ? "-" : var.simd) + " " + std::to_string(seq) + " " + (causal ? "1" : "0") +
                          (quick ? " --quick" : "");
  CaseResult r;
  const std::string line = read_first_line(cmd);
  int ok = 0;
  if (std::sscanf(line.c_str(), "%lf %lf %lf %lf %lf %lf %d %d", &r.median_ms, &r.min_ms, &r.max_abs_err, &r.max_lse_err,
                  &r.extra_peak_mib, &r.cpu_util, &r.runs, &ok) == 8) {
    r.ok = ok != 0;
  } else {
    std::fprintf(stderr, "case %s seq %lld causal %d: the child printed '%s'\n", var.label().c_str(), (long long)seq,
                 causal ? 1 : 0, line.c_str());
  }
  return r;
}

// The SIMD builds of the cpu backend this CPU runs, widest first.
std::vector<std::string> runnable_simd() {
  std::vector<std::string> out;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    out.push_back("avx512");
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    out.push_back("avx2");
  }
  out.push_back("portable");
  return out;
}

std::string json_target(const std::string& path, const std::string& model) {
  struct stat st{};
  const bool dir = (!path.empty() && path.back() == '/') || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  if (!dir) return path;
  return path + (path.back() == '/' ? "" : "/") + sanitise(model) + ".json";
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr,
               "flashlite_bench_cpu: %s\nusage: flashlite_bench_cpu [--quick] [--max-seq N] [--json PATH|DIR|auto] "
               "[--commit ID]\n  --json auto writes %s/bench/results/cpu/<cpu model>.json\n",
               msg.c_str(), FLASHLITE_SOURCE_DIR);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    g_self = n > 0 ? std::string(buf, size_t(n)) : argv[0];
  }
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--case") {  // child mode: --case BACKEND SIMD|- SEQ CAUSAL [--quick]
      if (i + 4 >= argc) usage_error("--case needs BACKEND SIMD SEQ CAUSAL");
      const Variant var{parse_backend(argv[i + 1]), std::string(argv[i + 2]) == "-" ? "" : argv[i + 2]};
      const int64_t seq = std::stoll(argv[i + 3]);
      const bool causal = std::string(argv[i + 4]) == "1";
      const bool quick = i + 5 < argc && std::string(argv[i + 5]) == "--quick";
      CaseResult r;
      try {
        r = run_case(var, seq, causal, quick);
      } catch (const std::exception& e) {
        std::printf("failed: %s\n", e.what());
        return 1;
      }
      std::printf("%.6f %.6f %.6e %.6e %.3f %.3f %d %d\n", r.median_ms, r.min_ms, r.max_abs_err, r.max_lse_err,
                  r.extra_peak_mib, r.cpu_util, r.runs, r.ok ? 1 : 0);
      return r.ok ? 0 : 1;
    }
    if (arg == "--quick") opt.quick = true;
    else if (arg == "--json") opt.json_path = value();
    else if (arg == "--commit") opt.commit = value();
    else if (arg == "--max-seq") {
      const std::string v = value();
      char* end = nullptr;
      opt.max_seq = std::strtoll(v.c_str(), &end, 10);
      if (!end || *end || opt.max_seq < 128) usage_error("--max-seq is '" + v + "'; expected an integer >= 128");
    } else if (arg == "-h" || arg == "--help") {
      usage_error("naive vs tiled CPU attention, B=1 H=8 D=64 fp32, S = 128 .. 4096");
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (opt.quick) opt.max_seq = std::min<int64_t>(opt.max_seq, 256);
  if (opt.commit.empty()) {
    opt.commit = read_first_line(std::string("git -C '") + FLASHLITE_SOURCE_DIR + "' rev-parse HEAD 2>/dev/null");
    if (opt.commit.empty()) opt.commit = "unknown";
  }
  const std::string model = cpu_model();
  if (opt.json_path == "auto") opt.json_path = std::string(FLASHLITE_SOURCE_DIR) + "/bench/results/cpu/";
  if (!opt.json_path.empty()) opt.json_path = json_target(opt.json_path, model);

  std::vector<Variant> variants = {{Backend::naive, ""}};
  for (const std::string& s : runnable_simd()) variants.push_back({Backend::cpu, s});

  const std::string load_start = load_average();
  const Peak peak0 = measure_fma_peak();
  const int threads = omp_get_max_threads();
  std::printf("CPU: %s, %d threads; cpu backend runs the %s build; commit %s\n", model.c_str(), threads,
              cpu_simd_level(), opt.commit.c_str());
  std::printf("fp32 FMA peak measured (%s, all threads): %.1f GFLOP/s; load average %s\n", peak0.isa.c_str(),
              peak0.gflops, load_start.c_str());
  std::printf("B=%lld H=%lld D=%lld fp32; median of timed runs; extra MiB = peak RSS growth of the first call\n\n",
              (long long)kBatch, (long long)kHeads, (long long)kHeadDim);
  std::printf("%-6s %-6s %-13s %10s %9s %7s %8s %10s %9s %5s\n", "seq", "causal", "backend", "ms", "GFLOP/s", "%peak",
              "speedup", "extra MiB", "max err", "util");

  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  for (bool causal : {false, true}) {
    for (int64_t seq = 128; seq <= opt.max_seq; seq *= 2) {
      double naive_ms = 0;
      for (const Variant& var : variants) {
        const CaseResult r = run_in_child(var, seq, causal, opt.quick);
        all_ok = all_ok && r.ok;
        if (var.backend == Backend::naive) naive_ms = r.median_ms;
        const double gflops = r.median_ms > 0 ? flops_of(seq, causal) / (r.median_ms * 1e6) : 0;
        const double pct = 100 * gflops / peak0.gflops;
        const double speedup = r.median_ms > 0 ? naive_ms / r.median_ms : 0;
        std::printf("%-6lld %-6s %-13s %10.3f %9.2f %6.1f%% %7.2fx %10.2f %9.2e %5.2f%s\n", (long long)seq,
                    causal ? "yes" : "no", var.label().c_str(), r.median_ms, gflops, pct, speedup, r.extra_peak_mib,
                    r.max_abs_err, r.cpu_util, r.ok ? "" : "  CHECK FAILED");
        std::fflush(stdout);
        rows.push_back({{"seq", seq},
                        {"causal", causal},
                        {"backend", backend_name(var.backend)},
                        {"simd", var.simd},
                        {"median_ms", r.median_ms},
                        {"min_ms", r.min_ms},
                        {"runs", r.runs},
                        {"gflops", gflops},
                        {"pct_of_fma_peak", pct},
                        {"speedup_vs_naive", speedup},
                        {"extra_peak_rss_mib", r.extra_peak_mib},
                        {"cpu_util", r.cpu_util},
                        {"max_abs_err", r.max_abs_err},
                        {"max_lse_rel_err", r.max_lse_err},
                        {"checked_ok", r.ok}});
      }
    }
  }
  const Peak peak1 = measure_fma_peak();
  const std::string load_end = load_average();
  std::printf("\nFMA peak again after the sweep: %.1f GFLOP/s; load average %s\n", peak1.gflops, load_end.c_str());

  if (!opt.json_path.empty()) {
    nlohmann::json j = {
        {"benchmark", "cpu attention sweep: naive vs tiled (B=1, H=8, D=64, fp32)"},
        {"commit", opt.commit},
        {"cpu_model", model},
        {"threads", threads},
        {"simd_variant", cpu_simd_level()},
        {"flashlite_version", version()},
        {"fma_peak_gflops", peak0.gflops},
        {"fma_peak_gflops_after", peak1.gflops},
        {"fma_peak_isa", peak0.isa},
        {"load_average_start", load_start},
        {"load_average_end", load_end},
        {"flops", "4*B*H*Sq*Sk*D, halved for causal"},
        {"time", "median wall time of the timed runs (one untimed checked call first)"},
        {"memory_metric", "peak RSS growth during the first call, in a fresh child process per case (MiB)"},
        {"check", "last min(S,128) query rows vs the float64 reference: max abs error of out, relative error of LSE"},
        {"cpu_util", "CPU time / (wall time x threads) over the timed runs; < 0.9 means the machine was shared"},
        {"rows", rows}};
    std::ofstream f(opt.json_path);
    f << j.dump(2) << "\n";
    std::printf("wrote %s\n", opt.json_path.c_str());
    if (!f) {
      std::fprintf(stderr, "could not write %s\n", opt.json_path.c_str());
      return 1;
    }
  }
  if (!all_ok) std::printf("\nSOME CHECKS FAILED\n");
  return all_ok ? 0 : 1;
}
