#pragma once
// Helpers of the CPU test suite: owning buffers behind TensorViews, NaN poisoning, random fills in the stored dtype,
// memory layouts (padded, permuted, packed qkv), varlen problems, the documented mask predicate (written again from
// the text of include/flashlite/attention.h, independent of src/common/mask.h), an independent float64 oracle, and
// the comparison against the reference (errors, NaN/Inf, exact zeros and -inf, untouched bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "flashlite/attention.h"
#include "flashlite/errors.h"

namespace flashlite {
// Readable test parameters in gtest output.
inline void PrintTo(Backend b, std::ostream* os) { *os << backend_name(b); }
}  // namespace flashlite

namespace fltest {

using flashlite::AttentionOptions;
using flashlite::Backend;
using flashlite::Device;
using flashlite::DType;
using flashlite::ForwardArgs;
using flashlite::TensorView;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- buffers and element access

inline size_t elem_size(DType t) { return t == DType::f16 || t == DType::bf16 ? 2 : 4; }

inline float load(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::f16: return flashlite::fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return flashlite::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

inline void store(DType t, void* base, int64_t i, float v) {
  switch (t) {
    case DType::f16: static_cast<uint16_t*>(base)[i] = flashlite::float_to_fp16(v); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = flashlite::float_to_bf16(v); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// Owns numel elements of one dtype; views point into it. Not copyable (views hold its address).
struct Buffer {
  DType dtype = DType::f32;
  std::vector<uint8_t> bytes;

  Buffer() = default;
  Buffer(DType t, int64_t numel) : dtype(t), bytes(size_t(std::max<int64_t>(numel, 1)) * elem_size(t)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  int64_t numel() const { return int64_t(bytes.size() / elem_size(dtype)); }
  void* data() { return bytes.data(); }
  void* at(int64_t elem) { return bytes.data() + elem * int64_t(elem_size(dtype)); }
  void poison() {  // NaN everywhere: an element nobody writes stays NaN, one read by mistake spreads NaN
    for (int64_t i = 0; i < numel(); ++i) store(dtype, data(), i, std::numeric_limits<float>::quiet_NaN());
  }
};

inline TensorView view4(Buffer& buf, int64_t offset, std::array<int64_t, 4> shape, std::array<int64_t, 4> strides) {
  TensorView t;
  t.data = buf.at(offset);
  t.dtype = buf.dtype;
  t.device = Device::cpu();
  t.rank = 4;
  for (int i = 0; i < 4; ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
  return t;
}

inline TensorView view_n(void* data, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
  return t;
}

inline int64_t offset4(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t c) {
  return b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + c * t.strides[3];
}
inline float get4(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t c) {
  return load(t.dtype, t.data, offset4(t, b, s, h, c));
}
inline void set4(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t c, float v) {
  store(t.dtype, t.data, offset4(t, b, s, h, c), v);
}

// Deterministic seed from a name (FNV-1a), so every case has its own fixed inputs.
inline uint64_t seed_of(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

// ---------------------------------------------------------------- layouts

enum class Layout {
  contiguous,   // [b, s, h, d] row-major
  padded,       // row-major with gaps after each head, row and batch, and a base one element off alignment
  pair_padded,  // row-major with 2-element gaps: rows 4-byte aligned, not 16 (vector stores cannot be used)
  heads_major,  // stored [b, h, s, d]
  seq_first,    // stored [s, b, h, d]
  packed_qkv,   // q, k, v as head slices of one [b, s, hq + 2 hkv, d] buffer (inputs only)
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contig";
    case Layout::padded: return "padded";
    case Layout::pair_padded: return "pairpadded";
    case Layout::heads_major: return "headsmajor";
    case Layout::seq_first: return "seqfirst";
    case Layout::packed_qkv: return "packedqkv";
  }
  return "?";
}

struct Placement {
  int64_t numel = 0, offset = 0;
  std::array<int64_t, 4> strides{};
};

inline Placement place(Layout l, std::array<int64_t, 4> shape) {
  const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  switch (l) {
    case Layout::padded: {
      const int64_t hs = D + 3, ss = H * hs + 5, bs = S * ss + 7;
      return {1 + B * bs, 1, {bs, ss, hs, 1}};
    }
    case Layout::pair_padded: {
      const int64_t hs = D + 2, ss = H * hs + 2, bs = S * ss + 2;
      return {B * bs, 0, {bs, ss, hs, 1}};
    }
    case Layout::heads_major: return {B * H * S * D, 0, {H * S * D, D, S * D, 1}};
    case Layout::seq_first: return {S * B * H * D, 0, {H * D, B * H * D, D, 1}};
    default: return {B * S * H * D, 0, {S * H * D, H * D, D, 1}};
  }
}

// ---------------------------------------------------------------- the problem description

struct MaskSpec {
  bool causal = false;
  int wl = -1, wr = -1;  // window left / right, -1 = unlimited
  int sinks = 0;         // sink tokens
};

// The documented predicate (attention.h), written here again so the tests do not trust src/common/mask.h.
inline bool doc_visible(const MaskSpec& m, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  const int64_t p = i + (sk - sq);  // bottom-right alignment
  if (m.causal && j > p) return false;
  const bool in_window = (m.wl < 0 || j >= p - m.wl) && (m.wr < 0 || j <= p + m.wr);
  return in_window || j < m.sinks;
}

enum class LseMode { none, contiguous, transposed };  // transposed: stored [b, rows, hq]

struct Spec {
  int64_t batch = 1, seq_q = 1, seq_k = 1, hq = 1, hkv = 1, d = 64;
  DType dtype = DType::f32;
  MaskSpec mask;
  bool sink_logits = false;
  double softcap = 0;
  std::optional<double> scale;
  double input_std = 1.0;  // std of q and k entries (large values stress the running max)
  Layout in_layout = Layout::contiguous, out_layout = Layout::contiguous;
  LseMode lse = LseMode::contiguous;
  std::vector<int32_t> varlen_q, varlen_k;  // per-sequence lengths; varlen when non-empty
  int64_t extra_rows = 0;                   // varlen: tensor rows past the last sequence (never to be touched)

  bool varlen() const { return !varlen_q.empty(); }
  int64_t tensor_batch() const { return varlen() ? 1 : batch; }
  int64_t rows_q() const { return varlen() ? sum(varlen_q) + extra_rows : seq_q; }
  int64_t rows_k() const { return varlen() ? sum(varlen_k) + extra_rows : seq_k; }
  int64_t sequences() const { return varlen() ? int64_t(varlen_q.size()) : batch; }
  static int64_t sum(const std::vector<int32_t>& v) {
    int64_t s = 0;
    for (int32_t x : v) s += x;
    return s;
  }
};

// ---------------------------------------------------------------- test names (gtest allows only [A-Za-z0-9_])
inline std::string num(double x) {  // 2.5 -> "2p5", -0.5 -> "m0p5"
  std::ostringstream os;
  os << x;
  std::string s = os.str();
  for (char& ch : s) ch = ch == '.' ? 'p' : ch == '-' ? 'm' : ch;
  return s;
}

inline const char* dtype_tag(DType t) { return t == DType::f32 ? "f32" : t == DType::f16 ? "f16" : "bf16"; }

// A problem as a test name: dtype, shape, mask, options, layouts.
inline std::string describe(const Spec& s) {
  std::ostringstream os;
  os << dtype_tag(s.dtype);
  if (s.varlen()) {
    os << "_varlen" << s.varlen_q.size();
  } else {
    os << "_b" << s.batch << "_q" << s.seq_q << "_k" << s.seq_k;
  }
  os << "_h" << s.hq << "x" << s.hkv << "_d" << s.d;
  if (s.mask.causal) os << "_causal";
  if (s.mask.wl >= 0 || s.mask.wr >= 0) {
    os << "_win" << (s.mask.wl < 0 ? "inf" : std::to_string(s.mask.wl)) << "x"
       << (s.mask.wr < 0 ? "inf" : std::to_string(s.mask.wr));
  }
  if (s.mask.sinks) os << "_sinks" << s.mask.sinks;
  if (s.sink_logits) os << "_sinklogits";
  if (s.softcap > 0) os << "_softcap" << num(s.softcap);
  if (s.scale) os << "_scale" << num(*s.scale);
  if (s.input_std != 1.0) os << "_std" << num(s.input_std);
  if (s.in_layout != Layout::contiguous) os << "_in" << layout_name(s.in_layout);
  if (s.out_layout != Layout::contiguous) os << "_out" << layout_name(s.out_layout);
  if (s.lse == LseMode::none) os << "_nolse";
  if (s.lse == LseMode::transposed) os << "_lseT";
  return os.str();
}

inline Spec shape(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, DType t = DType::f32) {
  Spec s;
  s.batch = b, s.seq_q = sq, s.seq_k = sk, s.hq = hq, s.hkv = hkv, s.d = d, s.dtype = t;
  return s;
}

// One sequence: where its rows start in the tensors and its lengths.
struct Seq {
  int64_t b, q0, k0, sq, sk;
};
inline std::vector<Seq> sequences_of(const Spec& s) {
  std::vector<Seq> out;
  int64_t q0 = 0, k0 = 0;
  for (int64_t i = 0; i < s.sequences(); ++i) {
    if (s.varlen()) {
      out.push_back({0, q0, k0, s.varlen_q[i], s.varlen_k[i]});
      q0 += s.varlen_q[i];
      k0 += s.varlen_k[i];
    } else {
      out.push_back({i, 0, 0, s.seq_q, s.seq_k});
    }
  }
  return out;
}

// Buffers + ForwardArgs of one problem. Inputs hold random values of the stored dtype; every element no view
// covers (padding, varlen rows outside all sequences) is NaN, so reading it or writing to it shows.
struct Problem {
  Spec spec;
  Buffer qbuf, kbuf, vbuf, outbuf, lsebuf, sinkbuf;  // qkv share qbuf when packed
  std::vector<int32_t> cu_q, cu_k;
  ForwardArgs args;

  explicit Problem(const Spec& s, uint64_t seed) : spec(s) {
    const int64_t B = s.tensor_batch(), RQ = s.rows_q(), RK = s.rows_k(), D = s.d;
    const DType t = s.dtype;
    if (s.in_layout == Layout::packed_qkv) {
      const int64_t rows = std::max(RQ, RK), heads = s.hq + 2 * s.hkv;
      qbuf = Buffer(t, B * rows * heads * D);
      qbuf.poison();
      const std::array<int64_t, 4> st{rows * heads * D, heads * D, D, 1};
      args.q = view4(qbuf, 0, {B, RQ, s.hq, D}, st);
      args.k = view4(qbuf, s.hq * D, {B, RK, s.hkv, D}, st);
      args.v = view4(qbuf, (s.hq + s.hkv) * D, {B, RK, s.hkv, D}, st);
    } else {
      args.q = make(qbuf, t, s.in_layout, {B, RQ, s.hq, D});
      args.k = make(kbuf, t, s.in_layout, {B, RK, s.hkv, D});
      args.v = make(vbuf, t, s.in_layout, {B, RK, s.hkv, D});
    }
    args.out = make(outbuf, t, s.out_layout, {B, RQ, s.hq, D});

    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    const auto in_sequence = [&](int64_t row, bool is_q) {
      if (!s.varlen()) return true;
      return row < Spec::sum(is_q ? s.varlen_q : s.varlen_k);
    };
    fill(args.q, [&](int64_t s_row) { return in_sequence(s_row, true); }, [&] { return float(s.input_std) * normal(rng); });
    fill(args.k, [&](int64_t s_row) { return in_sequence(s_row, false); }, [&] { return float(s.input_std) * normal(rng); });
    fill(args.v, [&](int64_t s_row) { return in_sequence(s_row, false); }, [&] { return normal(rng); });

    if (s.lse != LseMode::none) {
      lsebuf = Buffer(DType::f32, B * s.hq * RQ + 3);
      lsebuf.poison();
      if (s.lse == LseMode::contiguous) {
        args.lse = view_n(lsebuf.at(1), DType::f32, {B, s.hq, RQ}, {s.hq * RQ, RQ, 1});
      } else {
        args.lse = view_n(lsebuf.at(1), DType::f32, {B, s.hq, RQ}, {RQ * s.hq, 1, s.hq});
      }
    }
    AttentionOptions& o = args.options;
    o.causal = s.mask.causal;
    o.window_left = s.mask.wl;
    o.window_right = s.mask.wr;
    o.sink_tokens = s.mask.sinks;
    o.softcap = s.softcap;
    o.scale = s.scale;
    if (s.sink_logits) {
      // Head pattern: random, strong (most mass on the sink), -inf (no effect).
      sinkbuf = Buffer(DType::f32, s.hq);
      for (int64_t h = 0; h < s.hq; ++h) {
        const float v = h % 3 == 0 ? normal(rng) : h % 3 == 1 ? 3.f : -std::numeric_limits<float>::infinity();
        store(DType::f32, sinkbuf.data(), h, v);
      }
      o.sink_logits = view_n(sinkbuf.data(), DType::f32, {s.hq}, {1});
    }
    if (s.varlen()) {
      cu_q = {0};
      cu_k = {0};
      for (size_t i = 0; i < s.varlen_q.size(); ++i) {
        cu_q.push_back(cu_q.back() + s.varlen_q[i]);
        cu_k.push_back(cu_k.back() + s.varlen_k[i]);
      }
      o.cu_seqlens_q = view_n(cu_q.data(), DType::i32, {int64_t(cu_q.size())}, {1});
      o.cu_seqlens_k = view_n(cu_k.data(), DType::i32, {int64_t(cu_k.size())}, {1});
    }
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  float sink_logit(int64_t h) const {
    return spec.sink_logits ? load(DType::f32, sinkbuf.bytes.data(), h) : -std::numeric_limits<float>::infinity();
  }

 private:
  static TensorView make(Buffer& buf, DType t, Layout l, std::array<int64_t, 4> shape) {
    const Placement pl = place(l, shape);
    buf = Buffer(t, pl.numel);
    buf.poison();
    return view4(buf, pl.offset, shape, pl.strides);
  }
  template <class Keep, class Gen>
  static void fill(const TensorView& t, Keep keep_row, Gen gen) {
    for (int64_t b = 0; b < t.shape[0]; ++b)
      for (int64_t r = 0; r < t.shape[1]; ++r)
        for (int64_t h = 0; h < t.shape[2]; ++h)
          for (int64_t c = 0; c < t.shape[3]; ++c) {
            const float v = gen();  // drawn even for skipped rows so the values do not depend on the lengths
            set4(t, b, r, h, c, keep_row(r) ? v : std::numeric_limits<float>::quiet_NaN());
          }
  }
};

// ---------------------------------------------------------------- the float64 oracles

// Results laid out like reference_forward_f64's: out [tb, rows_q, hq, d], lse [tb, hq, rows_q]; NaN where no
// sequence owns the row.
struct Result64 {
  std::vector<double> out, lse;
};

inline Result64 reference64(const Problem& p) {
  const Spec& s = p.spec;
  Result64 r;
  r.out.assign(size_t(s.tensor_batch() * s.rows_q() * s.hq * s.d), std::nan(""));
  r.lse.assign(size_t(s.tensor_batch() * s.hq * s.rows_q()), std::nan(""));
  flashlite::reference_forward_f64(p.args, r.out.data(), r.lse.data());
  return r;
}

// An independent textbook attention from the stored values and doc_visible, for checking the reference itself.
inline Result64 oracle64(const Problem& p) {
  const Spec& s = p.spec;
  const ForwardArgs& a = p.args;
  Result64 r;
  const int64_t RQ = s.rows_q(), D = s.d;
  r.out.assign(size_t(s.tensor_batch() * RQ * s.hq * D), std::nan(""));
  r.lse.assign(size_t(s.tensor_batch() * s.hq * RQ), std::nan(""));
  const double scale = s.scale ? *s.scale : 1.0 / std::sqrt(double(D));
  for (const Seq& q : sequences_of(s)) {
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t kh = h / (s.hq / s.hkv);
      for (int64_t i = 0; i < q.sq; ++i) {
        std::vector<double> logit;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < q.sk; ++j) {
          if (!doc_visible(s.mask, i, j, q.sq, q.sk)) continue;
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += double(get4(a.q, q.b, q.q0 + i, h, c)) * get4(a.k, q.b, q.k0 + j, kh, c);
          double x = dot * scale;
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          logit.push_back(x);
          keys.push_back(j);
        }
        const double sink = p.sink_logit(h);
        double m = sink;
        for (double x : logit) m = std::max(m, x);
        double total = 0;  // sum of exp(logit - m) over visible keys and the sink
        for (double x : logit) total += std::exp(x - m);
        if (m > -kInf) total += std::exp(sink - m);
        const int64_t row = q.q0 + i;
        double* o = &r.out[size_t(((q.b * RQ + row) * s.hq + h) * D)];
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0;
          for (size_t n = 0; n < keys.size(); ++n) acc += std::exp(logit[n] - m) / total * get4(a.v, q.b, q.k0 + keys[n], kh, c);
          o[c] = acc;
        }
        r.lse[size_t((q.b * s.hq + h) * RQ + row)] = total > 0 ? m + std::log(total) : -kInf;
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------- comparison

struct Tolerance {
  double max_abs = 1e-4;  // fp32 outputs
  double rel = 1e-2;      // fp16/bf16 outputs: ||out - ref|| / ||ref||
  double lse = 1e-4;      // |lse - ref| <= lse * max(1, |ref|)
};

struct Snapshot {
  std::vector<uint8_t> q, k, v, out, lse;
};
inline Snapshot snapshot(const Problem& p) {
  return {p.qbuf.bytes, p.kbuf.bytes, p.vbuf.bytes, p.outbuf.bytes, p.lsebuf.bytes};
}

// Checks out/lse of a backend run against the float64 reference (before: the buffers as they were before the run).
// Fails on: NaN/Inf anywhere in a computed element, errors over tolerance, non-zero output for a row with no visible
// key, LSE -inf mismatch, any byte outside the computed elements changed, any input byte changed.
inline void expect_matches(const Problem& p, const Result64& ref, const Snapshot& before, const Tolerance& tol) {
  const Spec& s = p.spec;
  const ForwardArgs& a = p.args;
  const int64_t RQ = s.rows_q(), D = s.d;
  const bool half = s.dtype != DType::f32;
  std::vector<uint8_t> expect_out = before.out, expect_lse = before.lse;  // computed elements copied in below
  double max_abs = 0, diff2 = 0, ref2 = 0, lse_err = 0;
  int64_t bad = 0, zero_violations = 0, lse_bad = 0;
  std::string first_bad, first_lse_bad;
  for (const Seq& q : sequences_of(s)) {
    for (int64_t i = 0; i < q.sq; ++i) {
      bool any_visible = false;
      for (int64_t j = 0; j < q.sk && !any_visible; ++j) any_visible = doc_visible(s.mask, i, j, q.sq, q.sk);
      const int64_t row = q.q0 + i;
      for (int64_t h = 0; h < s.hq; ++h) {
        for (int64_t c = 0; c < D; ++c) {
          const int64_t off = offset4(a.out, q.b, row, h, c);
          const size_t es = elem_size(s.dtype);
          const uint8_t* src = static_cast<const uint8_t*>(a.out.data) + off * int64_t(es);
          std::memcpy(expect_out.data() + (src - p.outbuf.bytes.data()), src, es);
          const double got = get4(a.out, q.b, row, h, c);
          const double want = ref.out[size_t(((q.b * RQ + row) * s.hq + h) * D + c)];
          const double e = std::fabs(got - want);
          if (!std::isfinite(got) || !(e <= (half ? 1e30 : tol.max_abs))) {
            if (bad++ == 0) {
              first_bad = "out[b" + std::to_string(q.b) + ", row " + std::to_string(row) + ", h" + std::to_string(h) +
                          ", c" + std::to_string(c) + "] = " + std::to_string(got) + ", reference " + std::to_string(want);
            }
          }
          if (std::isfinite(e)) max_abs = std::max(max_abs, e), diff2 += e * e;
          ref2 += want * want;
          if (!any_visible && got != 0.0) ++zero_violations;
        }
        if (a.lse.data) {
          const int64_t off = q.b * a.lse.strides[0] + h * a.lse.strides[1] + row * a.lse.strides[2];
          const float* src = static_cast<const float*>(a.lse.data) + off;
          std::memcpy(expect_lse.data() + (reinterpret_cast<const uint8_t*>(src) - p.lsebuf.bytes.data()), src, 4);
          const double got = *src, want = ref.lse[size_t((q.b * s.hq + h) * RQ + row)];
          const bool ok = std::isinf(want) ? got == want
                                           : std::isfinite(got) && std::fabs(got - want) <= tol.lse * std::max(1.0, std::fabs(want));
          if (std::isfinite(want) && std::isfinite(got)) lse_err = std::max(lse_err, std::fabs(got - want));
          if (!ok && lse_bad++ == 0) {
            first_lse_bad = "lse[b" + std::to_string(q.b) + ", h" + std::to_string(h) + ", row " + std::to_string(row) +
                            "] = " + std::to_string(got) + ", reference " + std::to_string(want);
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "non-finite or over-tolerance outputs; first: " << first_bad << " (max abs err " << max_abs << ")";
  if (half && ref2 > 0) {
    EXPECT_LT(std::sqrt(diff2 / ref2), tol.rel) << "relative error ||out - ref|| / ||ref||";
  }
  EXPECT_EQ(zero_violations, 0) << "rows with no visible key must be exactly zero";
  EXPECT_EQ(lse_bad, 0) << "LSE mismatches; first: " << first_lse_bad << " (max abs err " << lse_err << ")";
  EXPECT_TRUE(p.outbuf.bytes == expect_out) << "out: bytes outside the computed elements were written";
  EXPECT_TRUE(p.lsebuf.bytes == expect_lse) << "lse: bytes outside the computed elements were written";
  EXPECT_TRUE(p.qbuf.bytes == before.q && p.kbuf.bytes == before.k && p.vbuf.bytes == before.v) << "an input changed";
}

}  // namespace fltest
