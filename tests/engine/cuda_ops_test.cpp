// The engine's decode-step CUDA kernels against host references: the fused GEMVs (RMSNorm prologue; bf16, fp32,
// residual-add and SwiGLU epilogues) against float64 dot products of the same bf16-rounded operands, at odd sizes;
// the device argmax and top-k against the host sampler's rules, ties included. The GEMV's split-K and grid choices,
// back-to-back launches, and its fused RoPE + cache append and fused argmax epilogues against the same float64
// references and against the unfused path. Built only with CUDA; skips without a device. (The GEMV times at the
// Llama-3.2-1B shapes: bench/engine/gemv_bench.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "engine/cuda_ops/gemm.h"
#include "engine/cuda_ops/select.h"
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

// p with the case's sizes and epilogue (its modes as given).
ops::GemvParams shaped(const Case& c, ops::GemvParams p = {}) {
  p.in = c.in;
  p.epi = c.epi;
  p.rows = c.rows;
  p.out = c.out;
  p.k = c.k;
  return p;
}

// "in I epi E rows R out O k K", the start of a case's trace.
std::string case_name(const Case& c) {
  return "in " + std::to_string(int(c.in)) + " epi " + std::to_string(int(c.epi)) + " rows " + std::to_string(c.rows) +
         " out " + std::to_string(c.out) + " k " + std::to_string(c.k);
}

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

// One case on random data through dt::gemv (p: its modes; sizes and epilogue from c), `launches` times back to back
// (an accumulating epilogue adds each; optionally on a created stream), against the float64 reference: every element
// written, finite and within the tolerance. Returns the worst error / tolerance.
double expect_gemv_matches(const Case& c, ops::GemvParams p, std::mt19937& rng, int stream_rows,
                           const std::vector<int32_t>& ri, int launches = 1, bool own_stream = false) {
  const int wrows = c.epi == ops::GemvOut::swiglu_bf16 ? 2 * c.out : c.out;
  const auto w = random_vec(size_t(wrows) * c.k, rng, -0.1f, 0.1f);
  const auto x = random_vec(size_t(c.rows) * c.k, rng);
  const auto xf = random_vec(size_t(stream_rows) * c.k, rng, -3.f, 3.f);
  const auto g = random_vec(c.k, rng, 0.5f, 1.5f);
  std::vector<float> y = random_vec(size_t(c.rows) * c.out, rng, -2.f, 2.f);
  const std::vector<float> y0 = y;
  p = shaped(c, p);
  p.eps = 1e-5f;
  dt::gemv(p, w, x, xf, g, ri, y, launches, own_stream);
  std::vector<double> want = reference(c, w, x, xf, g, ri, y0);
  if (c.epi == ops::GemvOut::add_f32)
    for (size_t i = 0; i < want.size(); ++i) want[i] = y0[i] + launches * (want[i] - y0[i]);
  double rms = 0;
  for (double v : want) rms += v * v;
  rms = std::sqrt(rms / want.size());
  const bool b16 = c.epi == ops::GemvOut::bf16 || c.epi == ops::GemvOut::swiglu_bf16;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << "element " << i << " unwritten or not finite";
    // bf16 outputs: one rounding (2^-9 relative) plus accumulation order; fp32: accumulation order and the rare
    // one-ulp difference of a staged bf16 input.
    const double tol = b16 ? 5e-3 * std::abs(want[i]) + 2e-3 * rms : 1e-3 * rms + 1e-5 * std::abs(want[i]);
    worst = std::max(worst, std::abs(y[i] - want[i]) / tol);
    if (!(std::abs(y[i] - want[i]) <= tol)) {
      ADD_FAILURE() << "element " << i << " got " << y[i] << " want " << want[i];
      break;
    }
  }
  return worst;
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
  // Split-K (warps per row) and the grid (0: one resident wave; a block per tile, as the engine's one-row gate/up and
  // LM head; a few looping blocks).
  struct Variant {
    int split;
    int grid = 0;
  };
  const std::vector<Variant> variants = {{1}, {2}, {4}, {8}, {1, ops::kGemvBlockPerTile}, {1, 3},
                                         {2, ops::kGemvBlockPerTile}, {2, 3}};
  std::vector<Case> all = cases;
  // Odd sizes for the split: fewer chunks than warps x lanes, a slice boundary inside a batch, one output row.
  all.push_back({ops::GemvIn::bf16, ops::GemvOut::add_f32, 2, 1, 1032, false});
  all.push_back({ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 4, 33, 8200, false});
  all.push_back({ops::GemvIn::rmsnorm, ops::GemvOut::f32, 1, 77, 4104, true});
  for (const Variant& v : variants) {
    for (const Case& c : all) {
      SCOPED_TRACE(case_name(c) + " split " + std::to_string(v.split) + " grid " + std::to_string(v.grid));
      const int stream_rows = c.row_index ? c.rows + 3 : c.rows;
      std::vector<int32_t> ri;
      if (c.row_index)
        for (int r = 0; r < c.rows; ++r) ri.push_back((r * 5 + 2) % stream_rows);
      ops::GemvParams p;
      p.split = v.split;
      p.grid_blocks = v.grid;
      const double worst = expect_gemv_matches(c, p, rng, stream_rows, ri);
      std::printf("gemv in %d epi %d rows %d out %d k %d split %d grid %d: worst error / tolerance %.3f\n", int(c.in),
                  int(c.epi), c.rows, c.out, c.k, v.split, v.grid, worst);
    }
  }
}

