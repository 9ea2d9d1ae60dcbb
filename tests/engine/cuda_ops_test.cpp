// The engine's decode-step CUDA kernels against host references: the fused GEMVs (RMSNorm prologue; bf16, fp32,
// residual-add and SwiGLU epilogues) against float64 dot products of the same bf16-rounded operands, at odd sizes;
// the device argmax and top-k against the host sampler's rules, ties included. Built only with CUDA; skips without a
// device. GemvBandwidth prints the GEMV times at the Llama-3.2-1B shapes (no assertion).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/cuda_ops/testing.h"
#include "engine/sampler.h"

namespace {

namespace ops = flashlite::engine::cuda_ops;
namespace dt = flashlite::engine::cuda_ops::testing;
using flashlite::engine::Sampler;

#define DEVICE_OR_SKIP() \
  if (!dt::device_available()) GTEST_SKIP() << "no CUDA device"

// Round to nearest even bf16, as __float2bfloat16 does (finite values).
float bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Case {
  ops::GemvIn in;
  ops::GemvOut epi;
  int rows, out, k;
  bool row_index;
};

// float64 reference of gemv on the bf16-rounded operands; the normed input is rounded to bf16 as the kernel stages it.
std::vector<double> reference(const Case& c, const std::vector<float>& w, const std::vector<float>& x,
                              const std::vector<float>& xf, const std::vector<float>& g, const std::vector<int32_t>& ri,
                              const std::vector<float>& y0) {
  std::vector<double> act(size_t(c.rows) * c.k);
  for (int r = 0; r < c.rows; ++r) {
    if (c.in == ops::GemvIn::bf16) {
      for (int i = 0; i < c.k; ++i) act[size_t(r) * c.k + i] = bf16(x[size_t(r) * c.k + i]);
    } else {
      const float* xr = xf.data() + size_t(ri.empty() ? r : ri[r]) * c.k;
      double ss = 0;
      for (int i = 0; i < c.k; ++i) ss += double(xr[i]) * xr[i];
      const double inv = 1.0 / std::sqrt(ss / c.k + 1e-5);
      for (int i = 0; i < c.k; ++i) act[size_t(r) * c.k + i] = bf16(float(xr[i] * inv * bf16(g[i])));
    }
  }
  auto dot = [&](int wrow, int r) {
    double s = 0;
    for (int i = 0; i < c.k; ++i) s += double(bf16(w[size_t(wrow) * c.k + i])) * act[size_t(r) * c.k + i];
    return s;
  };
  std::vector<double> y(size_t(c.rows) * c.out);
  for (int r = 0; r < c.rows; ++r)
    for (int o = 0; o < c.out; ++o) {
      double v = dot(o, r);
      if (c.epi == ops::GemvOut::swiglu_bf16) v = v / (1 + std::exp(-v)) * dot(c.out + o, r);
      if (c.epi == ops::GemvOut::add_f32) v += y0[size_t(r) * c.out + o];
      y[size_t(r) * c.out + o] = v;
    }
  return y;
}

TEST(EngineCudaOps, FusedGemvMatchesFloat64) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(11);
  const std::vector<Case> cases = {
      {ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 1, 301, 264, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 3, 96, 2048, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::swiglu_bf16, 1, 173, 264, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::swiglu_bf16, 5, 64, 520, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::f32, 2, 1001, 264, true},
      {ops::GemvIn::rmsnorm, ops::GemvOut::f32, 8, 37, 136, true},
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 1, 257, 1032, false},
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 7, 130, 8, false},
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 8, 2048, 2048, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("in " + std::to_string(int(c.in)) + " epi " + std::to_string(int(c.epi)) + " rows " +
                 std::to_string(c.rows) + " out " + std::to_string(c.out) + " k " + std::to_string(c.k));
    const int wrows = c.epi == ops::GemvOut::swiglu_bf16 ? 2 * c.out : c.out;
    const int stream_rows = c.row_index ? c.rows + 3 : c.rows;
    const auto w = random_vec(size_t(wrows) * c.k, rng, -0.1f, 0.1f);
    const auto x = random_vec(size_t(c.rows) * c.k, rng);
    const auto xf = random_vec(size_t(stream_rows) * c.k, rng, -3.f, 3.f);
    const auto g = random_vec(c.k, rng, 0.5f, 1.5f);
    std::vector<int32_t> ri;
    if (c.row_index)
      for (int r = 0; r < c.rows; ++r) ri.push_back((r * 5 + 2) % stream_rows);
    std::vector<float> y = random_vec(size_t(c.rows) * c.out, rng, -2.f, 2.f);
    const std::vector<float> y0 = y;
    ops::GemvParams p;
    p.in = c.in;
    p.epi = c.epi;
    p.rows = c.rows;
    p.out = c.out;
    p.k = c.k;
    p.eps = 1e-5f;
    dt::gemv(p, w, x, xf, g, ri, y);
    const std::vector<double> want = reference(c, w, x, xf, g, ri, y0);
    double rms = 0;
    for (double v : want) rms += v * v;
    rms = std::sqrt(rms / want.size());
    const bool b16 = c.epi == ops::GemvOut::bf16 || c.epi == ops::GemvOut::swiglu_bf16;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << "element " << i << " unwritten or not finite";
      // bf16 outputs: one rounding (2^-9 relative) plus accumulation order; fp32: accumulation order and the rare
      // one-ulp difference of a staged bf16 input.
      const double tol = b16 ? 5e-3 * std::abs(want[i]) + 2e-3 * rms : 1e-3 * rms + 1e-5 * std::abs(want[i]);
      worst = std::max(worst, std::abs(y[i] - want[i]) / tol);
      ASSERT_LE(std::abs(y[i] - want[i]), tol) << "element " << i << " got " << y[i] << " want " << want[i];
    }
    std::printf("gemv in %d epi %d rows %d out %d k %d: worst error / tolerance %.3f\n", int(c.in), int(c.epi), c.rows,
                c.out, c.k, worst);
  }
}

