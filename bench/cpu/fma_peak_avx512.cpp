// fp32 FMA peak, AVX-512 (compiled with -mavx512f): 12 independent 16-wide chains per thread, enough for two FMA
// ports of latency 4-6.
// GCC 12 false positives in avx512fintrin.h (_mm512_undefined_*, bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <omp.h>

#include "fma_peak.h"

double fma_peak_avx512_flops(int64_t iters) {
  constexpr int kChains = 12;
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m512 acc[kChains];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i + omp_get_thread_num()));
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
    __m512 s = acc[0];
    for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
    total += double(iters) * kChains * 16 * 2 + (_mm512_reduce_add_ps(s) == 12345.f ? 1 : 0);
  }
  return total;
}
