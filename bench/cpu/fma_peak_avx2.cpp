// fp32 FMA peak, AVX2 + FMA (compiled with -mavx2 -mfma): 10 independent 8-wide chains per thread, enough for two
// FMA pipes of latency 5.
#include <immintrin.h>
#include <omp.h>

#include "fma_peak.h"

double fma_peak_avx2_flops(int64_t iters) {
  constexpr int kChains = 10;
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m256 acc[kChains];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(float(i + omp_get_thread_num()));
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    }
    __m256 s = acc[0];
    for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    total += double(iters) * kChains * 8 * 2 + (out[0] == 12345.f ? 1 : 0);  // the sum keeps the chains alive
  }
  return total;
}