TEST(EngineCudaOps, GemvRejectsUnsupportedSizes) {
  EXPECT_FALSE(ops::gemv_supported(0, 64));
  EXPECT_FALSE(ops::gemv_supported(ops::kGemvMaxRows + 1, 64));
  EXPECT_FALSE(ops::gemv_supported(1, 100));  // not a multiple of 8
  EXPECT_TRUE(ops::gemv_supported(1, 2048));
  EXPECT_TRUE(ops::gemv_supported(8, 8192));
}

// Logits with many exact ties: values on a coarse grid, and the row maximum repeated at several places.
std::vector<float> tied_logits(int rows, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> level(-200, 200);
  std::vector<float> v(size_t(rows) * vocab);
  for (float& x : v) x = level(rng) * 0.05f;
  std::uniform_int_distribution<int> at(0, vocab - 1);
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < 3; ++t) v[size_t(r) * vocab + at(rng)] = 10.5f;
  return v;
}

TEST(EngineCudaOps, DeviceArgmaxIsTheHostArgmax) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(3);
  for (int vocab : {1, 7, 1001, 128256}) {
    const int rows = 5;
    std::vector<float> a = random_vec(size_t(rows) * vocab, rng, -20.f, 20.f);
    std::vector<float> b = tied_logits(rows, vocab, rng);
    std::vector<float> c(size_t(rows) * vocab, -1.5f);  // all equal: index 0
    for (int r = 0; r < rows; ++r) c[size_t(r) * vocab + vocab / 2] = r % 2 ? -0.0f : -1.5f;
    std::vector<float> d(size_t(rows) * vocab, 0.0f);  // +0 and -0 are equal: the first wins
    for (size_t i = 0; i < d.size(); i += 2) d[i] = -0.0f;
    for (const auto* logits : {&a, &b, &c, &d}) {
      const std::vector<int32_t> got = dt::argmax_rows(*logits, rows, vocab);
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(got[r], flashlite::engine::argmax(logits->data() + size_t(r) * vocab, vocab)) << "vocab " << vocab << " row " << r;
    }
  }
}

