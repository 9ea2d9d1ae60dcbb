#pragma once
// Helpers of the non-finite suites (tests/cpu/nonfinite_test.cpp, tests/gpu/nonfinite_test.cpp): the cases (every
// mask kind in prefill and decode shapes), the places a NaN or +-inf is put (q, the K or V row of a key that every /
// some / no query row sees, a sink logit), and the checks of the rule of include/flashlite/attention.h:
//   - rule_violations: what the rule says without any oracle: rows the poison cannot reach are unchanged (equal to the
//     clean run's); a NaN in q, a seen K row or a sink logit (or a +inf sink logit) turns the whole row and its LSE NaN;
//     a NaN/inf V element makes its own column non-finite, the other columns staying close to the clean run's, and
//     never reaches the LSE;
//   - reference_mismatches: every output and LSE against a float64 result with the same NaN / +inf / -inf pattern and
//     finite values within a tolerance (the backend against reference_forward_f64, or the reference against the
//     oracle below);
//   - rule_oracle: textbook attention in float64 written again from the rule's text, to check the reference itself.
// Every run starts from outputs poisoned with a finite sentinel (NaN is an expected answer here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace fltest::nonfinite {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kSentinel = -777.0f;  // written to every output element before a call


struct NfCase {
  std::string name;
  Spec spec;
  int64_t q_row = -1;  // the query row q's poison goes to (-1: the last row of sequence 0)
};

// The mask kinds (none, causal, window, sink tokens, sink logits, softcap, GQA 2/3/8, rows without keys) in prefill
// shapes (several query and key tiles: the tiled kernels) and decode shapes (q_len 1-2 over 600-700 keys: the cpu
// small path, and more than one fold of a long row). gpu: head_dims the fused CUDA kernel takes (32, 64, 128).
inline std::vector<NfCase> nf_cases(DType t, bool gpu) {
  const auto shape = [t](int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
    Spec s;
    s.dtype = t, s.seq_q = sq, s.seq_k = sk, s.hq = hq, s.hkv = hkv, s.d = d;
    return s;
  };
  std::vector<NfCase> cs;
  Spec full = shape(70, 150, 2, 2, 32);
  full.batch = 2;  // the second sequence never sees the poison
  cs.push_back({"full", full});
  Spec causal = shape(70, 150, 4, 2, gpu ? 128 : 40);
  causal.mask.causal = true;
  cs.push_back({"causal", causal});
  Spec window = shape(70, 150, 2, 1, 64);
  window.mask = {false, 20, 5, 0};
  window.in_layout = Layout::padded;  // NaN between heads and rows: never to be read
  cs.push_back({"window", window});
  Spec sinks = shape(70, 150, 2, 2, 32);
  sinks.mask = {true, 16, -1, 4};
  cs.push_back({"sinktokens", sinks});
  Spec logits = shape(70, 150, 3, 1, 64);
  logits.mask.causal = true;
  logits.sink_logits = true;
  cs.push_back({"sinklogits", logits});
  Spec cap = shape(70, 150, 2, 2, 64);
  cap.mask.causal = true;
  cap.softcap = 5.0;
  cs.push_back({"softcap", cap});
  Spec gqa = shape(20, 90, 8, 1, 32);
  gqa.mask.causal = true;
  cs.push_back({"gqa8", gqa});
  Spec keyless = shape(80, 50, 2, 2, 64);  // causal with seq_q > seq_k: the first 30 rows see no key
  keyless.mask.causal = true;
  keyless.sink_logits = true;
  cs.push_back({"keyless", keyless, 0});
  Spec decode = shape(1, 700, 8, 2, 64);
  decode.mask.causal = true;
  cs.push_back({"decode", decode});
  Spec decwin = shape(2, 600, 8, 2, gpu ? 128 : 32);
  decwin.mask = {true, 100, -1, 3};
  decwin.sink_logits = true;
  decwin.softcap = 20.0;
  cs.push_back({"decodewindow", decwin});
  return cs;
}

