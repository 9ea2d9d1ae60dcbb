// CPU prefill from a KV cache: each sequence's chunk runs through the tiled forward kernel (run_cpu_tiled, the same
// code and numerics as forward() on the CPU) as a batch-1 problem whose K/V are the cached sequence: a strided view
// of a contiguous cache, or a paged sequence that the kernel reads through its page table (AttentionProblem::kv_pages:
// each key chunk is copied from its page runs into the kernel's tile scratch, as fp16/bf16 chunks are converted).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <vector>

#include "backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace {

constexpr int64_t kDecodeRowsPerSequence = 8;  // q rows per sequence up to which sequences run one per thread

// Element `off` of a buffer of `dtype`, as a byte pointer.
template <class P>
P* at(P* base, DType dtype, int64_t off) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) + off * int64_t(dtype_size(dtype)));
}

// Rows that see no key: zeros, and an LSE of the sink logit alone (it is the whole denominator), else -inf; a NaN or
// +inf sink logit makes the row NaN -- the float64 reference's rule (src/cpu/reference.cpp).
void write_keyless_rows(const AttentionProblem& s) {
  for (int64_t i = 0; i < s.seq_q; ++i)
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const float sink = s.sink_logits ? s.sink_logits[h] : -INFINITY;
      const bool poisoned = std::isnan(sink) || sink == INFINITY;
      for (int64_t e = 0; e < s.head_dim; ++e) {
        store_from_float(s.out, s.dtype, i * s.out_stride.seq + h * s.out_stride.head + e, poisoned ? NAN : 0.f);
      }
      if (s.lse) s.lse[h * s.lse_stride.head + i * s.lse_stride.seq] = poisoned ? NAN : sink;
    }
}

}  // namespace

void cpu_prefill(const PrefillProblem& p) {
  const KvCacheDesc& c = p.cache;
  const AttentionProblem& a = p.attn;
  // One batch-1 problem per sequence with keys; keyless rows are written here.
  std::vector<AttentionProblem> seqs;
  std::vector<KvPagesView> pages(size_t(c.paged ? c.batch : 0));  // stable addresses for AttentionProblem::kv_pages
  int64_t max_rows = 0;
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
    if (a.lse) s.lse = a.lse + qb * a.lse_stride.batch + r0 * a.lse_stride.seq;
    if (len == 0) {  // (decode only: prefill chunks never exceed the length) no key at all
      write_keyless_rows(s);
      continue;
    }
    if (!c.paged) {
      s.k = at(c.k, c.dtype, b * c.ks.batch);
      s.v = at(c.v, c.dtype, b * c.vs.batch);
    } else {  // the kernel reads the sequence's pages in place, a page run at a time (src/cpu/tiled.cpp)
      pages[size_t(b)] = KvPagesView{c.indices + c.indptr[b], c.capacity, c.ks.batch, c.vs.batch};
      s.k = c.k;
      s.v = c.v;
      s.k_stride = {0, c.ks.seq, c.ks.head};
      s.v_stride = {0, c.vs.seq, c.vs.head};
      s.kv_pages = &pages[size_t(b)];
    }
    max_rows = std::max(max_rows, n);
    seqs.push_back(s);
  }
  // Decode-shaped calls (a few rows per sequence) of several sequences: one thread per sequence, each call serial
  // (run_cpu_tiled stays on its thread inside a parallel region), instead of one small parallel region per sequence.
  // Longer chunks keep the kernel's own parallelism over heads and query tiles.
  const int64_t n_seqs = int64_t(seqs.size());
  if (n_seqs > 1 && max_rows <= kDecodeRowsPerSequence && omp_get_max_threads() > 1) {
    std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_seqs; ++i) {
      try {
        run_cpu_tiled(seqs[size_t(i)], plan_cpu_simd(seqs[size_t(i)]));
      } catch (...) {
#pragma omp critical(flashlite_cpu_prefill_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    return;
  }
  for (const AttentionProblem& s : seqs) run_cpu_tiled(s, plan_cpu_simd(s));
}

}  // namespace flashlite
