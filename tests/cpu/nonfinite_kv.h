#pragma once
// The non-finite rule through the KV-cache decode API (tests/cpu/nonfinite_test.cpp on the CPU backend,
// tests/gpu/nonfinite_test.cpp on CUDA): a contiguous or paged cache (tests/kv/kv_test_util.h) with a sequence of 300
// tokens, an empty one and one of 77; q_len 2 under causal + window 40 + 2 sink tokens + sink logits; NaN / +inf / -inf
// put into the K or V row of a key the window hides, of a key both query rows see, of a key only the second row sees
// (causal), and into a sink logit. Checked against the float64 oracle (same NaN / inf pattern, finite values close) and,
// for rows the poison cannot reach, against the clean run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv_test_util.h"
#include "nonfinite_util.h"

namespace fltest::nonfinite {

inline kvtest::CacheSpec kv_cache_spec(bool paged, DType t) {
  kvtest::CacheSpec c;
  c.paged = paged;
  c.page_size = 16;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.dtype = t;
  c.lens = {300, 0, 77};
  return c;
}

inline kvtest::DecodeSpec kv_decode_spec() {
  kvtest::DecodeSpec d;
  d.q_heads = 8;
  d.q_len = 2;
  d.opt.causal = true;
  d.opt.window_left = 40;
  d.opt.sink_tokens = 2;
  d.sink_logits = true;
  return d;
}

// A poison in sequence 0's K or V row `key` (kv head 0, column 1), or in sink_logits[1].
struct KvPoison {
  std::string name;
  bool sink = false, is_k = false;
  int64_t key = 0;
  float value = kNaN;
};

inline std::vector<KvPoison> kv_poisons() {
  std::vector<KvPoison> out;
  for (float v : {kNaN, kInf, -kInf}) {
    const std::string tag = std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
    for (bool k : {false, true}) {
      const std::string kv = k ? "k" : "v";
      out.push_back({tag + " in " + kv + " of a key the window hides", false, k, 100, v});
      out.push_back({tag + " in " + kv + " of a key both rows see", false, k, 280, v});
      out.push_back({tag + " in " + kv + " of the last key (the first row cannot see it)", false, k, 299, v});
    }
    out.push_back({tag + " in a sink logit", true, false, 0, v});
  }
  return out;
}

inline float kv_put(kvtest::DecodeProblem& p, const KvPoison& z, float value) {
  if (z.sink) {
    const float old = load(DType::f32, p.sinkbuf.data(), 1);
    store(DType::f32, p.sinkbuf.data(), 1, value);
    return old;
  }
  kvtest::HostCache& c = p.cache;
  Buffer& buf = z.is_k ? c.kbuf : c.vbuf;
  const int64_t off = c.offset(0, z.key, 0) + 1;
  const float old = load(c.spec.dtype, buf.data(), off);
  store(c.spec.dtype, buf.data(), off, value);
  return old;
}

inline void kv_fill_outputs(kvtest::DecodeProblem& p) {
  for (int64_t i = 0; i < p.outbuf.numel(); ++i) store(p.outbuf.dtype, p.outbuf.data(), i, kSentinel);
  for (int64_t i = 0; i < p.lsebuf.numel(); ++i) store(DType::f32, p.lsebuf.data(), i, kSentinel);
}

// out [batch, q_len, q_heads, head_dim] and lse [batch, q_heads, q_len] from p's host buffers.
inline Outputs kv_read_outputs(const kvtest::DecodeProblem& p) {
  Outputs r;
  for (int64_t i = 0; i < p.args.out.numel(); ++i) r.out.push_back(load(p.outbuf.dtype, p.outbuf.bytes.data(), i));
  for (int64_t i = 0; i < p.lsebuf.numel(); ++i) r.lse.push_back(load(DType::f32, p.lsebuf.bytes.data(), i));
  return r;
}

// got against the oracle of every sequence, and rows the poison cannot reach against the clean run.
// masked_v_leaks: the latitude of may_leak (nonfinite_util.h) for the CUDA kernel: a V poison in column 1 of a key a
// row does not see may turn that row's column 1 NaN.
inline void kv_check(const kvtest::DecodeProblem& p, const KvPoison& z, const Outputs& clean, const Outputs& got,
                     bool masked_v_leaks = false) {
  const kvtest::HostCache& c = p.cache;
  const int64_t S = p.spec.q_len, H = p.spec.q_heads, D = c.spec.head_dim, group = H / c.spec.kv_heads;
  const AttentionOptions& o = p.spec.opt;
  const MaskSpec mask{o.causal, o.window_left, o.window_right, o.sink_tokens};
  Failures f;
  for (int64_t b = 0; b < c.batch; ++b) {
    const kvtest::Ref ref = kvtest::oracle(p, b);
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const bool reached = z.sink ? h == 1 : b == 0 && h / group == 0 && doc_visible(mask, i, z.key, S, c.len(b));
        const size_t l = size_t((b * H + h) * S + i);
        const double wl = ref.lse[size_t(h * S + i)];
        const double gl = got.lse[l];
        if (kind(gl) != kind(wl) || (kind(wl) == 3 && std::fabs(gl - wl) > 1e-4 * std::max(1.0, std::fabs(wl)))) {
          f.add("lse" + at(b, i, h) + " = " + std::to_string(gl) + ", reference " + std::to_string(wl));
        }
        if (!reached && !same(gl, clean.lse[l])) f.add("lse" + at(b, i, h) + " changed (unreachable by the poison)");
        for (int64_t e = 0; e < D; ++e) {
          const size_t x = size_t(((b * S + i) * H + h) * D + e);
          const double g = got.out[x], w = ref.out[size_t((i * H + h) * D + e)];
          const bool leak_ok = masked_v_leaks && !z.sink && !z.is_k && !reached && b == 0 && h / group == 0 && e == 1;
          if (leak_ok && std::isnan(g)) continue;
          if (kind(g) != kind(w) || (kind(w) == 3 && std::fabs(g - w) > out_tolerance(c.spec.dtype))) {
            f.add("out" + at(b, i, h, e) + " = " + std::to_string(g) + ", reference " + std::to_string(w));
          }
          if (!reached && !same(g, clean.out[x])) f.add("out" + at(b, i, h, e) + " changed (unreachable by the poison)");
        }
      }
  }
}

}  // namespace fltest::nonfinite