// ---------------------------------------------------------------- where the poison goes

enum class Site { q, k_all, k_some, k_none, v_all, v_some, v_none, sink };

inline const char* site_name(Site s) {
  switch (s) {
    case Site::q: return "q";
    case Site::k_all: return "k of a key every row sees";
    case Site::k_some: return "k of a key some rows see";
    case Site::k_none: return "k of a key no row sees";
    case Site::v_all: return "v of a key every row sees";
    case Site::v_some: return "v of a key some rows see";
    case Site::v_none: return "v of a key no row sees";
    case Site::sink: return "sink logit";
  }
  return "?";
}

inline bool is_k(Site s) { return s == Site::k_all || s == Site::k_some || s == Site::k_none; }
inline bool is_v(Site s) { return s == Site::v_all || s == Site::v_some || s == Site::v_none; }

// One poisoned element: q [0, row, head, col], k/v [0, key, kv head 0, col], or sink_logits[head].
struct Poison {
  Site site;
  float value;
  int64_t row = 0, head = 0, key = 0, col = 1;
};

inline std::string describe(const Poison& z) {
  std::string v = std::isnan(z.value) ? "NaN" : z.value > 0 ? "+inf" : "-inf";
  std::string at = z.site == Site::q ? " (row " + std::to_string(z.row) + ", head " + std::to_string(z.head) + ")"
                   : z.site == Site::sink ? " (head " + std::to_string(z.head) + ")"
                                          : " (key " + std::to_string(z.key) + ")";
  return v + " in " + site_name(z.site) + at;
}

// Rows of sequence 0 that see key j / that see any key.
inline int64_t rows_seeing(const Spec& s, int64_t j) {
  int64_t n = 0;
  for (int64_t i = 0; i < s.seq_q; ++i) n += doc_visible(s.mask, i, j, s.seq_q, s.seq_k);
  return n;
}
inline bool row_sees_a_key(const Spec& s, int64_t i) {
  for (int64_t j = 0; j < s.seq_k; ++j)
    if (doc_visible(s.mask, i, j, s.seq_q, s.seq_k)) return true;
  return false;
}

// Every site the case has (a key no row sees only exists under some masks) times NaN, +inf, -inf.
inline std::vector<Poison> poisons(const NfCase& c) {
  const Spec& s = c.spec;
  int64_t with_keys = 0;
  for (int64_t i = 0; i < s.seq_q; ++i) with_keys += row_sees_a_key(s, i);
  std::vector<int64_t> seen(size_t(s.seq_k));
  for (int64_t j = 0; j < s.seq_k; ++j) seen[size_t(j)] = rows_seeing(s, j);
  int64_t k_all = -1, k_some = -1, k_none = -1;
  for (int64_t j = 0; j < s.seq_k; ++j) {
    const int64_t n = seen[size_t(j)];
    if (n == with_keys && k_all < 0) k_all = j;
    // Some: the key seen by about half the rows (inside a tile the mask cuts).
    const auto off_half = [&](int64_t x) { return std::abs(2 * x - with_keys); };
    if (n > 0 && n < with_keys && (k_some < 0 || off_half(n) < off_half(seen[size_t(k_some)]))) k_some = j;
  }
  // None: the unseen key nearest a seen one (in a loaded tile, not one the kernels skip).
  int64_t best = s.seq_k + 1;
  for (int64_t j = 0; j < s.seq_k; ++j) {
    if (seen[size_t(j)] != 0) continue;
    for (int64_t x = 0; x < s.seq_k; ++x) {
      if (seen[size_t(x)] > 0 && std::abs(x - j) < best) best = std::abs(x - j), k_none = j;
    }
  }
  std::vector<Poison> out;
  for (float v : {kNaN, kInf, -kInf}) {
    out.push_back({Site::q, v, c.q_row >= 0 ? c.q_row : s.seq_q - 1, s.hq - 1});
    for (auto [site, key] : {std::pair{Site::k_all, k_all}, {Site::k_some, k_some}, {Site::k_none, k_none},
                             {Site::v_all, k_all}, {Site::v_some, k_some}, {Site::v_none, k_none}}) {
      if (key >= 0) out.push_back({site, v, 0, 0, key});
    }
    if (s.sink_logits) out.push_back({Site::sink, v, 0, std::min<int64_t>(1, s.hq - 1)});
  }
  return out;
}

