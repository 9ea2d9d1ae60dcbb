// The engine's CPU kernels against float64 loops: matmul (portable and AVX2 blocks, threaded split) over odd shapes
// that hit every register-block tail; RMSNorm and SwiGLU. Outputs are NaN-poisoned so an unwritten element fails.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/cpu/kernels.h"

namespace {

namespace cpu = flashlite::engine::cpu;

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct Shape {
  int rows, in, out;
};

class Matmul : public ::testing::TestWithParam<Shape> {};

TEST_P(Matmul, MatchesFloat64) {
  const Shape s = GetParam();
  std::mt19937 rng(s.rows * 1000 + s.in * 10 + s.out);
  const int ldx = s.in + 3, ldy = s.out + 5;  // strided rows
  const std::vector<float> x = randn(size_t(s.rows) * ldx, rng), w = randn(size_t(s.out) * s.in, rng);
  std::vector<double> want(size_t(s.rows) * s.out);
  for (int r = 0; r < s.rows; ++r)
    for (int o = 0; o < s.out; ++o) {
      double acc = 0;
      for (int i = 0; i < s.in; ++i) acc += double(x[size_t(r) * ldx + i]) * w[size_t(o) * s.in + i];
      want[size_t(r) * s.out + o] = acc;
    }
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (int variant = 0; variant < 3; ++variant) {
    if (variant == 1 && !avx2) continue;
    std::vector<float> y(size_t(s.rows) * ldy, NAN);
    cpu::MatmulArgs a{y.data(), x.data(), w.data(), s.rows, s.in, s.out, ldx, ldy, 2};
    if (variant == 0) cpu::matmul_block_portable(a, 0, s.out);
    if (variant == 1) cpu::matmul_block_avx2(a, 0, s.out);
    if (variant == 2) cpu::matmul(a);  // dispatch + threads
    double worst = 0;
    for (int r = 0; r < s.rows; ++r)
      for (int o = 0; o < s.out; ++o) {
        const double g = y[size_t(r) * ldy + o], e = want[size_t(r) * s.out + o];
        worst = std::max(worst, std::isfinite(g) ? std::abs(g - e) / (1 + std::abs(e)) : INFINITY);
      }
    EXPECT_LT(worst, 1e-5 * std::sqrt(double(s.in))) << "variant " << variant;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Matmul,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 7, 3}, Shape{1, 64, 512}, Shape{1, 172, 64},
                                           Shape{1, 64, 13}, Shape{2, 9, 9}, Shape{3, 64, 344}, Shape{5, 17, 31},
                                           Shape{7, 256, 1030}, Shape{16, 2048, 256}, Shape{1, 4096, 300}, Shape{70, 33, 20},
                                           Shape{130, 256, 96}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" + std::to_string(info.param.in) + "x" +
                                  std::to_string(info.param.out);
                         });

TEST(Kernels, RmsNormAndSwiGlu) {
  std::mt19937 rng(3);
  for (int n : {1, 7, 64, 173}) {
    const std::vector<float> x = randn(n, rng), w = randn(n, rng), up = randn(n, rng);
    std::vector<float> y(n, NAN), h(n, NAN);
    cpu::rmsnorm(y.data(), x.data(), w.data(), n, 1e-5f);
    cpu::swiglu(h.data(), x.data(), up.data(), n);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1 / std::sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * (1 + std::abs(x[i] * inv * w[i])));
      const double g = x[i];
      EXPECT_NEAR(h[i], g / (1 + std::exp(-g)) * up[i], 1e-5 * (1 + std::abs(g * up[i])));
    }
  }
}

}  // namespace
