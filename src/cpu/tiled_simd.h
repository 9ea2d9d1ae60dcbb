#pragma once
// The hot loops of the tiled CPU kernel (see tiled_kernels.h), written once over a small SIMD-ops struct V:
//   V::reg, V::width (floats per register), V::mr x V::nv (GEMM register block: rows x registers of columns),
//   zero set1 load store add sub mul fma(a,b,c)=a*b+c max min div round(nearest) pow2i(integral n)=2^n,
//   select_lt(x, t, a, b) = x < t ? a : b,
//   load_f16 / load_bf16 (width elements), f16_scalar,
//   optionally (the decode path) hsum_rows(const reg* a) = [sum of a[0]'s lanes, ..., sum of a[width-1]'s lanes].
// Instantiate it only with a V declared in an anonymous namespace: everything here is a member of a template on V,
// so each instruction set's copy has internal linkage and no code compiled for one ISA can be linked into another's
// caller. (For the same reason: no std:: algorithms here, only builtins.)
#include <cstdint>
#include <type_traits>

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

  // ---- 2^x for x <= 64 (x <= -127, and -inf, give 0; NaN gives NaN): x = n + f, |f| <= 1/2, 2^f by a degree-6
  // polynomial (relative error ~1e-7, fitted for this range), 2^n through the exponent bits.
  // V::max/min return their second operand when either is NaN (as x86 maxps does): the operand order below lets NaN
  // through, so that a NaN score's p, and the l it is summed into, are NaN (src/cpu/tiled.cpp's non-finite rule).
  static reg exp2(reg x) {
    x = V::max(V::set1(-127.0f), x);  // NaN passes
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
      for (; c + 2 <= keys; c += 2) {  // (a NaN score may or may not reach m; its p = 2^NaN makes l NaN either way)
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
    const reg e = exp2(V::min(V::set1(64.0f), V::mul(x, V::set1(2.0f * 1.44269504088896341f))));  // tanh(NaN) = NaN
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

  // ---- The backward's element-wise step (BwdRowArgs).
  static void bwd_row(const BwdRowArgs& a) {
    constexpr float kLog2e = 1.44269504088896341f;
    const reg scale = V::set1(a.scale), delta = V::set1(a.delta), log2e = V::set1(kLog2e);
    const reg neg_lse = V::set1(-a.lse * kLog2e);  // lse = +inf (a row that saw nothing): p = 2^-inf = 0
    const reg big = V::set1(128.0f), inf = V::set1(__builtin_inff()), one = V::set1(1.0f);
    const bool capped = a.cap > 0.f;
    const reg in_mul = V::set1(capped ? 1.0f / a.cap : 0.f), cap = V::set1(a.cap);
    for (int64_t j = 0; j < a.n; j += W) {
      reg t = V::mul(V::load(a.s + j), scale);
      reg u = t;  // t / cap when capped
      if (capped) {
        u = tanh(V::mul(t, in_mul));
        t = V::mul(cap, u);
      }
      const reg x = V::fma(t, log2e, neg_lse);
      const reg p = V::select_lt(big, x, inf, exp2(V::min(big, x)));  // NaN passes both
      reg g = V::mul(p, V::sub(V::load(a.ds + j), delta));
      if (capped) g = V::mul(g, V::sub(one, V::mul(u, u)));
      V::store(a.s + j, p);
      V::store(a.ds + j, V::mul(g, scale));
    }
  }

  // ---- Decode-shaped tasks (SmallArgs): W keys at a time, one accumulator per key over head_dim, then one
  // transposing sum turns the W accumulators into W scores.
  // W keys from c0 (count of them real, the rest summing zero accumulators): one transposing sum gives W scores.
  template <class U, bool kFull>
  static void scores_block(const float* q, const float* k, int64_t k_row, int64_t dp, float* s, int64_t count) {
    reg acc[W];
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) acc[i] = V::zero();
    for (int64_t x = 0; x < dp; x += W) {
      const reg qv = V::load(q + x);
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) {
        if (kFull || i < count) acc[i] = V::fma(qv, V::load(k + i * k_row + x), acc[i]);
      }
    }
    V::store(s, U::hsum_rows(acc));
  }

  template <class U>
  static void small_scores_impl(const SmallArgs& a) {
    const float* const k = a.k;
    const int64_t k_row = a.k_row, dp = a.dp, keys = a.keys;
    for (int64_t n = 0; n < a.n; ++n) {
      const float* q = a.q + n * a.ldq;
      float* s = a.s + n * a.lds;
      int64_t c0 = 0;
      for (; c0 + W <= keys; c0 += W) scores_block<U, true>(q, k + c0 * k_row, k_row, dp, s + c0, W);
      if (c0 < keys) scores_block<U, false>(q, k + c0 * k_row, k_row, dp, s + c0, keys - c0);
    }
  }

  static float lane_max(reg x) {
    float b[W];
    V::store(b, x);
    float r = b[0];
    for (int i = 1; i < W; ++i) r = b[i] > r ? b[i] : r;
    return r;
  }

  static float lane_sum(reg x) {
    float b[W];
    V::store(b, x);
    float r = 0.0f;
    for (int i = 0; i < W; ++i) r += b[i];
    return r;
  }

  // out[i] = lane i of p in every lane (through a store and broadcast loads: on AVX2 two lane shuffles per key cost
  // more, and a measured Zen 1 showed no gain from them).
  static void broadcast_lanes(reg p, reg* out) {
    alignas(64) float buf[W];
    V::store(buf, p);
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) out[i] = V::set1(buf[i]);
  }

  // p = 2^(s * c2 + neg_m) for W keys from c (lanes beyond `count` are masked scores: p = 0).
  static reg probs(const float* s, int64_t c, reg c2, reg neg_m, reg& sum) {
    const reg p = exp2(V::fma(V::load(s + c), c2, neg_m));
    sum = V::add(sum, p);
    return p;
  }

  // head_dim <= 4 W: the output row stays in registers, NB registers x U interleaved partial sums over keys (NB * U = 4
  // independent FMA chains, enough to cover the FMA latency).
  template <class U, int NB>
  static float softmax_pv_regs(const SmallArgs& a, const float* s, float* o, reg c2, reg neg_m, reg alpha) {
    constexpr int P = 4 / NB;
    reg acc[P][NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[0][j] = V::mul(V::load(o + j * W), alpha);
#pragma GCC unroll 4
    for (int u = 1; u < P; ++u) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[u][j] = V::zero();
    }
    reg sum = V::zero();
    const int64_t keys = a.keys, v_row = a.v_row;
    for (int64_t c = 0; c < keys; c += W) {
      reg pb[W];
      broadcast_lanes(probs(s, c, c2, neg_m, sum), pb);
      const float* v = a.v + c * v_row;
      if (c + W <= keys) {
#pragma GCC unroll 16
        for (int i = 0; i < W; ++i) {
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[i % P][j] = V::fma(pb[i], V::load(v + i * v_row + j * W), acc[i % P][j]);
        }
      } else {
#pragma GCC unroll 16
        for (int i = 0; i < W; ++i) {
          if (c + i >= keys) break;
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[i % P][j] = V::fma(pb[i], V::load(v + i * v_row + j * W), acc[i % P][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      reg t = acc[0][j];
#pragma GCC unroll 4
      for (int u = 1; u < P; ++u) t = V::add(t, acc[u][j]);
      V::store(o + j * W, t);
    }
    return lane_sum(sum);
  }

  // Longer head_dim: the output row is scaled in memory, then per W keys every group of 4 registers of it is loaded,
  // takes W FMAs, and is stored (the groups are independent chains).
  template <class U>
  static float softmax_pv_mem(const SmallArgs& a, const float* s, float* o, reg c2, reg neg_m, reg alpha) {
    const int64_t keys = a.keys, v_row = a.v_row, dp = a.dp;
    for (int64_t x = 0; x < dp; x += W) V::store(o + x, V::mul(V::load(o + x), alpha));
    reg sum = V::zero();
    for (int64_t c = 0; c < keys; c += W) {
      reg pb[W];
      broadcast_lanes(probs(s, c, c2, neg_m, sum), pb);
      const float* v = a.v + c * v_row;
      const int count = keys - c < W ? int(keys - c) : W;
      for (int64_t x = 0; x < dp; x += 4 * W) {
        const int nb = dp - x < 4 * W ? int((dp - x) / W) : 4;
        reg acc[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[j] = j < nb ? V::load(o + x + j * W) : V::zero();
        for (int i = 0; i < count; ++i) {
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
            if (j < nb) acc[j] = V::fma(pb[i], V::load(v + i * v_row + x + j * W), acc[j]);
          }
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j < nb) V::store(o + x + j * W, acc[j]);
        }
      }
    }
    return lane_sum(sum);
  }

  template <class U>
  static void small_softmax_pv_impl(const SmallArgs& a) {
    const reg c2 = V::set1(a.log2_scale);
    const int64_t kp = (a.keys + W - 1) / W * W;
    for (int64_t n = 0; n < a.n; ++n) {
      const float* s = a.s + n * a.lds;
      reg mx = V::set1(-__builtin_inff());
      for (int64_t c = 0; c < kp; c += W) mx = V::max(mx, V::load(s + c));
      // Same arithmetic as online_softmax, one column at a time.
      const reg m_old = V::set1(a.m[n]);
      const reg m_new = V::max(m_old, V::mul(V::set1(lane_max(mx)), c2));
      const reg neg_m = V::sub(V::zero(), V::max(m_new, V::set1(-3.402823466e38f)));
      const reg alpha = exp2(V::add(m_old, neg_m));
      float* o = a.o + n * a.ldo;
      float sum;
      if (a.dp == W) {
        sum = softmax_pv_regs<U, 1>(a, s, o, c2, neg_m, alpha);
      } else if (a.dp == 2 * W) {
        sum = softmax_pv_regs<U, 2>(a, s, o, c2, neg_m, alpha);
      } else if (a.dp == 4 * W) {
        sum = softmax_pv_regs<U, 4>(a, s, o, c2, neg_m, alpha);
      } else {
        sum = softmax_pv_mem<U>(a, s, o, c2, neg_m, alpha);
      }
      float al[W], mn[W];
      V::store(al, alpha);
      V::store(mn, m_new);
      a.l[n] = a.l[n] * al[0] + sum;
      a.m[n] = mn[0];
    }
  }

  template <class U, class = void>
  struct HasHsumRows : std::false_type {};
  template <class U>
  struct HasHsumRows<U, decltype(void(U::hsum_rows(static_cast<const typename U::reg*>(nullptr))))> : std::true_type {};

  static constexpr TiledKernels table(const char* name) {
    if constexpr (HasHsumRows<V>::value) {
      return {name, W, &gemm, &convert, &online_softmax, &softcap, &small_scores_impl<V>, &small_softmax_pv_impl<V>,
              &bwd_row};
    } else {
      return {name, W, &gemm, &convert, &online_softmax, &softcap, nullptr, nullptr, &bwd_row};
    }
  }
};

}  // namespace flashlite::cpu_tiled