// Writes value at the poison's element of p's host buffers; returns what was there.
inline float put(Problem& p, const Poison& z, float value) {
  const ForwardArgs& a = p.args;
  float old;
  if (z.site == Site::sink) {
    old = load(DType::f32, p.sinkbuf.data(), z.head);
    store(DType::f32, p.sinkbuf.data(), z.head, value);
  } else {
    const TensorView& t = z.site == Site::q ? a.q : is_k(z.site) ? a.k : a.v;
    const int64_t row = z.site == Site::q ? z.row : z.key, head = z.site == Site::q ? z.head : 0;
    old = get4(t, 0, row, head, z.col);
    set4(t, 0, row, head, z.col, value);
  }
  return old;
}

// Whether the poison can reach query row i (of batch/sequence b) of q head h: a key's poison reaches the rows that see
// the key (q heads of kv head 0); q's its own row when that row sees a key; a sink logit's every row of its head.
inline bool reaches(const Spec& s, const Poison& z, int64_t b, int64_t i, int64_t h) {
  if (b != 0) return false;
  switch (z.site) {
    case Site::q: return i == z.row && h == z.head && row_sees_a_key(s, i);
    case Site::sink: return h == z.head;
    default: return h / (s.hq / s.hkv) == 0 && doc_visible(s.mask, i, z.key, s.seq_q, s.seq_k);
  }
}

// ---------------------------------------------------------------- outputs

// out [tensor_batch, rows_q, hq, d] and lse [tensor_batch, hq, rows_q], read from p's host buffers (float64: the
// reference's own results are compared too).
struct Outputs {
  std::vector<double> out, lse;
};

inline void fill_outputs(Problem& p, float value) {
  for (int64_t i = 0; i < p.outbuf.numel(); ++i) store(p.outbuf.dtype, p.outbuf.data(), i, value);
  for (int64_t i = 0; i < p.lsebuf.numel(); ++i) store(DType::f32, p.lsebuf.data(), i, value);
}

inline Outputs read_outputs(const Problem& p) {
  const Spec& s = p.spec;
  const ForwardArgs& a = p.args;
  Outputs r;
  for (int64_t b = 0; b < s.tensor_batch(); ++b)
    for (int64_t i = 0; i < s.rows_q(); ++i)
      for (int64_t h = 0; h < s.hq; ++h)
        for (int64_t c = 0; c < s.d; ++c) r.out.push_back(get4(a.out, b, i, h, c));
  for (int64_t b = 0; b < s.tensor_batch(); ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < s.rows_q(); ++i) {
        r.lse.push_back(load(DType::f32, a.lse.data, b * a.lse.strides[0] + h * a.lse.strides[1] + i * a.lse.strides[2]));
      }
  return r;
}

// ---------------------------------------------------------------- checks

inline bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// NaN, +inf, -inf or finite.
inline int kind(double x) { return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3; }

// Collects failures, reporting the first few in full.
struct Failures {
  int count = 0;
  void add(const std::string& what) {
    if (count++ < 4) ADD_FAILURE() << what;
  }
  ~Failures() {
    if (count > 4) ADD_FAILURE() << "... and " << count - 4 << " more";
  }
};

inline std::string at(int64_t b, int64_t i, int64_t h, int64_t c = -1) {
  return "[b" + std::to_string(b) + ", row " + std::to_string(i) + ", head " + std::to_string(h) +
         (c >= 0 ? ", col " + std::to_string(c) : "") + "]";
}