TEST(EngineCudaOps, DeviceTopKIsTheHostPartialSort) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(5);
  for (int vocab : {9, 1001, 128256}) {
    for (int k : {1, 2, 40, 1000}) {
      if (k >= vocab) continue;
      const int rows = 3;
      for (int variant = 0; variant < 2; ++variant) {
        const std::vector<float> logits =
            variant ? tied_logits(rows, vocab, rng) : random_vec(size_t(rows) * vocab, rng, -10.f, 10.f);
        std::vector<float> values;
        std::vector<int32_t> ids;
        dt::top_k_rows(logits, rows, vocab, k, values, ids);
        for (int r = 0; r < rows; ++r) {
          std::vector<std::pair<float, int>> host(vocab), dev(k);
          for (int i = 0; i < vocab; ++i) host[i] = {logits[size_t(r) * vocab + i], i};
          std::partial_sort(host.begin(), host.begin() + k, host.end(), Sampler::before);
          host.resize(k);
          for (int i = 0; i < k; ++i) dev[i] = {values[size_t(r) * k + i], ids[size_t(r) * k + i]};
          std::sort(dev.begin(), dev.end(), Sampler::before);
          ASSERT_EQ(dev, host) << "vocab " << vocab << " k " << k << " row " << r << (variant ? " (ties)" : "");
        }
      }
    }
  }
}

// Sampling from the device's candidates equals sampling from the full row, same seed, for many draws.
TEST(EngineCudaOps, TopKCandidatesSampleLikeTheFullRow) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(9);
  const int vocab = 5000, rows = 4;
  for (const auto& sp : {flashlite::engine::SamplingParams{0.8f, 50, 1.0f, 1}, flashlite::engine::SamplingParams{1.3f, 300, 0.9f, 2},
                         flashlite::engine::SamplingParams{0.0f, 5, 1.0f, 3}}) {
    const std::vector<float> logits = tied_logits(rows, vocab, rng);
    std::vector<float> values;
    std::vector<int32_t> ids;
    dt::top_k_rows(logits, rows, vocab, sp.top_k, values, ids);
    for (int r = 0; r < rows; ++r) {
      Sampler full(sp, r), cand(sp, r);
      for (int draw = 0; draw < 200; ++draw) {
        ASSERT_EQ(cand.sample_top_k(values.data() + size_t(r) * sp.top_k, ids.data() + size_t(r) * sp.top_k, sp.top_k),
                  full.sample(logits.data() + size_t(r) * vocab, vocab))
            << "row " << r << " draw " << draw;
      }
    }
  }
}

TEST(EngineCudaOps, GemvBandwidth) {
  DEVICE_OR_SKIP();
  struct Shape {
    const char* name;
    ops::GemvIn in;
    ops::GemvOut epi;
    int out, k, weight_rows;
  };
  const Shape shapes[] = {{"qkv", ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 3072, 2048, 3072},
                          {"o", ops::GemvIn::bf16, ops::GemvOut::add_f32, 2048, 2048, 2048},
                          {"gate/up+swiglu", ops::GemvIn::rmsnorm, ops::GemvOut::swiglu_bf16, 8192, 2048, 16384},
                          {"down", ops::GemvIn::bf16, ops::GemvOut::add_f32, 2048, 8192, 2048},
                          {"lm head", ops::GemvIn::rmsnorm, ops::GemvOut::f32, 128256, 2048, 128256}};
  for (int rows : {1, 2, 4, 8}) {
    for (const Shape& s : shapes) {
      ops::GemvParams p;
      p.in = s.in;
      p.epi = s.epi;
      p.rows = rows;
      p.out = s.out;
      p.k = s.k;
      p.eps = 1e-5f;
      const double us = dt::gemv_time_us(p, 20);
      const double bytes = double(s.weight_rows) * s.k * 2;
      std::printf("gemv %-15s rows %d: %8.1f us  %7.1f GB/s of weights (%.1f MB)\n", s.name, rows, us, bytes / us / 1e3,
                  bytes / 1e6);
    }
  }
}

}  // namespace
