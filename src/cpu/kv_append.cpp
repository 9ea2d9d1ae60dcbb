// CPU append of new K/V into a cache (contiguous or paged), with optional rotary embedding of K and Q.
// Simple and exact: each row is converted to float64, rotated with float64 angles, stored once in the cache dtype.
#include <cmath>
#include <vector>

#include "common/problem.h"
#include "flashlite/rope.h"
#include "kv/kv_backends.h"

namespace flashlite {
namespace {

// Rotates one head row in place (float64): flashlite/rope.h's pairs and rotation; cs, sn: the token's cos / sin per
// pair (float64 angles).
void rotate(std::vector<double>& x, const std::vector<double>& cs, const std::vector<double>& sn, bool interleaved) {
  const int head_dim = int(x.size()), half = head_dim / 2;
  for (int c = 0; c < half; ++c) {
    const RopePairIndex i = rope_pair(c, head_dim, interleaved);
    const double xa = x[size_t(i.a)], xb = x[size_t(i.b)];
    x[size_t(i.a)] = rope_rotated_a(xa, xb, cs[size_t(c)], sn[size_t(c)]);
    x[size_t(i.b)] = rope_rotated_b(xa, xb, cs[size_t(c)], sn[size_t(c)]);
  }
}

}  // namespace

void cpu_kv_append(const AppendProblem& p) {
  const KvCacheDesc& c = p.cache;
  const int64_t D = c.head_dim;
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  if (p.rope.enabled) {
    for (int64_t i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = rope_frequency(p.rope.options, D, i);
  }
  std::vector<double> row(static_cast<size_t>(D)), cs(inv_freq.size()), sn(inv_freq.size());
  auto load_row = [&](const void* base, int64_t off) {
    for (int64_t e = 0; e < D; ++e) row[size_t(e)] = load_as_float(base, c.dtype, off + e);
  };
  auto store_row = [&](void* base, int64_t off) {
    for (int64_t e = 0; e < D; ++e) store_from_float(base, c.dtype, off + e, float(row[size_t(e)]));
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t first = c.length(b) - p.n_new;  // position of the first new token
    for (int64_t t = 0; t < p.n_new; ++t) {
      const int64_t pos = first + t;
      for (size_t i = 0; i < inv_freq.size() && p.rope.enabled; ++i) {  // once per token, for every head
        const double angle = double(pos) * inv_freq[i];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        load_row(p.k, b * p.k_st.batch + t * p.k_st.seq + h * p.k_st.head);
        if (p.rope.enabled) rotate(row, cs, sn, p.rope.interleaved);
        store_row(c.k, c.offset(b, pos, h, false));
        load_row(p.v, b * p.v_st.batch + t * p.v_st.seq + h * p.v_st.head);
        store_row(c.v, c.offset(b, pos, h, true));
      }
      for (int64_t h = 0; h < (p.q ? p.q_heads : 0); ++h) {
        load_row(p.q, b * p.q_st.batch + t * p.q_st.seq + h * p.q_st.head);
        rotate(row, cs, sn, p.rope.interleaved);
        store_row(p.q_out, b * p.qo_st.batch + t * p.qo_st.seq + h * p.qo_st.head);
      }
    }
  }
}

}  // namespace flashlite
