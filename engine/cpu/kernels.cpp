#include "engine/cpu/kernels.h"

#include <algorithm>
#include <cmath>

namespace flashlite::engine::cpu {

namespace {

bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

const char* matmul_variant() { return have_avx2() ? "avx2" : "portable"; }

void matmul_block_portable(const MatmulArgs& a, int o0, int o1) {
  for (int r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.ldx;
    float* y = a.y + r * a.ldy;
    for (int o = o0; o < o1; ++o) {
      const float* w = a.w + int64_t(o) * a.in;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums so the compiler can vectorise without -ffast-math
      int i = 0;
      for (; i + 8 <= a.in; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += x[i + k] * w[i + k];
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < a.in; ++i) s += x[i] * w[i];
      y[o] = s;
    }
  }
}

void matmul(const MatmulArgs& a) {
  auto block = have_avx2() ? matmul_block_avx2 : matmul_block_portable;
  const int64_t work = int64_t(a.rows) * a.in * a.out;
  // Below ~256K multiply-adds a parallel region costs more than it saves (the tiny llama2.c models).
  const bool parallel = a.threads > 1 && work >= (1 << 18) && a.out >= 64;
  // Prefill: 64 activation rows at a time (64 x 2048 fp32 = 512 KB stays in L2/L3 while every weight row passes),
  // so the weights stream from memory once per 64 rows instead of once per 2.
  constexpr int kRowBlock = 64, kOutChunk = 16;
  const int tasks = (a.out + kOutChunk - 1) / kOutChunk;
  for (int r0 = 0; r0 < a.rows; r0 += kRowBlock) {
    MatmulArgs sub = a;
    sub.rows = std::min(kRowBlock, a.rows - r0);
    sub.x = a.x + int64_t(r0) * a.ldx;
    sub.y = a.y + int64_t(r0) * a.ldy;
    if (!parallel) {
      block(sub, 0, a.out);
      continue;
    }
#pragma omp parallel for num_threads(a.threads) schedule(static)
    for (int t = 0; t < tasks; ++t) block(sub, t * kOutChunk, std::min(a.out, (t + 1) * kOutChunk));
  }
}

void rmsnorm(float* y, const float* x, const float* weight, int n, float eps) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += x[i + k] * x[i + k];
  float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int j = 0; j < n; ++j) y[j] = x[j] * inv * weight[j];
}

void swiglu(float* h, const float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    h[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace flashlite::engine::cpu
