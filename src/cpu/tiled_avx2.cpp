// The tiled kernel's hot loops for AVX2 + FMA + F16C (compiled with those flags, see src/CMakeLists.txt; called only
// after a runtime CPU check in tiled.cpp). A 4 x 16 register block: 8 accumulators, enough to hide the FMA latency.
#include <immintrin.h>

#include "cpu/tiled_simd.h"

namespace flashlite::cpu_tiled {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int width = 8, mr = 4, nv = 2;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg select_lt(reg x, reg t, reg a, reg b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, t, _CMP_LT_OQ)); }
  static reg round(reg x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static reg load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static reg load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
  // Lane i = the sum of a[i]'s lanes: a transposing hadd tree, 9 instructions for 8 sums.
  static reg hsum_rows(const reg* a) {
    const reg s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    const reg s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    const reg s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
  }
};

constexpr TiledKernels kKernels = TiledSimd<Avx2>::table("avx2");

}  // namespace

const TiledKernels& kernels_avx2() { return kKernels; }

}  // namespace flashlite::cpu_tiled
