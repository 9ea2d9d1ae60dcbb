#pragma once
// Helpers of the KV-cache tests: host caches (contiguous or paged with shuffled, non-contiguous page tables and
// spare pages) whose every element outside the held tokens is NaN, decode problems over them, the float64 oracle
// (reference_forward_f64 over K/V gathered into plain [1, L, kv_heads, head_dim] tensors), an independent float64
// RoPE, and the checks (errors vs reference, NaN, zeros for rows with no visible key, bytes outside outputs kept).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashlite/kv_cache.h"
#include "test_util.h"  // tests/cpu: Buffer, load/store, view_n, seed_of

namespace kvtest {

using flashlite::AttentionOptions;
using flashlite::Backend;
using flashlite::DecodeArgs;
using flashlite::Device;
using flashlite::DType;
using flashlite::ForwardArgs;
using flashlite::KvCacheView;
using flashlite::KvLayout;
using flashlite::TensorView;
using fltest::Buffer;

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline TensorView i32_view(std::vector<int32_t>& v) {
  return fltest::view_n(v.data(), DType::i32, {int64_t(v.size())}, {1});
}

// ------------------------------------------------------------------------------------------------ caches

struct CacheSpec {
  bool paged = false;
  int64_t page_size = 16;
  int64_t kv_heads = 2, head_dim = 64;
  DType dtype = DType::bf16;
  std::vector<int32_t> lens;    // tokens held per sequence (after the step's append)
  std::vector<int32_t> filled;  // tokens written with random values (default: lens); the rest stays NaN
  int64_t max_len = 0;          // contiguous capacity; 0 = longest + 7
  int64_t spare_pages = 3;      // pages in the pool nobody owns (NaN)
  bool padded = false;          // gaps between heads / tokens / pages (strides not packed)
};

struct HostCache {
  CacheSpec spec;
  int64_t batch = 0, num_pages = 0, cap = 0;  // cap: max_len (contiguous) or page_size (paged)
  std::array<int64_t, 4> shape{}, strides{};
  Buffer kbuf, vbuf;
  std::vector<int32_t> seq_lens, indptr, indices, last;
  KvCacheView view;  // host view (index host-side only)

  HostCache(const CacheSpec& s, uint64_t seed) : spec(s) {
    batch = int64_t(s.lens.size());
    if (spec.filled.empty()) spec.filled = s.lens;
    const int64_t H = s.kv_heads, D = s.head_dim;
    int64_t longest = 0;
    for (int32_t l : s.lens) longest = std::max<int64_t>(longest, l);
    std::mt19937_64 rng(seed);
    if (!s.paged) {
      cap = s.max_len > 0 ? s.max_len : longest + 7;
      shape = {batch, cap, H, D};
      seq_lens = s.lens;
    } else {
      cap = s.page_size;
      indptr = {0};
      for (int32_t l : s.lens) indptr.push_back(indptr.back() + int32_t((l + cap - 1) / cap));
      num_pages = indptr.back() + s.spare_pages;
      std::vector<int32_t> perm(static_cast<size_t>(num_pages));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);  // pages neither contiguous nor ordered
      indices.assign(perm.begin(), perm.begin() + indptr.back());
      indices.push_back(-7);  // an entry past indptr[batch]: never read
      for (size_t b = 0; b < s.lens.size(); ++b) {
        const int64_t pages = indptr[b + 1] - indptr[b];
        last.push_back(pages == 0 ? 0 : int32_t(s.lens[b] - (pages - 1) * cap));
      }
      shape = {num_pages, cap, H, D};
    }
    if (s.padded) {
      const int64_t hs = D + 8, ts = H * hs + 16, ps = shape[1] * ts + 24;
      strides = {ps, ts, hs, 1};
    } else {
      strides = {shape[1] * H * D, H * D, D, 1};
    }
    const int64_t numel = shape[0] * strides[0];
    kbuf = Buffer(s.dtype, numel);
    vbuf = Buffer(s.dtype, numel);
    kbuf.poison();
    vbuf.poison();
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t p = 0; p < spec.filled[size_t(b)]; ++p)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < D; ++c) {
            fltest::store(s.dtype, kbuf.data(), offset(b, p, h) + c, normal(rng));
            fltest::store(s.dtype, vbuf.data(), offset(b, p, h) + c, normal(rng));
          }
    view.layout = s.paged ? KvLayout::paged : KvLayout::contiguous;
    view.k = fltest::view_n(kbuf.data(), s.dtype, {shape[0], shape[1], shape[2], shape[3]},
                            {strides[0], strides[1], strides[2], strides[3]});
    view.v = view.k;
    view.v.data = vbuf.data();
    if (!s.paged) {
      view.host.seq_lens = i32_view(seq_lens);
    } else {
      view.host.page_indptr = i32_view(indptr);
      view.host.page_indices = i32_view(indices);
      view.host.last_page_len = i32_view(last);
    }
  }
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  int64_t len(int64_t b) const { return spec.lens[size_t(b)]; }
  // Element offset of token p of sequence b, head h (written again here, independent of the library).
  int64_t offset(int64_t b, int64_t p, int64_t h) const {
    if (!spec.paged) return b * strides[0] + p * strides[1] + h * strides[2];
    const int64_t page = indices[size_t(indptr[size_t(b)] + p / cap)];
    return page * strides[0] + (p % cap) * strides[1] + h * strides[2];
  }
  float k_at(int64_t b, int64_t p, int64_t h, int64_t c) const { return fltest::load(spec.dtype, kbuf.bytes.data(), offset(b, p, h) + c); }
  float v_at(int64_t b, int64_t p, int64_t h, int64_t c) const { return fltest::load(spec.dtype, vbuf.bytes.data(), offset(b, p, h) + c); }
};