// Absolute tolerance of an output element of dtype t (values are weighted means of N(0, 1) entries).
inline double out_tolerance(DType t) { return t == DType::f32 ? 1e-4 : t == DType::f16 ? 1e-2 : 5e-2; }

// The rule, with the clean run (no poison, same backend) as the only other input.
// The one latitude of the rule (docs/numerics.md): on the CUDA kernels a NaN / inf V element of a key that a row does
// not see may still turn that row's same column NaN (a masked key's weight 0 times the element, as in torch SDPA);
// only rows of the poisoned sequence and kv head, never another column, never the LSE.
inline bool may_leak(const Spec& s, const Poison& z, int64_t b, int64_t h, int64_t c) {
  return is_v(z.site) && b == 0 && h / (s.hq / s.hkv) == 0 && c == z.col;
}

// masked_v_leaks: the backend takes the latitude above (the CUDA kernels); the CPU backends do not.
inline void rule_violations(const Problem& p, const Poison& z, const Outputs& clean, const Outputs& got,
                            bool masked_v_leaks = false) {
  const Spec& s = p.spec;
  const int64_t RQ = s.rows_q(), D = s.d;
  const bool nan = std::isnan(z.value);
  const bool poisons_row = (nan && !is_v(z.site)) || (z.site == Site::sink && z.value > 0);
  const auto value = [](const char* what, const std::string& where, double g) {
    return what + where + " = " + std::to_string(g);
  };
  Failures f;
  for (int64_t b = 0; b < s.tensor_batch(); ++b)
    for (int64_t i = 0; i < RQ; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        const size_t o = size_t(((b * RQ + i) * s.hq + h) * D), l = size_t((b * s.hq + h) * RQ + i);
        const bool hit = reaches(s, z, b, i, h);
        if ((!hit || is_v(z.site)) && !same(got.lse[l], clean.lse[l])) {  // the LSE never depends on V
          f.add(value("lse", at(b, i, h), got.lse[l]) + ", clean run " + std::to_string(clean.lse[l]));
        }
        if (hit && poisons_row && !std::isnan(got.lse[l])) f.add(value("lse", at(b, i, h), got.lse[l]) + "; expected NaN");
        for (int64_t c = 0; c < D; ++c) {
          const double g = got.out[o + size_t(c)], want = clean.out[o + size_t(c)];
          const std::string where = at(b, i, h, c);
          if (!hit) {
            if (masked_v_leaks && may_leak(s, z, b, h, c) && std::isnan(g)) continue;
            if (!same(g, want)) f.add(value("out", where, g) + ", clean run " + std::to_string(want) + " (unreachable)");
          } else if (is_v(z.site) && c != z.col) {  // the same sum, perhaps in another order
            if (!(std::fabs(g - want) <= out_tolerance(s.dtype))) {
              f.add(value("out", where, g) + ", clean run " + std::to_string(want) + " (another column)");
            }
          } else if (is_v(z.site)) {
            if (nan ? !std::isnan(g) : std::isfinite(g)) {
              f.add(value("out", where, g) + "; expected " + (nan ? "NaN" : "non-finite"));
            }
          } else if (poisons_row && !std::isnan(g)) {
            f.add(value("out", where, g) + "; expected NaN");
          }
        }
      }
}

