// CPU decode over a KV cache (contiguous or paged): the q_len new tokens of each sequence attend over its whole
// cache, with the shared mask predicate (src/common/mask.h). Simple and correct: per (sequence, kv head), each
// visible key row is converted once and used by all the rows of its GQA group (q heads x q positions).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/problem.h"
#include "kv/kv_backends.h"

namespace flashlite {

void cpu_decode(const DecodeProblem& p) {
  const KvCacheDesc& c = p.cache;
  const int64_t D = c.head_dim, G = p.group(), R = G * p.q_len;  // rows of one kv head: (q position, group head)
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t pairs = c.batch * c.kv_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t b = pair / c.kv_heads, kvh = pair % c.kv_heads;
    const int64_t L = c.length(b);
    std::vector<float> q(static_cast<size_t>(R * D)), krow(static_cast<size_t>(D));
    std::vector<double> scores(static_cast<size_t>(R * L), neg_inf), acc(static_cast<size_t>(R * D), 0.0);
    std::vector<double> row_max(static_cast<size_t>(R)), denom(static_cast<size_t>(R), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = r / G, h = kvh * G + r % G;
      for (int64_t e = 0; e < D; ++e) q[size_t(r * D + e)] = load_as_float(p.q, c.dtype, b * p.q_st.s0 + i * p.q_st.s1 + h * p.q_st.s2 + e);
      row_max[size_t(r)] = p.sink_logits ? double(p.sink_logits[h]) : neg_inf;
    }
    // Scores (masked: -inf).
    for (int64_t j = 0; j < L; ++j) {
      bool loaded = false;
      for (int64_t r = 0; r < R; ++r) {
        if (!key_visible(p.mask, r / G, j, p.q_len, L)) continue;
        if (!loaded) {
          const int64_t off = c.offset(b, j, kvh, false);
          for (int64_t e = 0; e < D; ++e) krow[size_t(e)] = load_as_float(c.k, c.dtype, off + e);
          loaded = true;
        }
        double dot = 0;
        for (int64_t e = 0; e < D; ++e) dot += double(q[size_t(r * D + e)]) * krow[size_t(e)];
        double s = dot * p.scale;
        if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
        scores[size_t(r * L + j)] = s;
        row_max[size_t(r)] = std::max(row_max[size_t(r)], s);
      }
    }
    // Softmax weights (unnormalised) and the weighted sum of V.
    for (int64_t r = 0; r < R; ++r) {
      if (row_max[size_t(r)] == neg_inf) continue;
      for (int64_t j = 0; j < L; ++j) {
        double& s = scores[size_t(r * L + j)];
        s = s == neg_inf ? 0.0 : std::exp(s - row_max[size_t(r)]);
        denom[size_t(r)] += s;
      }
    }
    for (int64_t j = 0; j < L; ++j) {
      bool loaded = false;
      for (int64_t r = 0; r < R; ++r) {
        const double w = row_max[size_t(r)] == neg_inf ? 0.0 : scores[size_t(r * L + j)];
        if (w == 0.0) continue;
        if (!loaded) {
          const int64_t off = c.offset(b, j, kvh, true);
          for (int64_t e = 0; e < D; ++e) krow[size_t(e)] = load_as_float(c.v, c.dtype, off + e);
          loaded = true;
        }
        for (int64_t e = 0; e < D; ++e) acc[size_t(r * D + e)] += w * krow[size_t(e)];
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = r / G, h = kvh * G + r % G;
      const double sink = p.sink_logits ? double(p.sink_logits[h]) : neg_inf;
      const double m = row_max[size_t(r)];
      // The sink logit joins the denominator only; a row with no visible key gets zeros.
      const double total = denom[size_t(r)] + (m != neg_inf && sink != neg_inf ? std::exp(sink - m) : 0.0);
      const double inv = denom[size_t(r)] > 0 ? 1.0 / total : 0.0;
      const int64_t o = b * p.o_st.s0 + i * p.o_st.s1 + h * p.o_st.s2;
      for (int64_t e = 0; e < D; ++e) store_from_float(p.out, c.dtype, o + e, float(acc[size_t(r * D + e)] * inv));
      if (p.lse) {
        p.lse[b * p.lse_sb + h * p.lse_sh + i * p.lse_ss] = total > 0 ? float(m + std::log(total)) : -INFINITY;
      }
    }
  }
}

}  // namespace flashlite