// Launches back to back, each a programmatic dependent of the one before (sm_90): the residual-adding epilogue adds
// every launch's sums (the next may start before the last ends and must wait for it), on the legacy default stream
// and on a created one, with and without PDL; the other epilogues write the same values again.
TEST(EngineCudaOps, BackToBackGemvLaunchesMatchFloat64) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(23);
  const std::vector<Case> cases = {
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 1, 2048, 2048, false},
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 1, 257, 8448, false},
      {ops::GemvIn::bf16, ops::GemvOut::add_f32, 2, 130, 2048, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::bf16, 1, 3072, 2048, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::swiglu_bf16, 1, 8192, 2048, false},
      {ops::GemvIn::rmsnorm, ops::GemvOut::f32, 1, 77, 2048, true},
  };
  for (const bool pdl : {true, false}) {
    for (const bool own_stream : {false, true}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(case_name(c) + (pdl ? " pdl" : " no pdl") + (own_stream ? " on a created stream" : ""));
        const int stream_rows = c.row_index ? 4 : c.rows;
        std::vector<int32_t> ri;
        if (c.row_index) ri.push_back(2);
        ops::GemvParams p;
        p.split = c.epi == ops::GemvOut::add_f32 ? ops::gemv_auto_split(c.out, c.k) : 1;
        p.pdl = pdl;
        const double worst = expect_gemv_matches(c, p, rng, stream_rows, ri, 3, own_stream);
        std::printf("gemv in %d epi %d out %d k %d pdl %d, 3 launches: worst error / tolerance %.3f\n", int(c.in),
                    int(c.epi), c.out, c.k, int(pdl), worst);
      }
    }
  }
}

// RoPE tables as the library computes them (float64 angles rounded once), theta 10000: the float64 reference's.
void rope_tables(int positions, int head_dim, std::vector<float>& cs, std::vector<float>& sn) {
  const int half = head_dim / 2;
  cs.resize(size_t(positions) * half);
  sn.resize(cs.size());
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < half; ++i) {
      const double inv = std::pow(10000.0, -2.0 * i / head_dim);
      cs[size_t(p) * half + i] = float(std::cos(p * inv));
      sn[size_t(p) * half + i] = float(std::sin(p * inv));
    }
}