// got against want (float64): the same NaN / +inf / -inf pattern, finite values within out_tol (absolute)
// and lse_tol (relative to max(1, |lse|)).
// leak: the V poison whose latitude the backend takes (see may_leak), or null.
inline void reference_mismatches(const Spec& s, const Outputs& got, const Result64& want, double out_tol,
                                 double lse_tol, const Poison* leak = nullptr) {
  const int64_t RQ = s.rows_q(), D = s.d;
  Failures f;
  for (int64_t b = 0; b < s.tensor_batch(); ++b)
    for (int64_t i = 0; i < RQ; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        const size_t l = size_t((b * s.hq + h) * RQ + i);
        const double gl = got.lse[l], wl = want.lse[l];
        if (kind(gl) != kind(wl) || (kind(wl) == 3 && std::fabs(gl - wl) > lse_tol * std::max(1.0, std::fabs(wl)))) {
          f.add("lse" + at(b, i, h) + " = " + std::to_string(gl) + ", expected " + std::to_string(wl));
        }
        for (int64_t c = 0; c < D; ++c) {
          const size_t o = size_t(((b * RQ + i) * s.hq + h) * D + c);
          const double g = got.out[o], w = want.out[o];
          if (leak && may_leak(s, *leak, b, h, c) && std::isnan(g)) continue;
          if (kind(g) != kind(w) || (kind(w) == 3 && std::fabs(g - w) > out_tol)) {
            f.add("out" + at(b, i, h, c) + " = " + std::to_string(g) + ", expected " + std::to_string(w));
          }
        }
      }
}

inline Outputs as_outputs(const Result64& r) { return {r.out, r.lse}; }

// The rule's text as code, in float64, from the stored inputs and doc_visible: scores of the visible keys in IEEE
// arithmetic; a NaN or +inf score or sink logit gives a NaN row and LSE; a row without a finite score gives zeros and
// the sink logit (or -inf) as LSE; otherwise softmax over the finite scores and the sink, -inf scores weighing 0, and
// the weighted sum of every visible V row (0 * inf = NaN).
inline Result64 rule_oracle(const Problem& p) {
  const Spec& s = p.spec;
  const ForwardArgs& a = p.args;
  const int64_t RQ = s.rows_q(), D = s.d;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const double scale = s.scale ? *s.scale : 1.0 / std::sqrt(double(D));
  Result64 r;
  r.out.assign(size_t(s.tensor_batch() * RQ * s.hq * D), nan);
  r.lse.assign(size_t(s.tensor_batch() * s.hq * RQ), nan);
  for (const Seq& q : sequences_of(s))
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < q.sq; ++i) {
        const int64_t kh = h / (s.hq / s.hkv);
        const double sink = p.sink_logit(h);
        std::vector<std::pair<int64_t, double>> seen;  // (key, score)
        bool bad = std::isnan(sink) || sink == inf, any_finite = false;
        double m = sink;
        for (int64_t j = 0; j < q.sk; ++j) {
          if (!doc_visible(s.mask, i, j, q.sq, q.sk)) continue;
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += double(get4(a.q, q.b, q.q0 + i, h, c)) * get4(a.k, q.b, q.k0 + j, kh, c);
          double x = dot * scale;
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          seen.push_back({j, x});
          bad = bad || std::isnan(x) || x == inf;
          if (std::isfinite(x)) any_finite = true, m = std::max(m, x);
        }
        double* o = &r.out[size_t(((q.b * RQ + q.q0 + i) * s.hq + h) * D)];
        double& lse = r.lse[size_t((q.b * s.hq + h) * RQ + q.q0 + i)];
        if (bad) {
          std::fill(o, o + D, nan);
          lse = nan;
        } else if (!any_finite) {
          std::fill(o, o + D, 0.0);
          lse = sink;
        } else {
          double z = sink == -inf ? 0.0 : std::exp(sink - m);
          for (auto& [j, x] : seen) z += std::exp(x - m);
          for (int64_t c = 0; c < D; ++c) {
            double acc = 0;
            for (auto& [j, x] : seen) acc += std::exp(x - m) / z * get4(a.v, q.b, q.k0 + j, kh, c);
            o[c] = acc;
          }
          lse = m + std::log(z);
        }
      }
  return r;
}

// ---------------------------------------------------------------- long rows

// One q head over n keys whose scores are all equal (every K row the same: one row read with seq stride 0, or
// materialised for kernels that want real strides), V uniform in [0, 2): the exact output of a row is the mean of the
// V rows it sees (causal rows see a prefix), summed in float64 here.
struct LongRow {
  int64_t rows, n, d;
  bool causal;
  Buffer q, k, v, out, lse;
  std::vector<double> want;  // (rows, d) mean of the V rows each row sees
  ForwardArgs args;

