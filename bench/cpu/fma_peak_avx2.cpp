// fp32 FMA peak with AVX2: independent FMA chains per thread so latency is hidden (compiled with -mavx2 -mfma).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>

double fma_peak_avx2_flops(int64_t iters) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m256 a[10];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(float(i + omp_get_thread_num()));
    for (int64_t it = 0; it < iters; ++it) {
      for (int i = 0; i < 10; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
    }
    float sink[8];
    __m256 s = a[0];
    for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, a[i]);
    _mm256_storeu_ps(sink, s);
    total += double(iters) * 10 * 8 * 2 + (sink[0] == 12345.f ? 1 : 0);
  }
  return total;
}