// The QKV GEMV with RoPE + cache append in its epilogue: against float64 (the projection rounded to bf16 as the
// unfused path stores it, then rotated) and against the unfused path (gemv, then the library's flashlite::append_kv
// into a flashlite KV cache) on the same inputs, so the epilogue writes the library's cache and rotates with its RoPE;
// poisoned outputs, so an unwritten element or cache row shows.
TEST(EngineCudaOps, FusedRopeAppendMatchesUnfusedAndFloat64) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(17);
  struct RCase {
    int heads, kv_heads, head_dim;
    bool interleaved;
    int rows, k;
  };
  const std::vector<RCase> cases = {{4, 2, 64, false, 1, 264},  {3, 1, 16, true, 3, 136},   {2, 2, 8, false, 8, 520},
                                    {5, 1, 32, true, 2, 64},    {32, 8, 64, false, 1, 2048}, {6, 3, 24, false, 5, 8},
                                    {32, 8, 64, true, 1, 2048}, {8, 2, 128, false, 1, 4096}, {6, 3, 96, false, 1, 768},
                                    {3, 1, 16, true, 1, 256},   {2, 2, 8, false, 1, 8192}};
  for (const RCase& rc : cases) {
    SCOPED_TRACE("heads " + std::to_string(rc.heads) + "/" + std::to_string(rc.kv_heads) + " D " +
                 std::to_string(rc.head_dim) + (rc.interleaved ? " interleaved" : " half-split") + " rows " +
                 std::to_string(rc.rows) + " k " + std::to_string(rc.k));
    const int D = rc.head_dim, half = D / 2, kvd = rc.kv_heads * D, out = (rc.heads + 2 * rc.kv_heads) * D;
    const int positions = 300, cache_rows = rc.rows * positions;
    const auto w = random_vec(size_t(out) * rc.k, rng, -0.1f, 0.1f);
    const auto xf = random_vec(size_t(rc.rows) * rc.k, rng, -3.f, 3.f);
    const auto g = random_vec(rc.k, rng, 0.5f, 1.5f);
    std::vector<float> cs, sn;
    rope_tables(positions, D, cs, sn);
    std::vector<int32_t> pos;
    std::vector<int64_t> cache_row;  // activation row r: sequence r of the cache, its token at position pos[r]
    for (int r = 0; r < rc.rows; ++r) {
      pos.push_back(int32_t((r * 97 + 13) % positions));
      cache_row.push_back(int64_t(r) * positions + pos[r]);
    }
    ops::GemvParams p;
    p.rows = rc.rows;
    p.out = out;
    p.k = rc.k;
    p.eps = 1e-5f;
    p.rope.heads = rc.heads;
    p.rope.kv_heads = rc.kv_heads;
    p.rope.head_dim = D;
    p.rope.interleaved = rc.interleaved;
    std::vector<float> y1, k1, v1, y0, k0, v0;
    dt::gemv_rope(p, true, w, xf, g, 10000.0, positions, pos, y1, k1, v1);
    dt::gemv_rope(p, false, w, xf, g, 10000.0, positions, pos, y0, k0, v0);
    // float64: the projection, then the rotation. The kernels round the projection to bf16 before rotating (<= 2^-8
    // of each input) and the result once more (<= 2^-8 of it): the tolerance is those bounds plus accumulation order.
    const Case c{ops::GemvIn::rmsnorm, ops::GemvOut::bf16, rc.rows, out, rc.k, false};
    const std::vector<double> proj = reference(c, w, {}, xf, g, {}, {});
    double rms = 0;
    for (double v : proj) rms += v * v;
    rms = std::sqrt(rms / proj.size());
    int exact = 0, compared = 0;
    auto expect_close = [&](float got, float unfused, double want, double inputs, const char* what, int r, int col) {
      ASSERT_TRUE(std::isfinite(got)) << what << " row " << r << " column " << col << " unwritten";
      const double tol = 4.5e-3 * inputs + 5e-3 * std::abs(want) + 1e-3 * rms;
      ASSERT_LE(std::abs(got - want), tol) << what << " row " << r << " column " << col << " got " << got << " want " << want;
      // Fused and unfused round the same fp32 values: equal, or one bf16 step apart where the compiler contracted
      // the rotation's multiply-add differently.
      ASSERT_LE(std::abs(got - unfused), std::ldexp(std::max(std::abs(got), std::abs(unfused)), -7))
          << what << " row " << r << " column " << col << " fused " << got << " unfused " << unfused;
      exact += got == unfused;
      ++compared;
    };
    for (int r = 0; r < rc.rows; ++r) {
      auto yb = [&](int col) { return proj[size_t(r) * out + col]; };
      for (int h = 0; h < rc.heads + 2 * rc.kv_heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const int a = rc.interleaved ? 2 * i : i, b = rc.interleaved ? 2 * i + 1 : i + half;
          const double cv = cs[size_t(pos[r]) * half + i], sv = sn[size_t(pos[r]) * half + i];
          const double x0 = yb(h * D + a), x1 = yb(h * D + b);
          double y0v = x0 * cv - x1 * sv, y1v = x0 * sv + x1 * cv;
          double in0 = std::abs(x0 * cv) + std::abs(x1 * sv), in1 = std::abs(x0 * sv) + std::abs(x1 * cv);
          if (h >= rc.heads + rc.kv_heads) {  // v: as projected
            y0v = x0;
            y1v = x1;
            in0 = in1 = 0;
          }
          for (int e = 0; e < 2; ++e) {
            const int d = e ? b : a;
            const double want = e ? y1v : y0v, in = e ? in1 : in0;
            if (h < rc.heads) {
              expect_close(y1[size_t(r) * out + h * D + d], y0[size_t(r) * out + h * D + d], want, in, "q", r, h * D + d);
            } else if (h < rc.heads + rc.kv_heads) {
              const size_t at = size_t(cache_row[r]) * kvd + (h - rc.heads) * D + d;
              expect_close(k1[at], k0[at], want, in, "k cache", r, (h - rc.heads) * D + d);
            } else {
              const size_t at = size_t(cache_row[r]) * kvd + (h - rc.heads - rc.kv_heads) * D + d;
              expect_close(v1[at], v0[at], want, in, "v cache", r, (h - rc.heads - rc.kv_heads) * D + d);
            }
          }
        }
      }
    }
    // Cache rows no sequence owns stay poisoned.
    for (int row = 0; row < cache_rows; ++row) {
      if (std::find(cache_row.begin(), cache_row.end(), int64_t(row)) != cache_row.end()) continue;
      for (int i = 0; i < kvd; ++i) {
        ASSERT_TRUE(std::isnan(k1[size_t(row) * kvd + i])) << "k cache row " << row << " written";
        ASSERT_TRUE(std::isnan(v1[size_t(row) * kvd + i])) << "v cache row " << row << " written";
      }
    }
    std::printf("fused rope+append heads %d/%d D %d %s rows %d k %d: %d/%d values bit-equal to the unfused path\n",
                rc.heads, rc.kv_heads, D, rc.interleaved ? "interleaved" : "half-split", rc.rows, rc.k, exact, compared);
  }
}