  LongRow(int64_t rows_, int64_t n_, int64_t d_, bool causal_, DType t = DType::f32, bool broadcast_k = true)
      : rows(rows_), n(n_), d(d_), causal(causal_), q(t, rows * d), k(t, (broadcast_k ? 1 : n) * d), v(t, n * d),
        out(t, rows * d), lse(DType::f32, rows) {
    std::mt19937_64 rng(seed_of("long row"));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> uni(0.f, 2.f);
    for (int64_t i = 0; i < rows * d; ++i) store(t, q.data(), i, normal(rng));
    for (int64_t c = 0; c < d; ++c) store(t, k.data(), c, normal(rng));
    for (int64_t j = 1; j < k.numel() / d; ++j) std::memcpy(k.at(j * d), k.at(0), size_t(d) * elem_size(t));
    want.assign(size_t(rows * d), 0.0);
    std::vector<double> sum(size_t(d), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < d; ++c) {
        store(t, v.data(), j * d + c, uni(rng));
        sum[size_t(c)] += load(t, v.data(), j * d + c);
      }
      for (int64_t i = 0; i < rows; ++i) {
        if (seen(i) != j + 1) continue;
        for (int64_t c = 0; c < d; ++c) want[size_t(i * d + c)] = sum[size_t(c)] / double(j + 1);
      }
    }
    out.poison();
    lse.poison();
    args.q = view_n(q.data(), t, {1, rows, 1, d}, {rows * d, d, d, 1});
    args.k = view_n(k.data(), t, {1, n, 1, d}, {k.numel(), broadcast_k ? 0 : d, d, 1});
    args.v = view_n(v.data(), t, {1, n, 1, d}, {n * d, d, d, 1});
    args.out = view_n(out.data(), t, {1, rows, 1, d}, {rows * d, d, d, 1});
    args.lse = view_n(lse.data(), DType::f32, {1, 1, rows}, {rows, rows, 1});
    for (TensorView* tv : {&args.q, &args.k, &args.v, &args.out, &args.lse}) tv->device = Device::cpu();
    args.options.causal = causal;
  }
  LongRow(const LongRow&) = delete;
  LongRow& operator=(const LongRow&) = delete;

  // Keys row i sees (bottom-right causal).
  int64_t seen(int64_t i) const { return causal ? i + n - rows + 1 : n; }

  // Max over rows of ||out - mean V|| / ||mean V||, and of |lse - (score + log keys)| / max(1, |lse|), from outputs
  // laid out as out (rows, d) and lse (rows).
  std::pair<double, double> errors(const uint8_t* out_bytes, const uint8_t* lse_bytes) const {
    double out_err = 0, lse_err = 0;
    for (int64_t i = 0; i < rows; ++i) {
      double d2 = 0, r2 = 0, s = 0;
      for (int64_t c = 0; c < d; ++c) {
        const double w = want[size_t(i * d + c)], got = load(out.dtype, out_bytes, i * d + c);
        d2 += (got - w) * (got - w), r2 += w * w;
        s += double(load(q.dtype, q.bytes.data(), i * d + c)) * load(k.dtype, k.bytes.data(), c);
      }
      const double want_lse = s / std::sqrt(double(d)) + std::log(double(seen(i)));
      const double got_lse = load(DType::f32, lse_bytes, i);
      out_err = std::max(out_err, std::isfinite(d2) ? std::sqrt(d2 / r2) : 1e30);
      const double lse_rel = std::fabs(got_lse - want_lse) / std::max(1.0, std::fabs(want_lse));
      lse_err = std::max(lse_err, std::isfinite(got_lse) ? lse_rel : 1e30);
    }
    return {out_err, lse_err};
  }
};

}  // namespace fltest::nonfinite
