// CPU prefill from a KV cache: each sequence's chunk runs through the tiled forward kernel (run_cpu_tiled, the same
// code and numerics as forward() on the CPU) as a batch-1 problem whose K/V are the cached sequence: a strided view
// of a contiguous cache, or a paged sequence gathered into a scratch buffer (one copy of its K/V, O(len) next to the
// O(chunk x len) attention).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace {

// Element `off` of a buffer of `dtype`, as a byte pointer.
template <class P>
P* at(P* base, DType dtype, int64_t off) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) + off * int64_t(dtype_size(dtype)));
}

// Sequence b of a paged cache, k or v, into dst (len, kv_heads, head_dim) contiguous.
void gather(const KvCacheDesc& c, int64_t b, bool use_v, std::vector<char>& dst) {
  const int64_t len = c.length(b), H = c.kv_heads, D = c.head_dim;
  const size_t row = size_t(D) * dtype_size(c.dtype);
  dst.resize(size_t(len * H) * row);
  const void* src = use_v ? c.v : c.k;
  for (int64_t j = 0; j < len; ++j)
    for (int64_t h = 0; h < H; ++h) std::memcpy(dst.data() + size_t(j * H + h) * row, at(src, c.dtype, c.offset(b, j, h, use_v)), row);
}

// Rows that see no key: zeros, and an LSE of the sink logit alone (it is the whole denominator), else -inf -- the
// float64 reference's rule (src/cpu/reference.cpp).
void write_keyless_rows(const AttentionProblem& s) {
  for (int64_t i = 0; i < s.seq_q; ++i)
    for (int64_t h = 0; h < s.q_heads; ++h) {
      for (int64_t e = 0; e < s.head_dim; ++e) store_from_float(s.out, s.dtype, i * s.out_stride.seq + h * s.out_stride.head + e, 0.f);
      if (s.lse) {
        s.lse[h * s.lse_stride_head + i * s.lse_stride_seq] = s.sink_logits ? s.sink_logits[h] : -INFINITY;
      }
    }
}

}  // namespace

void cpu_prefill(const PrefillProblem& p) {
  const KvCacheDesc& c = p.cache;
  const AttentionProblem& a = p.attn;
  std::vector<char> kbuf, vbuf;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = p.chunk(b), len = c.length(b);
    if (n == 0) continue;
    AttentionProblem s = a;  // one sequence: padded batch of 1
    s.batch = 1;
    s.seq_q = s.q_tensor_rows = n;
    s.seq_k = len;
    s.cu_seqlens_q = s.cu_seqlens_k = nullptr;
    const int64_t qb = p.ragged() ? 0 : b, r0 = p.q_row0(b);
    s.q = at(a.q, a.dtype, qb * a.q_stride.batch + r0 * a.q_stride.seq);
    s.out = at(a.out, a.dtype, qb * a.out_stride.batch + r0 * a.out_stride.seq);
    if (a.lse) s.lse = a.lse + qb * a.lse_stride_batch + r0 * a.lse_stride_seq;
    if (len == 0) {  // (decode only: prefill chunks never exceed the length) no key at all
      write_keyless_rows(s);
      continue;
    }
    if (!c.paged) {
      s.k = at(c.k, c.dtype, b * c.ks.s0);
      s.v = at(c.v, c.dtype, b * c.vs.s0);
    } else {
      gather(c, b, false, kbuf);
      gather(c, b, true, vbuf);
      s.k = kbuf.data();
      s.v = vbuf.data();
      s.k_stride = s.v_stride = {len * c.kv_heads * c.head_dim, c.kv_heads * c.head_dim, c.head_dim};
    }
    run_cpu_tiled(s);
  }
}

}  // namespace flashlite