// The LM-head GEMV with the argmax folded into its epilogue: logits against float64, the ids against the host
// argmax of the same logits (ties included: identical weight rows give identical logits; the lowest index wins).
TEST(EngineCudaOps, FusedArgmaxIsTheHostArgmaxOfItsLogits) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(23);
  struct ACase {
    int rows, out, k;
    bool row_index, tie;
  };
  const std::vector<ACase> cases = {{1, 1001, 64, false, false}, {3, 5003, 136, true, true}, {8, 257, 8, true, true},
                                    {1, 128256, 64, false, true}, {2, 1, 264, false, false}, {5, 40000, 24, false, false}};
  // Each case in one resident wave (0) and as a block per tile (the engine's one-row LM head).
  for (const int grid : {0, ops::kGemvBlockPerTile})
  for (const ACase& ac : cases) {
    SCOPED_TRACE("rows " + std::to_string(ac.rows) + " out " + std::to_string(ac.out) + " k " + std::to_string(ac.k) +
                 " grid " + std::to_string(grid));
    const int stream_rows = ac.row_index ? ac.rows + 3 : ac.rows;
    auto w = random_vec(size_t(ac.out) * ac.k, rng, -0.1f, 0.1f);
    // Positive activations (positive stream and norm weights) so an all-0.1 row is the maximum; three copies of it
    // tie exactly (same bits, same summation order).
    const auto xf = random_vec(size_t(stream_rows) * ac.k, rng, ac.tie ? 0.5f : -3.f, 3.f);
    const auto g = random_vec(ac.k, rng, 0.5f, 1.5f);
    if (ac.tie && ac.out > 10)
      for (int row : {ac.out / 3, ac.out / 2, ac.out - 1})
        for (int i = 0; i < ac.k; ++i) w[size_t(row) * ac.k + i] = 0.1f;
    std::vector<int32_t> ri;
    if (ac.row_index)
      for (int r = 0; r < ac.rows; ++r) ri.push_back((r * 5 + 2) % stream_rows);
    ops::GemvParams p;
    p.rows = ac.rows;
    p.out = ac.out;
    p.k = ac.k;
    p.eps = 1e-5f;
    p.grid_blocks = grid;
    std::vector<float> y;
    const std::vector<int32_t> ids = dt::gemv_argmax(p, w, xf, g, ri, y);
    const Case c{ops::GemvIn::rmsnorm, ops::GemvOut::f32, ac.rows, ac.out, ac.k, ac.row_index};
    const std::vector<double> want = reference(c, w, {}, xf, g, ri, {});
    double rms = 0;
    for (double v : want) rms += v * v;
    rms = std::sqrt(rms / want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << "logit " << i << " unwritten";
      ASSERT_LE(std::abs(y[i] - want[i]), 1e-3 * rms + 1e-5 * std::abs(want[i])) << "logit " << i;
    }
    for (int r = 0; r < ac.rows; ++r) {
      const int host = flashlite::engine::argmax(y.data() + size_t(r) * ac.out, ac.out);
      EXPECT_EQ(ids[r], host) << "row " << r;
      if (ac.tie && ac.out > 10) {
        EXPECT_EQ(ids[r], ac.out / 3) << "row " << r << ": the first of the tied rows";
      }
    }
  }
}

