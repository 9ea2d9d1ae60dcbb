// The tiled kernel's hot loops for AVX-512 (F, BW, VL, DQ) + FMA + F16C (compiled with those flags, see
// src/CMakeLists.txt; called only after a runtime CPU check in tiled.cpp). An 8 x 32 register block: 16 of the 32
// registers accumulate, enough for two FMA ports.
// GCC 12's AVX-512 headers trip a false -Wmaybe-uninitialized on _mm512_undefined_* (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "cpu/tiled_simd.h"

namespace flashlite::cpu_tiled {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int width = 16, mr = 8, nv = 2;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg select_lt(reg x, reg t, reg a, reg b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, t, _CMP_LT_OQ), b, a); }
  static reg round(reg x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static reg load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static reg load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
};

constexpr TiledKernels kKernels = TiledSimd<Avx512>::table("avx512");

}  // namespace

const TiledKernels& kernels_avx512() { return kKernels; }

}  // namespace flashlite::cpu_tiled
