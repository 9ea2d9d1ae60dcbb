#pragma once
// The hot loops of the tiled CPU kernel (see tiled_kernels.h), written once over a small SIMD-ops struct V:
//   V::reg, V::width (floats per register), V::mr x V::nv (GEMM register block: rows x registers of columns),
//   zero set1 load store add sub mul fma(a,b,c)=a*b+c max min div round(nearest) pow2i(integral n)=2^n,
//   select_lt(x, t, a, b) = x < t ? a : b,
//   load_f16 / load_bf16 (width elements), f16_scalar.
// Instantiate it only with a V declared in an anonymous namespace: everything here is a member of a template on V,
// so each instruction set's copy has internal linkage and no code compiled for one ISA can be linked into another's
// caller. (For the same reason: no std:: algorithms here, only builtins.)
#include <cstdint>

#include "cpu/tiled_kernels.h"

namespace flashlite::cpu_tiled {

template <class V>
struct TiledSimd {
  using reg = typename V::reg;
  static constexpr int W = V::width;

  // ---- GEMM: an MR x (NV registers) block of C stays in registers for the whole k loop. Per k: NV loads of B,
  // MR broadcasts of A, MR*NV FMAs.
  template <int MR, int NV>
  static void block(const GemmArgs& g, int64_t m0, int64_t n0) {
    reg acc[MR][NV];
    float* c = g.c + m0 * g.ldc + n0;
    if (g.accumulate) {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const reg sc = V::set1(g.c_row_scale ? g.c_row_scale[m0 + r] : 1.0f);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[r][j] = V::mul(V::load(c + r * g.ldc + j * W), sc);
      }
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[r][j] = V::zero();
      }
    }
    const float* a = g.a + m0 * g.a_row;
    const float* b = g.b + n0;
    const int64_t a_row = g.a_row, a_k = g.a_k, ldb = g.ldb;
    for (int64_t k = 0; k < g.k; ++k) {
      reg bv[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * W);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const reg av = V::set1(a[r * a_row]);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[r][j] = V::fma(av, bv[j], acc[r][j]);
      }
      a += a_k;
      b += ldb;
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) V::store(c + r * g.ldc + j * W, acc[r][j]);
    }
  }

  template <int NV>
  static void column_panel(const GemmArgs& g, int64_t n0) {
    int64_t m0 = 0;
    for (; m0 + V::mr <= g.m; m0 += V::mr) block<V::mr, NV>(g, m0, n0);
    for (; m0 < g.m; ++m0) block<1, NV>(g, m0, n0);
  }

  static void gemm(const GemmArgs& g) {
    int64_t n0 = 0;
    for (; n0 + V::nv * W <= g.n; n0 += V::nv * W) column_panel<V::nv>(g, n0);
    for (; n0 < g.n; n0 += W) column_panel<1>(g, n0);
  }

  // ---- fp32 conversion of stored rows.
  static float bf16_scalar(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }

  static void convert(const ConvertArgs& a) {
    for (int64_t r = 0; r < a.rows; ++r) {
      float* dst = a.dst + r * a.ldd;
      int64_t c = 0;
      if (a.dtype == DType::f32) {
        const float* src = static_cast<const float*>(a.src) + r * a.src_row;
        for (; c + W <= a.cols; c += W) V::store(dst + c, V::load(src + c));
        for (; c < a.cols; ++c) dst[c] = src[c];
      } else if (a.dtype == DType::f16) {
        const uint16_t* src = static_cast<const uint16_t*>(a.src) + r * a.src_row;
        for (; c + W <= a.cols; c += W) V::store(dst + c, V::load_f16(src + c));
        for (; c < a.cols; ++c) dst[c] = V::f16_scalar(src[c]);
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(a.src) + r * a.src_row;
        for (; c + W <= a.cols; c += W) V::store(dst + c, V::load_bf16(src + c));
        for (; c < a.cols; ++c) dst[c] = bf16_scalar(src[c]);
      }
      for (; c < a.pad_cols; ++c) dst[c] = 0.0f;
    }
  }

  // ---- 2^x for x <= 64 (x <= -127, and -inf, give 0): x = n + f, |f| <= 1/2, 2^f by a degree-6 polynomial
  // (relative error ~1e-7, fitted for this range), 2^n through the exponent bits.
  static reg exp2(reg x) {
    x = V::max(x, V::set1(-127.0f));
    const reg n = V::round(x);
    const reg f = V::sub(x, n);
    reg p = V::set1(1.535336196e-4f);
    p = V::fma(p, f, V::set1(1.339887618e-3f));
    p = V::fma(p, f, V::set1(9.618436918e-3f));
    p = V::fma(p, f, V::set1(5.550332367e-2f));
    p = V::fma(p, f, V::set1(2.402264774e-1f));
    p = V::fma(p, f, V::set1(6.931471825e-1f));
    p = V::fma(p, f, V::set1(1.0f));
    return V::mul(p, V::pow2i(n));
  }

  // ---- The online softmax step, vectorised across query columns: every reduction runs down the key axis, so no
  // horizontal operations are needed.
  static void online_softmax(const SoftmaxArgs& a) {
    const int64_t lds = a.lds, keys = a.keys;
    const reg c2 = V::set1(a.log2_scale);
    for (int64_t nb = 0; nb < a.n; nb += W) {
      float* s = a.s + nb;
      reg mx0 = V::set1(-__builtin_inff()), mx1 = mx0;
      int64_t c = 0;
      for (; c + 2 <= keys; c += 2) {
        mx0 = V::max(mx0, V::load(s + c * lds));
        mx1 = V::max(mx1, V::load(s + (c + 1) * lds));
      }
      if (c < keys) mx0 = V::max(mx0, V::load(s + c * lds));
      const reg m_old = V::load(a.m + nb);
      const reg m_new = V::max(m_old, V::mul(V::max(mx0, mx1), c2));
      // A column with nothing visible yet keeps m = -inf; subtracting -FLT_MAX instead keeps its p and alpha at 0.
      const reg neg_m = V::sub(V::zero(), V::max(m_new, V::set1(-3.402823466e38f)));
      const reg alpha = exp2(V::add(m_old, neg_m));
      reg sum0 = V::zero(), sum1 = V::zero();
      c = 0;
      for (; c + 2 <= keys; c += 2) {
        const reg p0 = exp2(V::fma(V::load(s + c * lds), c2, neg_m));
        const reg p1 = exp2(V::fma(V::load(s + (c + 1) * lds), c2, neg_m));
        V::store(s + c * lds, p0);
        V::store(s + (c + 1) * lds, p1);
        sum0 = V::add(sum0, p0);
        sum1 = V::add(sum1, p1);
      }
      if (c < keys) {
        const reg p0 = exp2(V::fma(V::load(s + c * lds), c2, neg_m));
        V::store(s + c * lds, p0);
        sum0 = V::add(sum0, p0);
      }
      V::store(a.l + nb, V::fma(V::load(a.l + nb), alpha, V::add(sum0, sum1)));
      V::store(a.m + nb, m_new);
      V::store(a.alpha + nb, alpha);
    }
  }

  // ---- softcap: out_mul * tanh(in_mul * x). |x| < 0.625: odd polynomial (relative error ~1e-7, fitted for this
  // range); beyond: 1 - 2 / (e^(2x) + 1) (|tanh| > 0.55 there, so its ~1e-7 absolute error is relative too; e^(2x)
  // clamped so that large |x| gives +-1 exactly).
  static reg tanh(reg x) {
    const reg z = V::mul(x, x);
    reg p = V::set1(-5.704972893e-3f);
    p = V::fma(p, z, V::set1(2.063907497e-2f));
    p = V::fma(p, z, V::set1(-5.373971164e-2f));
    p = V::fma(p, z, V::set1(1.333144158e-1f));
    p = V::fma(p, z, V::set1(-3.333328068e-1f));
    const reg small = V::fma(V::mul(x, z), p, x);
    const reg one = V::set1(1.0f);
    const reg e = exp2(V::min(V::mul(x, V::set1(2.0f * 1.44269504088896341f)), V::set1(64.0f)));
    const reg large = V::sub(one, V::div(V::set1(2.0f), V::add(e, one)));
    const reg ax = V::max(x, V::sub(V::zero(), x));
    return V::select_lt(ax, V::set1(0.625f), small, large);
  }

  static void softcap(const SoftcapArgs& a) {
    const reg in_mul = V::set1(a.in_mul), out_mul = V::set1(a.out_mul);
    for (int64_t c = 0; c < a.keys; ++c) {
      float* s = a.s + c * a.lds;
      for (int64_t nb = 0; nb < a.n; nb += W) V::store(s + nb, V::mul(out_mul, tanh(V::mul(in_mul, V::load(s + nb)))));
    }
  }

  static constexpr TiledKernels table(const char* name) {
    return {name, W, &gemm, &convert, &online_softmax, &softcap};
  }
};

}  // namespace flashlite::cpu_tiled