// The prefill GEMM (cuBLASLt) at every row count from 17 to 130, up and then down on one plan cache: row counts past
// 16 take their power-of-two bucket's algorithm where it fits (gemm.cpp), whichever came first. Each result against
// float64 dot products of the same rounded operands, the two passes within the same bound of each other.
TEST(EngineCudaOps, GemmRowBucketsMatchFloat64InAnyOrder) {
  DEVICE_OR_SKIP();
  const int in = 2048 + 64, out = 192, max_rows = 130;  // `in` long enough for cuBLASLt to consider split-K
  std::mt19937 rng(11);
  for (const bool use_bf16 : {true, false}) {
    SCOPED_TRACE(use_bf16 ? "bf16" : "fp32");
    std::vector<float> w = random_vec(size_t(out) * in, rng), x = random_vec(size_t(max_rows) * in, rng);
    if (use_bf16) {
      for (float& v : w) v = bf16(v);
      for (float& v : x) v = bf16(v);
    }
    std::vector<int> order;
    for (int r = 17; r <= max_rows; ++r) order.push_back(r);
    for (int r = max_rows; r >= 17; --r) order.push_back(r);
    std::vector<double> ref(size_t(max_rows) * out), mag(ref.size());  // a row's result depends on its row only
    for (int r = 0; r < max_rows; ++r)
      for (int o = 0; o < out; ++o)
        for (int k = 0; k < in; ++k) {
          const double p = double(x[size_t(r) * in + k]) * w[size_t(o) * in + k];
          ref[size_t(r) * out + o] += p;
          mag[size_t(r) * out + o] += std::fabs(p);
        }
    const auto ys = dt::gemm_sequence(order, in, out, use_bf16, w, x);
    ASSERT_EQ(ys.size(), order.size());
    for (size_t c = 0; c < order.size(); ++c) {
      const int rows = order[c];
      for (size_t i = 0; i < size_t(rows) * out; ++i) {
        ASSERT_NEAR(ys[c][i], ref[i], 2e-5 * mag[i] + 1e-6) << "rows " << rows << " (call " << c << "), element " << i;
      }
    }
  }
}

