// fp32 multiply-add peak for CPUs without AVX2: 12 independent 4-wide chains per thread (vector extensions; the
// baseline target has no FMA, so each step is a multiply and an add: 2 flops per lane all the same).
#include <omp.h>

#include "fma_peak.h"

double fma_peak_portable_flops(int64_t iters) {
  typedef float v4 __attribute__((vector_size(16)));
  constexpr int kChains = 12;
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    v4 acc[kChains];
    const v4 x = v4{} + 0.999999f, y = v4{} + 1e-7f;
    for (int i = 0; i < kChains; ++i) acc[i] = v4{} + float(i + omp_get_thread_num());
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
      for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * x + y;
    }
    v4 s = acc[0];
    for (int i = 1; i < kChains; ++i) s += acc[i];
    total += double(iters) * kChains * 4 * 2 + (s[0] == 12345.f ? 1 : 0);
  }
  return total;
}
