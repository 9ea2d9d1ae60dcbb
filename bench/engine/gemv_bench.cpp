// The engine's decode GEMVs timed at the Llama-3.2-1B shapes (GPU machine; was cuda_ops_test's GemvBandwidth): QKV,
// O, gate/up + SwiGLU, down and the LM head, at 1, 2, 4 and 8 rows, with the engine's split-K (gemv_auto_split) and,
// at one row, forced splits beside it. Nothing is checked here: tests/engine/cuda_ops_test.cpp holds the GEMV at
// every split against float64.
//
//   flashlite_engine_gemv_bench [--rows 1,2,4,8] [--iters 20]
//
// Per row of output: one launch timed alone (launch latency included, as Round 2 measured it; median of `iters`) and
// `iters` launches queued back to back between two events (the in-step cost: PDL overlaps launch and ramp where it is
// on; median of 5 such streams), each with the weight bandwidth (weight bytes / time).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cuda_ops/testing.h"

namespace {

namespace ops = flashlite::engine::cuda_ops;
namespace dt = flashlite::engine::cuda_ops::testing;

struct Shape {
  const char* name;
  ops::GemvIn in;
  ops::GemvOut epi;
  int out, k, weight_rows;
};
const Shape kShapes[] = {{"qkv", ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 3072, 2048, 3072},
                         {"o", ops::GemvIn::bf16, ops::GemvOut::add_f32, 2048, 2048, 2048},
                         {"gate/up+swiglu", ops::GemvIn::rmsnorm, ops::GemvOut::swiglu_bf16, 8192, 2048, 16384},
                         {"down", ops::GemvIn::bf16, ops::GemvOut::add_f32, 2048, 8192, 2048},
                         {"lm head", ops::GemvIn::rmsnorm, ops::GemvOut::f32, 128256, 2048, 128256}};

struct Variant {
  const char* name;
  int split;  // 0: gemv_auto_split (the engine's choice)
};
const Variant kVariants[] = {{"split auto", 0}, {"split 1", 1}, {"split 2", 2}, {"split 4", 4}};

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows_list = {1, 2, 4, 8};
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      rows_list = int_list(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--rows 1,2,4,8] [--iters 20]\n", argv[0]);
      return 2;
    }
  }
  if (rows_list.empty() || iters < 1 ||
      std::any_of(rows_list.begin(), rows_list.end(), [](int r) { return r < 1; })) {
    std::fprintf(stderr, "--rows must list positive counts and --iters be positive\n");
    return 2;
  }
  if (!dt::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  try {
    for (int rows : rows_list) {
      for (const Shape& s : kShapes) {
        for (const Variant& v : kVariants) {
          if (rows > 1 && v.split != 0) continue;  // forced splits at one row only (time)
          if (s.epi == ops::GemvOut::swiglu_bf16 && v.split > 1) continue;  // split does not apply
          ops::GemvParams p;
          p.in = s.in;
          p.epi = s.epi;
          p.rows = rows;
          p.out = s.out;
          p.k = s.k;
          p.eps = 1e-5f;
          p.split = v.split ? v.split : s.epi == ops::GemvOut::add_f32 ? ops::gemv_auto_split(s.out, s.k) : 1;
          const double us = dt::gemv_time_us(p, iters), us_stream = dt::gemv_back_to_back_time_us(p, iters);
          const double bytes = double(s.weight_rows) * s.k * 2;
          std::printf("gemv %-15s rows %d %-19s split %d: %8.1f us alone %7.1f GB/s | %8.1f us in a stream %7.1f GB/s "
                      "(%.1f MB)\n", s.name, rows, v.name, p.split, us, bytes / us / 1e3, us_stream,
                      bytes / us_stream / 1e3, bytes / 1e6);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