// The row counts a server warms: every count up to 16 from `from`, then one per bucket (gemm.cpp) that holds a count
// in range, the last one cut at max_rows (no device needed).
TEST(EngineCudaOps, GemmSearchRowsCoverEveryBucketOnce) {
  using V = std::vector<int>;
  EXPECT_EQ(ops::Gemm::search_rows(9, 100), (V{9, 10, 11, 12, 13, 14, 15, 16, 32, 64, 100}));
  EXPECT_EQ(ops::Gemm::search_rows(1, 8), (V{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(ops::Gemm::search_rows(20, 1000), (V{32, 64, 128, 192, 256, 320, 384, 448, 512, 1000}));
  EXPECT_EQ(ops::Gemm::search_rows(150, 200), (V{192, 200}));
  EXPECT_EQ(ops::Gemm::search_rows(40, 64), (V{64}));
  EXPECT_EQ(ops::Gemm::search_rows(9, 8), V{});
}

TEST(EngineCudaOps, GemvRejectsUnsupportedSizes) {
  for (const bool staged : {false, true}) {
    EXPECT_FALSE(ops::gemv_supported(0, 64, staged));
    EXPECT_FALSE(ops::gemv_supported(ops::kGemvMaxRows + 1, 64, staged));
    EXPECT_FALSE(ops::gemv_supported(1, 100, staged));  // not a multiple of 8
    EXPECT_TRUE(ops::gemv_supported(1, 2048, staged));
    EXPECT_TRUE(ops::gemv_supported(8, 4096, staged));  // 64 KB staged: within every device's shared memory
  }
  // Only a staged (RMSNorm) input is bounded by shared memory: 8 rows of k = 2^16 are 1 MB of bf16.
  EXPECT_TRUE(ops::gemv_supported(8, 1 << 16, false));
  EXPECT_FALSE(ops::gemv_supported(8, 1 << 16, true));
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

// Rows the host sampler refuses (a NaN or +inf logit, or every logit -inf) are recognisable from their argmax keys,
// so the engine's greedy path refuses them too instead of choosing among the finite logits: a NaN (either sign) ranks
// above +inf, the first NaN wins; the fused LM-head argmax (a weight row of NaN) shows the same.
TEST(EngineCudaOps, ArgmaxKeysShowTheRowsTheSamplerRefuses) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(31);
  const int vocab = 1001, rows = 6;
  std::vector<float> l = random_vec(size_t(rows) * vocab, rng, -20.f, 20.f);
  auto at = [&](int r, int i) -> float& { return l[size_t(r) * vocab + i]; };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  at(1, 17) = nan;
  at(2, 900) = nan;
  at(2, 5) = -nan;
  at(3, 300) = inf;
  for (int i = 0; i < vocab; ++i) at(4, i) = -inf;
  at(5, 40) = inf;
  at(5, 600) = nan;
  const std::vector<uint64_t> keys = dt::argmax_keys(l, rows, vocab);
  const struct {
    int index;
    const char* problem;  // empty: a row the sampler takes
  } want[rows] = {{flashlite::engine::argmax(l.data(), vocab), ""},
                  {17, "logit 17 is NaN"}, {5, "logit 5 is NaN"}, {300, "logit 300 is +inf"},
                  {0, "every logit is -inf"}, {600, "logit 600 is NaN"}};
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    EXPECT_EQ(ops::argmax_key_index(keys[r]), want[r].index);
    // The key's value (a tensor-parallel rank's best candidate): the logit itself, NaN for a NaN.
    const float v = l[size_t(r) * vocab + want[r].index];
    if (v != v) {
      EXPECT_TRUE(std::isnan(ops::argmax_key_value(keys[r])));
    } else {
      EXPECT_EQ(ops::argmax_key_value(keys[r]), v);
    }
    const std::string why = ops::argmax_key_problem(keys[r]);
    EXPECT_EQ(why.rfind(want[r].problem, 0), 0u) << "'" << why << "'";
    EXPECT_EQ(why.empty(), *want[r].problem == 0) << "'" << why << "'";
    // The host's words for the same row, word for word (row 5: the NaN at 600 is named, not the earlier +inf at 40).
    const std::string host = flashlite::engine::unsampleable(l.data() + size_t(r) * vocab, vocab, "logit");
    EXPECT_EQ(why, host);
  }
  // The LM-head GEMV's fused argmax: weight row 3 all NaN gives logit 3 NaN in every activation row.
  const int out = 77, k = 64, arows = 2;
  std::vector<float> w = random_vec(size_t(out) * k, rng, -0.1f, 0.1f);
  for (int i = 0; i < k; ++i) w[size_t(3) * k + i] = nan;
  const auto xf = random_vec(size_t(arows) * k, rng, -3.f, 3.f), g = random_vec(k, rng, 0.5f, 1.5f);
  ops::GemvParams p;
  p.rows = arows;
  p.out = out;
  p.k = k;
  p.eps = 1e-5f;
  std::vector<float> y;
  std::vector<uint64_t> fused_keys;
  const std::vector<int32_t> ids = dt::gemv_argmax(p, w, xf, g, {}, y, &fused_keys);
  for (int r = 0; r < arows; ++r) {
    EXPECT_EQ(ids[r], 3) << "row " << r;
    EXPECT_TRUE(std::isnan(ops::argmax_key_value(fused_keys[r]))) << "row " << r;
    EXPECT_EQ(ops::argmax_key_problem(fused_keys[r]).rfind("logit 3 is NaN", 0), 0u) << "row " << r;
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

}  // namespace