// ------------------------------------------------------------------------------------------------ decode problems

struct DecodeSpec {
  int64_t q_heads = 4, q_len = 1;
  AttentionOptions opt;  // causal, window, sinks, softcap, scale (sink_logits filled by the problem)
  bool sink_logits = false;
  bool padded_out = false;  // out with a gap after each head (its bytes must stay NaN)
  bool lse = true;
};

// Learned sink logits for `heads` query heads (random, a large one, -inf: every case of the rule), into buf.
inline TensorView fill_sink_logits(Buffer& buf, int64_t heads, std::mt19937_64& rng, std::normal_distribution<float>& normal) {
  buf = Buffer(DType::f32, heads);
  for (int64_t h = 0; h < heads; ++h) {
    const float v = h % 3 == 0 ? normal(rng) : h % 3 == 1 ? 3.f : -std::numeric_limits<float>::infinity();
    fltest::store(DType::f32, buf.data(), h, v);
  }
  return fltest::view_n(buf.data(), DType::f32, {heads}, {1});
}

struct DecodeProblem {
  DecodeSpec spec;
  HostCache& cache;
  Buffer qbuf, outbuf, lsebuf, sinkbuf;
  DecodeArgs args;

  DecodeProblem(HostCache& c, const DecodeSpec& s, uint64_t seed) : spec(s), cache(c) {
    const int64_t B = c.batch, S = s.q_len, H = s.q_heads, D = c.spec.head_dim;
    const DType t = c.spec.dtype;
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::normal_distribution<float> normal(0.f, 1.f);
    qbuf = Buffer(t, B * S * H * D);
    for (int64_t i = 0; i < qbuf.numel(); ++i) fltest::store(t, qbuf.data(), i, normal(rng));
    const int64_t hs = s.padded_out ? D + 8 : D;
    outbuf = Buffer(t, B * S * H * hs);
    outbuf.poison();
    args.q = fltest::view_n(qbuf.data(), t, {B, S, H, D}, {S * H * D, H * D, D, 1});
    args.out = fltest::view_n(outbuf.data(), t, {B, S, H, D}, {S * H * hs, H * hs, hs, 1});
    if (s.lse) {
      lsebuf = Buffer(DType::f32, B * H * S);
      lsebuf.poison();
      args.lse = fltest::view_n(lsebuf.data(), DType::f32, {B, H, S}, {H * S, S, 1});
    }
    args.cache = c.view;
    args.options = s.opt;
    if (s.sink_logits) args.options.sink_logits = fill_sink_logits(sinkbuf, H, rng, normal);
  }
  DecodeProblem(const DecodeProblem&) = delete;
  DecodeProblem& operator=(const DecodeProblem&) = delete;
};

