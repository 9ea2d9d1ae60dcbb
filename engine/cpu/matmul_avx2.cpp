// AVX2 + FMA matmul blocks (y = x W^T). Every output is a dot product of two contiguous rows, so the work is
// register blocking plus cheap horizontal sums:
//  - decode (one activation row): 8 weight rows at once, 8 independent FMA chains (more than the FMA latency), and one
//    transposing hadd tree that turns the 8 accumulators into 8 outputs with a single store;
//  - prefill (several activation rows): 4 weight rows x 2 activation rows, so each weight vector loaded serves twice.
// Row tails (in % 8) use masked loads, so any in_features works (stories260K's hidden size is 172).
#include <immintrin.h>

#include "engine/cpu/kernels.h"

namespace flashlite::engine::cpu {

namespace {

inline __m256i tail_mask(int rem) {  // lanes [0, rem) on, rem in 1..7
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - rem));
}

// [sum(a[0]), ..., sum(a[7])] in one vector.
inline __m256 hsum8(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// [sum(a[0]), ..., sum(a[3])].
inline __m128 hsum4(const __m256* a) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

inline float hsum1(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc[j][r] += w[r] . x[j] over n elements.
template <int R, int X>
inline void dot_block(const float* w, int64_t ldw, const float* const* x, int n, __m256 (&acc)[X][R]) {
  for (int j = 0; j < X; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + r * ldw + i);
    for (int j = 0; j < X; ++j) {
      const __m256 xv = _mm256_loadu_ps(x[j] + i);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);
    }
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_maskload_ps(w + r * ldw + i, m);
    for (int j = 0; j < X; ++j) {
      const __m256 xv = _mm256_maskload_ps(x[j] + i, m);
      for (int r = 0; r < R; ++r) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);
    }
  }
}

}  // namespace

void matmul_block_avx2(const MatmulArgs& a, int o0, int o1) {
  const int n = a.in;
  int r = 0;
  for (; r + 2 <= a.rows; r += 2) {
    const float* x[2] = {a.x + r * a.ldx, a.x + (r + 1) * a.ldx};
    float* y0 = a.y + r * a.ldy;
    float* y1 = a.y + (r + 1) * a.ldy;
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
      __m256 acc[2][4];
      dot_block<4, 2>(a.w + int64_t(o) * n, n, x, n, acc);
      _mm_storeu_ps(y0 + o, hsum4(acc[0]));
      _mm_storeu_ps(y1 + o, hsum4(acc[1]));
    }
    for (; o < o1; ++o) {
      __m256 acc[2][1];
      dot_block<1, 2>(a.w + int64_t(o) * n, n, x, n, acc);
      y0[o] = hsum1(acc[0][0]);
      y1[o] = hsum1(acc[1][0]);
    }
  }
  for (; r < a.rows; ++r) {
    const float* x[1] = {a.x + r * a.ldx};
    float* y = a.y + r * a.ldy;
    int o = o0;
    for (; o + 8 <= o1; o += 8) {
      __m256 acc[1][8];
      dot_block<8, 1>(a.w + int64_t(o) * n, n, x, n, acc);
      _mm256_storeu_ps(y + o, hsum8(acc[0]));
    }
    for (; o + 4 <= o1; o += 4) {
      __m256 acc[1][4];
      dot_block<4, 1>(a.w + int64_t(o) * n, n, x, n, acc);
      _mm_storeu_ps(y + o, hsum4(acc[0]));
    }
    for (; o < o1; ++o) {
      __m256 acc[1][1];
      dot_block<1, 1>(a.w + int64_t(o) * n, n, x, n, acc);
      y[o] = hsum1(acc[0][0]);
    }
  }
}

}  // namespace flashlite::engine::cpu
