// AVX2 + FMA matmul block: 4 weight rows x 2 activation rows of 8-wide accumulators (8 of the 16 ymm registers),
// so each weight vector loaded is used twice and each activation vector four times. Tails use masked loads.
#include <immintrin.h>

#include "engine/cpu/kernels.h"

namespace flashlite::engine::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane mask for the last `rem` (1..7) elements.
inline __m256i tail_mask(int rem) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - rem));
}

template <int R, int X>
inline void block(const float* const* w, const float* const* x, float* const* y, int n, int yoff) {
  __m256 acc[X][R];
  for (int j = 0; j < X; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + i);
    for (int j = 0; j < X; ++j) {
      const __m256 xv = _mm256_loadu_ps(x[j] + i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);
    }
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_maskload_ps(w[r] + i, m);
    for (int j = 0; j < X; ++j) {
      const __m256 xv = _mm256_maskload_ps(x[j] + i, m);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);
    }
  }
  for (int j = 0; j < X; ++j)
    for (int r = 0; r < R; ++r) y[j][yoff + r] = hsum(acc[j][r]);
}

}  // namespace

void matmul_block_avx2(const MatmulArgs& a, int o0, int o1) {
  const int n = a.in;
  int r = 0;
  for (; r + 2 <= a.rows; r += 2) {
    const float* x[2] = {a.x + r * a.ldx, a.x + (r + 1) * a.ldx};
    float* y[2] = {a.y + r * a.ldy, a.y + (r + 1) * a.ldy};
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
      const float* w[4] = {a.w + int64_t(o) * n, a.w + int64_t(o + 1) * n, a.w + int64_t(o + 2) * n, a.w + int64_t(o + 3) * n};
      block<4, 2>(w, x, y, n, o);
    }
    for (; o < o1; ++o) {
      const float* w[1] = {a.w + int64_t(o) * n};
      block<1, 2>(w, x, y, n, o);
    }
  }
  for (; r < a.rows; ++r) {
    const float* x[1] = {a.x + r * a.ldx};
    float* y[1] = {a.y + r * a.ldy};
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
      const float* w[4] = {a.w + int64_t(o) * n, a.w + int64_t(o + 1) * n, a.w + int64_t(o + 2) * n, a.w + int64_t(o + 3) * n};
      block<4, 1>(w, x, y, n, o);
    }
    for (; o < o1; ++o) {
      const float* w[1] = {a.w + int64_t(o) * n};
      block<1, 1>(w, x, y, n, o);
    }
  }
}

}  // namespace flashlite::engine::cpu