// The oracle for one sequence: reference_forward_f64 over its K/V gathered into [1, L, kv_heads, D] (stored values,
// same dtype) with q [1, q_len, q_heads, D]. out: [q_len, q_heads, D]; lse: [q_heads, q_len].
struct Ref {
  std::vector<double> out, lse;
};

// reference_forward_f64 for sequence b of the cache: its K/V gathered into [1, L, kv_heads, D] (stored values, same
// dtype), q [1, n, q_heads, D] (the rows in `q`), the call's options and sink logits (null: none).
inline Ref reference_over_sequence(const HostCache& c, int64_t b, Buffer& q, int64_t n, int64_t Hq, AttentionOptions opt,
                                   const Buffer* sinks) {
  const int64_t L = c.len(b), H = c.spec.kv_heads, D = c.spec.head_dim;
  const DType t = c.spec.dtype;
  const size_t es = fltest::elem_size(t);
  Buffer k(t, std::max<int64_t>(L, 1) * H * D), v(t, std::max<int64_t>(L, 1) * H * D), out(t, std::max<int64_t>(n, 1) * Hq * D);
  for (int64_t j = 0; j < L; ++j)
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(k.at((j * H + h) * D), c.kbuf.bytes.data() + c.offset(b, j, h) * int64_t(es), size_t(D) * es);
      std::memcpy(v.at((j * H + h) * D), c.vbuf.bytes.data() + c.offset(b, j, h) * int64_t(es), size_t(D) * es);
    }
  ForwardArgs a;
  a.q = fltest::view_n(q.data(), t, {1, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
  a.k = fltest::view_n(k.data(), t, {1, L, H, D}, {L * H * D, H * D, D, 1});
  a.v = fltest::view_n(v.data(), t, {1, L, H, D}, {L * H * D, H * D, D, 1});
  a.out = fltest::view_n(out.data(), t, {1, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
  a.options = opt;
  a.options.sink_logits = sinks ? fltest::view_n(const_cast<uint8_t*>(sinks->bytes.data()), DType::f32, {Hq}, {1}) : TensorView{};
  Ref r;
  r.out.assign(size_t(n * Hq * D), std::nan(""));
  r.lse.assign(size_t(Hq * n), std::nan(""));
  if (n > 0) flashlite::reference_forward_f64(a, r.out.data(), r.lse.data());
  return r;
}

inline Ref oracle(const DecodeProblem& p, int64_t b) {
  const int64_t S = p.spec.q_len, Hq = p.spec.q_heads, D = p.cache.spec.head_dim;
  const DType t = p.cache.spec.dtype;
  const size_t es = fltest::elem_size(t);
  Buffer q(t, S * Hq * D);
  std::memcpy(q.data(), p.qbuf.bytes.data() + b * S * Hq * D * int64_t(es), size_t(S * Hq * D) * es);
  return reference_over_sequence(p.cache, b, q, S, Hq, p.args.options, p.spec.sink_logits ? &p.sinkbuf : nullptr);
}

// Whether query row i of sequence b sees any key (the documented predicate, tests/cpu/test_util.h).
inline bool row_sees_a_key(const DecodeProblem& p, int64_t b, int64_t i) {
  const AttentionOptions& o = p.spec.opt;
  const fltest::MaskSpec m{o.causal, o.window_left, o.window_right, o.sink_tokens};
  for (int64_t j = 0; j < p.cache.len(b); ++j)
    if (fltest::doc_visible(m, i, j, p.spec.q_len, p.cache.len(b))) return true;
  return false;
}

struct Tol {
  double max_abs = 1e-4;  // fp32 caches
  double rel = 1e-2;      // fp16 / bf16: ||out - ref|| / ||ref|| per sequence
  double lse = 1e-4;      // |lse - ref| <= lse * max(1, |ref|)
};

// One sequence's outputs against the float64 oracle, row by row (decode and prefill share it): every value finite and,
// for fp32, within tol.max_abs; fp16 / bf16 by the relative error of the whole sequence; rows that see no key exactly
// zero; LSEs within tol.lse (infinities exact). finish() reports.
struct SequenceCheck {
  DType t;
  Tol tol;
  double max_abs = 0, d2 = 0, r2 = 0;
  int64_t bad = 0, zero_bad = 0, lse_bad = 0;
  std::string first;

  bool half() const { return t != DType::f32; }
  // The D values of row (i, h) at element offset `off` of `out`, against want[0 .. D).
  void row(const uint8_t* out, int64_t off, const double* want, int64_t D, bool sees, int64_t i, int64_t h) {
    for (int64_t e = 0; e < D; ++e) {
      const double got = fltest::load(t, out, off + e);
      const double err = std::fabs(got - want[e]);
      if (!std::isfinite(got) || (!half() && !(err <= tol.max_abs))) {
        if (bad++ == 0) first = "out[i" + std::to_string(i) + ", h" + std::to_string(h) + ", c" + std::to_string(e) + "] = " +
                                std::to_string(got) + ", reference " + std::to_string(want[e]);
      }
      if (std::isfinite(err)) max_abs = std::max(max_abs, err), d2 += err * err;
      r2 += want[e] * want[e];
      if (!sees && got != 0.0) ++zero_bad;
    }
  }
  void lse(double got, double want, int64_t i, int64_t h) {
    const bool ok = std::isinf(want) ? got == want
                                     : std::isfinite(got) && std::fabs(got - want) <= tol.lse * std::max(1.0, std::fabs(want));
    if (!ok && lse_bad++ == 0) ADD_FAILURE() << "lse[h" << h << ", i" << i << "] = " << got << ", reference " << want;
  }
  void finish() const {
    EXPECT_EQ(bad, 0) << "non-finite or over-tolerance outputs; first: " << first << " (max abs err " << max_abs << ")";
    if (half() && r2 > 0) {
      EXPECT_LT(std::sqrt(d2 / r2), tol.rel) << "relative error ||out - ref|| / ||ref||";
    }
    EXPECT_EQ(zero_bad, 0) << "rows with no visible key must be exactly zero";
    EXPECT_EQ(lse_bad, 0) << "LSE mismatches";
  }
};

// Compares out / lse of a decode run (host copies in p's buffers) with the oracle; `out_before` is the output buffer
// as it was before the run (its bytes outside the view must be unchanged).
inline void expect_decode_matches(const DecodeProblem& p, const std::vector<uint8_t>& out_before, const Tol& tol = {}) {
  const HostCache& c = p.cache;
  const int64_t S = p.spec.q_len, Hq = p.spec.q_heads, D = c.spec.head_dim;
  const DType t = c.spec.dtype;
  const size_t es = fltest::elem_size(t);
  const TensorView& o = p.args.out;
  std::vector<uint8_t> expect = out_before;
  for (int64_t b = 0; b < c.batch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " (length " + std::to_string(c.len(b)) + ")");
    const Ref r = oracle(p, b);
    SequenceCheck check{t, tol};
    for (int64_t i = 0; i < S; ++i) {
      const bool sees = row_sees_a_key(p, b, i);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t off = b * o.strides[0] + i * o.strides[1] + h * o.strides[2];  // head_dim is contiguous
        std::memcpy(expect.data() + off * int64_t(es), p.outbuf.bytes.data() + off * int64_t(es), size_t(D) * es);
        check.row(p.outbuf.bytes.data(), off, &r.out[size_t((i * Hq + h) * D)], D, sees, i, h);
        if (p.args.lse.data) {
          check.lse(fltest::load(DType::f32, p.lsebuf.bytes.data(), (b * Hq + h) * S + i), r.lse[size_t(h * S + i)], i, h);
        }
      }
    }
    check.finish();
  }
  EXPECT_TRUE(p.outbuf.bytes == expect) << "out: bytes outside the output view were written";
}

// ------------------------------------------------------------------------------------------------ RoPE in float64

// Written from the description of Hugging Face's rope_type "llama3" (_compute_llama3_parameters), independently
// of the library's rope_inv_freq.
inline double test_inv_freq(const flashlite::RopeOptions& r, int64_t D, int64_t c) {
  double inv = 1.0 / std::pow(r.theta, double(2 * c) / double(D));
  if (!r.llama3) return inv;
  const double old_ctx = r.llama3_original_max_position;
  const double low_wavelen = old_ctx / r.llama3_low_freq_factor, high_wavelen = old_ctx / r.llama3_high_freq_factor;
  const double wavelen = 2 * std::numbers::pi / inv;
  double scaled = wavelen > low_wavelen ? inv / r.llama3_factor : inv;
  const double smooth = (old_ctx / wavelen - r.llama3_low_freq_factor) / (r.llama3_high_freq_factor - r.llama3_low_freq_factor);
  const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
  if (medium) scaled = (1 - smooth) * scaled / r.llama3_factor + smooth * scaled;
  return scaled;
}

// x (one head row, float64) rotated for position pos.
inline std::vector<double> test_rope(const flashlite::RopeOptions& r, std::vector<double> x, int64_t pos) {
  const int64_t D = int64_t(x.size()), half = D / 2;
  for (int64_t c = 0; c < half; ++c) {
    const double ang = double(pos) * test_inv_freq(r, D, c);
    const int64_t a = r.layout == flashlite::RopeLayout::interleaved ? 2 * c : c;
    const int64_t b = r.layout == flashlite::RopeLayout::interleaved ? 2 * c + 1 : c + half;
    const double xa = x[size_t(a)], xb = x[size_t(b)];
    x[size_t(a)] = xa * std::cos(ang) - xb * std::sin(ang);
    x[size_t(b)] = xb * std::cos(ang) + xa * std::sin(ang);
  }
  return x;
}

// Tolerance of one stored element against a float64 value: half an ulp of the dtype plus the float32 rotation.
inline double stored_tol(DType t, double ref) {
  const double ulp = t == DType::bf16 ? 1.0 / 128 : t == DType::f16 ? 1.0 / 1024 : 1.0 / 8388608;
  return std::max(std::fabs(ref), 1e-2) * ulp + 2e-6 * std::max(1.0, std::fabs(ref));
}

// ------------------------------------------------------------------------------------------------ append cases

struct AppendCase {
  std::string name;
  bool paged;
  DType dtype;
  int n_new;
  bool rope;
  flashlite::RopeLayout layout = flashlite::RopeLayout::half_split;
  bool llama3 = false;
  bool q = false;
  bool in_place = false;
};

// New K/V/Q of one append ([batch, n, heads, D], random), and the checks after it ran.
struct AppendFixture {
  HostCache& cache;
  AppendCase tc;
  int64_t hq = 6;
  Buffer k, v, q, q_out;
  flashlite::AppendArgs args;

  AppendFixture(HostCache& c, const AppendCase& t) : cache(c), tc(t) {
    const int64_t B = c.batch, N = t.n_new, H = c.spec.kv_heads, D = c.spec.head_dim;
    const DType dt = c.spec.dtype;
    std::mt19937_64 rng(fltest::seed_of(t.name + "new"));
    std::normal_distribution<float> normal(0.f, 1.f);
    k = Buffer(dt, B * N * H * D);
    v = Buffer(dt, B * N * H * D);
    q = Buffer(dt, B * N * hq * D);
    for (Buffer* buf : {&k, &v, &q})
      for (int64_t i = 0; i < buf->numel(); ++i) fltest::store(dt, buf->data(), i, normal(rng));
    args.cache = c.view;
    args.k = fltest::view_n(k.data(), dt, {B, N, H, D}, {N * H * D, H * D, D, 1});
    args.v = fltest::view_n(v.data(), dt, {B, N, H, D}, {N * H * D, H * D, D, 1});
    args.rope.enabled = t.rope;
    args.rope.layout = t.layout;
    args.rope.llama3 = t.llama3;
    if (t.llama3) args.rope.theta = 500000.0, args.rope.llama3_factor = 32.0;  // Llama 3.2's values
    if (t.q) {
      args.q = fltest::view_n(q.data(), dt, {B, N, hq, D}, {N * hq * D, hq * D, D, 1});
      if (t.in_place) {
        args.q_out = args.q;
      } else {
        q_out = Buffer(dt, B * N * hq * D);
        q_out.poison();
        args.q_out = fltest::view_n(q_out.data(), dt, {B, N, hq, D}, {N * hq * D, hq * D, D, 1});
      }
    }
  }

  // After the append: new tokens (rotated) in the last n positions, every other cache byte as before.
  void check(const std::vector<uint8_t>& k_before, const std::vector<uint8_t>& v_before, const std::vector<uint8_t>& q_before) {
    const int64_t N = tc.n_new, H = cache.spec.kv_heads, D = cache.spec.head_dim;
    const DType dt = cache.spec.dtype;
    const size_t es = fltest::elem_size(dt);
    std::vector<uint8_t> k_expect = k_before, v_expect = v_before;
    int64_t bad = 0;
    std::string first;
    auto expect_row = [&](const std::vector<double>& want, const uint8_t* got_base, int64_t off, const std::string& what) {
      for (int64_t c = 0; c < D; ++c) {
        const double got = fltest::load(dt, got_base, off + c);
        if (!(std::fabs(got - want[size_t(c)]) <= stored_tol(dt, want[size_t(c)])) && bad++ == 0) {
          first = what + "[" + std::to_string(c) + "] = " + std::to_string(got) + ", expected " + std::to_string(want[size_t(c)]);
        }
      }
    };
    for (int64_t b = 0; b < cache.batch; ++b) {
      for (int64_t t = 0; t < N; ++t) {
        const int64_t pos = cache.len(b) - N + t;
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> kr(static_cast<size_t>(D)), vr(static_cast<size_t>(D));
          for (int64_t c = 0; c < D; ++c) {
            kr[size_t(c)] = fltest::load(dt, k.bytes.data(), ((b * N + t) * H + h) * D + c);
            vr[size_t(c)] = fltest::load(dt, v.bytes.data(), ((b * N + t) * H + h) * D + c);
          }
          if (tc.rope) kr = test_rope(args.rope, kr, pos);
          const int64_t off = cache.offset(b, pos, h);
          const std::string where = "b" + std::to_string(b) + " pos " + std::to_string(pos) + " h" + std::to_string(h);
          expect_row(kr, cache.kbuf.bytes.data(), off, "k " + where);
          expect_row(vr, cache.vbuf.bytes.data(), off, "v " + where);
          std::memcpy(k_expect.data() + off * int64_t(es), cache.kbuf.bytes.data() + off * int64_t(es), size_t(D) * es);
          std::memcpy(v_expect.data() + off * int64_t(es), cache.vbuf.bytes.data() + off * int64_t(es), size_t(D) * es);
        }
        if (tc.q) {
          const uint8_t* qo = tc.in_place ? q.bytes.data() : q_out.bytes.data();
          for (int64_t h = 0; h < hq; ++h) {
            std::vector<double> qr(static_cast<size_t>(D));
            for (int64_t c = 0; c < D; ++c) qr[size_t(c)] = fltest::load(dt, q_before.data(), ((b * N + t) * hq + h) * D + c);
            expect_row(test_rope(args.rope, qr, pos), qo, ((b * N + t) * hq + h) * D, "q b" + std::to_string(b) + " h" + std::to_string(h));
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "appended values differ from the float64 RoPE; first: " << first;
    EXPECT_TRUE(cache.kbuf.bytes == k_expect) << "cache.k bytes outside the new tokens changed";
    EXPECT_TRUE(cache.vbuf.bytes == v_expect) << "cache.v bytes outside the new tokens changed";
    if (tc.q && !tc.in_place) {
      EXPECT_TRUE(q.bytes == q_before) << "q changed (not in place)";
    }
  }
};

inline CacheSpec append_cache(const AppendCase& t) {
  CacheSpec s;
  s.paged = t.paged;
  s.page_size = 16;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.dtype = t.dtype;
  s.lens = {int32_t(t.n_new), 16 + t.n_new, 31, 200, 4000};  // new tokens start at 0, on a page boundary, inside
  s.filled.clear();
  for (int32_t l : s.lens) s.filled.push_back(l - t.n_new);
  return s;
}

}  // namespace kvtest
