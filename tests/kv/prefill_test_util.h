#pragma once
// Helpers of the prefill tests: a prefill problem over a HostCache (kv_test_util.h: NaN outside the held tokens,
// shuffled non-contiguous pages), padded or ragged q (cu_seqlens_q, rows past the last chunk left NaN), outputs
// poisoned with NaN, the float64 oracle per sequence (reference_forward_f64 over its K/V gathered into plain
// [1, len, kv_heads, head_dim] tensors, q = its chunk) and the checks.
#include <functional>

#include "kv_test_util.h"

namespace kvtest {

using flashlite::PrefillArgs;

struct PrefillSpec {
  int64_t q_heads = 4;
  bool ragged = false;
  std::vector<int32_t> chunks;  // ragged: query rows per sequence (each <= its length)
  int64_t q_len = 1;            // padded: rows of every sequence
  int64_t extra_rows = 3;       // ragged: rows of q / out past the last chunk (never written)
  AttentionOptions opt;         // causal, window, sinks, softcap, scale (sink_logits filled here)
  bool sink_logits = false;
  bool lse = true;
  bool padded_out = false;      // out with a gap after each head (its bytes stay NaN)
};

struct PrefillProblem {
  PrefillSpec spec;
  HostCache& cache;
  std::vector<int32_t> cu;  // ragged: cumulative chunk offsets
  int64_t rows = 0;         // q rows in the tensor: ragged total (+ extra), padded q_len
  Buffer qbuf, outbuf, lsebuf, sinkbuf;
  PrefillArgs args;

  PrefillProblem(HostCache& c, const PrefillSpec& s, uint64_t seed) : spec(s), cache(c) {
    const int64_t B = c.batch, H = s.q_heads, D = c.spec.head_dim;
    const DType t = c.spec.dtype;
    std::mt19937_64 rng(seed ^ 0x51ed270b27a5e3ull);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int64_t nb = s.ragged ? 1 : B;  // tensor batch
    if (s.ragged) {
      cu = {0};
      for (int32_t n : s.chunks) cu.push_back(cu.back() + n);
      rows = cu.back() + s.extra_rows;
    } else {
      rows = s.q_len;
    }
    qbuf = Buffer(t, std::max<int64_t>(nb * rows * H * D, 1));
    for (int64_t i = 0; i < qbuf.numel(); ++i) fltest::store(t, qbuf.data(), i, normal(rng));
    const int64_t hs = s.padded_out ? D + 8 : D;
    outbuf = Buffer(t, std::max<int64_t>(nb * rows * H * hs, 1));
    outbuf.poison();
    args.q = fltest::view_n(qbuf.data(), t, {nb, rows, H, D}, {rows * H * D, H * D, D, 1});
    args.out = fltest::view_n(outbuf.data(), t, {nb, rows, H, D}, {rows * H * hs, H * hs, hs, 1});
    if (s.lse) {
      lsebuf = Buffer(DType::f32, std::max<int64_t>(nb * H * rows, 1));
      lsebuf.poison();
      args.lse = fltest::view_n(lsebuf.data(), DType::f32, {nb, H, rows}, {H * rows, rows, 1});
    }
    args.cache = c.view;
    args.options = s.opt;
    if (s.ragged) args.options.cu_seqlens_q = i32_view(cu);
    if (s.sink_logits) args.options.sink_logits = fill_sink_logits(sinkbuf, H, rng, normal);
  }
  PrefillProblem(const PrefillProblem&) = delete;
  PrefillProblem& operator=(const PrefillProblem&) = delete;

  int64_t chunk(int64_t b) const { return spec.ragged ? spec.chunks[size_t(b)] : spec.q_len; }
  // Element offset of q / out row i of sequence b, head h (strides of the views).
  int64_t row_offset(const TensorView& v, int64_t b, int64_t i, int64_t h) const {
    return spec.ragged ? (cu[size_t(b)] + i) * v.strides[1] + h * v.strides[2] : b * v.strides[0] + i * v.strides[1] + h * v.strides[2];
  }
  int64_t lse_offset(int64_t b, int64_t i, int64_t h) const {
    const TensorView& l = args.lse;
    return spec.ragged ? h * l.strides[1] + (cu[size_t(b)] + i) * l.strides[2] : b * l.strides[0] + h * l.strides[1] + i * l.strides[2];
  }
};

// float64 oracle for sequence b: out [n, q_heads, D], lse [q_heads, n].
inline Ref prefill_oracle(const PrefillProblem& p, int64_t b) {
  const int64_t D = p.cache.spec.head_dim, n = p.chunk(b), Hq = p.spec.q_heads;
  const DType t = p.cache.spec.dtype;
  const size_t es = fltest::elem_size(t);
  Buffer q(t, std::max<int64_t>(n, 1) * Hq * D);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < Hq; ++h)
      std::memcpy(q.at((i * Hq + h) * D), p.qbuf.bytes.data() + p.row_offset(p.args.q, b, i, h) * int64_t(es), size_t(D) * es);
  return reference_over_sequence(p.cache, b, q, n, Hq, p.spec.opt, p.spec.sink_logits ? &p.sinkbuf : nullptr);
}

// Compares out / lse (host copies in p's buffers) with the oracle; every byte of out / lse outside the chunks' rows
// must be as before the run (`out_before`, `lse_before`).
inline void expect_prefill_matches(const PrefillProblem& p, const std::vector<uint8_t>& out_before,
                                   const std::vector<uint8_t>& lse_before, const Tol& tol = {}) {
  const HostCache& c = p.cache;
  const int64_t Hq = p.spec.q_heads, D = c.spec.head_dim;
  const DType t = c.spec.dtype;
  const size_t es = fltest::elem_size(t);
  std::vector<uint8_t> expect = out_before, expect_lse = lse_before;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = p.chunk(b), L = c.len(b);
    SCOPED_TRACE("sequence " + std::to_string(b) + " (length " + std::to_string(L) + ", chunk " + std::to_string(n) + ")");
    const Ref r = prefill_oracle(p, b);
    SequenceCheck check{t, tol};
    const fltest::MaskSpec m{p.spec.opt.causal, p.spec.opt.window_left, p.spec.opt.window_right, p.spec.opt.sink_tokens};
    for (int64_t i = 0; i < n; ++i) {
      bool sees = false;
      for (int64_t j = 0; j < L && !sees; ++j) sees = fltest::doc_visible(m, i, j, n, L);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t off = p.row_offset(p.args.out, b, i, h);
        std::memcpy(expect.data() + off * int64_t(es), p.outbuf.bytes.data() + off * int64_t(es), size_t(D) * es);
        check.row(p.outbuf.bytes.data(), off, &r.out[size_t((i * Hq + h) * D)], D, sees, i, h);
        if (p.args.lse.data) {
          const int64_t lo = p.lse_offset(b, i, h);
          std::memcpy(expect_lse.data() + lo * 4, p.lsebuf.bytes.data() + lo * 4, 4);
          check.lse(fltest::load(DType::f32, p.lsebuf.bytes.data(), lo), r.lse[size_t(h * n + i)], i, h);
        }
      }
    }
    check.finish();
  }
  EXPECT_TRUE(p.outbuf.bytes == expect) << "out: bytes outside the chunks' rows were written";
  if (p.args.lse.data) {
    EXPECT_TRUE(p.lsebuf.bytes == expect_lse) << "lse: entries outside the chunks' rows were written";
  }
}

// ------------------------------------------------------------------------------------------------ the test grid

struct PrefillCase {
  std::string name;
  bool paged = true;
  int64_t page_size = 16;
  DType dtype = DType::bf16;
  int64_t head_dim = 64, kv_heads = 2, q_heads = 8;
  std::vector<int32_t> lens;    // cached tokens per sequence (after the append)
  std::vector<int32_t> chunks;  // ragged chunk per sequence; empty: padded with q_len
  int64_t q_len = 1;
  AttentionOptions opt;
  bool sink_logits = false;
  bool padded = false;  // cache and out with gaps (strides not packed)
};

inline CacheSpec cache_of(const PrefillCase& t) {
  CacheSpec s;
  s.paged = t.paged;
  s.page_size = t.page_size;
  s.kv_heads = t.kv_heads;
  s.head_dim = t.head_dim;
  s.dtype = t.dtype;
  s.lens = t.lens;
  s.padded = t.padded;
  return s;
}

inline PrefillSpec spec_of(const PrefillCase& t) {
  PrefillSpec s;
  s.q_heads = t.q_heads;
  s.ragged = !t.chunks.empty();
  s.chunks = t.chunks;
  s.q_len = t.q_len;
  s.opt = t.opt;
  s.sink_logits = t.sink_logits;
  s.padded_out = t.padded;
  return s;
}

inline AttentionOptions causal_opt() {
  AttentionOptions o;
  o.causal = true;
  return o;
}
inline AttentionOptions window_opt(int left, int sinks, bool causal = true) {
  AttentionOptions o;
  o.causal = causal;
  o.window_left = left;
  o.sink_tokens = sinks;
  return o;
}

}  // namespace kvtest

namespace kvtest {

// The cases both backends run (the CUDA suite adds long sequences and more page sizes). Lengths and chunks are
// chosen to cross page boundaries (chunks that start mid-page and span several pages), include 1-token sequences and
// chunks, empty chunks, windows that cross pages, sink tokens, GQA 1 / 3 / 4 / 8 and MQA.
inline std::vector<PrefillCase> prefill_grid(bool cpu) {
  std::vector<PrefillCase> v;
  const std::vector<DType> dtypes = cpu ? std::vector<DType>{DType::bf16, DType::f16, DType::f32}
                                        : std::vector<DType>{DType::bf16, DType::f16};
  const std::vector<int64_t> dims = cpu ? std::vector<int64_t>{64, 80} : std::vector<int64_t>{64, 128};
  for (DType t : dtypes) {
    const std::string tn = t == DType::bf16 ? "bf16" : t == DType::f16 ? "f16" : "f32";
    for (int64_t d : dims) {
      const std::string dn = "_d" + std::to_string(d);
      PrefillCase c;
      c.dtype = t;
      c.head_dim = d;
      // Ragged, causal, GQA 4, page size 16: chunks of 1, crossing pages, whole sequence, mid-page start.
      c.name = "paged16_causal_" + tn + dn;
      c.lens = {1, 33, 200, 517};
      c.chunks = {1, 20, 200, 100};
      c.opt = causal_opt();
      v.push_back(c);
      c.name = "contig_causal_" + tn + dn;
      c.paged = false;
      v.push_back(c);
      // Padded q (every sequence's last q_len tokens), strided cache / out, non-power-of-two page size.
      c = PrefillCase{};
      c.dtype = t, c.head_dim = d;
      c.name = "paged48_padded_q_" + tn + dn;
      c.page_size = 48;
      c.lens = {9, 50, 130};
      c.q_len = 9;
      c.q_heads = 6, c.kv_heads = 2;  // GQA 3
      c.opt = causal_opt();
      c.padded = true;
      v.push_back(c);
      c.name = "contig_padded_q_" + tn + dn;
      c.paged = false;
      v.push_back(c);
      // Window crossing pages + sink tokens, empty chunk, a sequence without pages.
      c = PrefillCase{};
      c.dtype = t, c.head_dim = d;
      c.name = "paged32_window_sinks_" + tn + dn;
      c.page_size = 32;
      c.lens = {300, 0, 77, 129};
      c.chunks = {150, 0, 0, 129};
      c.opt = window_opt(45, 5);
      c.q_heads = 8, c.kv_heads = 1;  // MQA
      v.push_back(c);
      // Non-causal two-sided window, softcap, learned sink logits, page size 256 (tiles inside one page).
      c = PrefillCase{};
      c.dtype = t, c.head_dim = d;
      c.name = "paged256_softcap_sinklogits_" + tn + dn;
      c.page_size = 256;
      c.lens = {600, 31};
      c.chunks = {257, 31};
      c.opt = window_opt(100, 3, false);
      c.opt.window_right = 20;
      c.opt.softcap = 15.0;
      c.sink_logits = true;
      c.q_heads = 4, c.kv_heads = 4;  // GQA 1
      v.push_back(c);
    }
  }
  return v;
}

// The page table of the first `lens[b]` tokens of each sequence of a (paged) HostCache: its first pages, in order.
struct Prefix {
  std::vector<int32_t> seq_lens, indptr, indices, last;
  KvCacheView view;
  Prefix(HostCache& c, const std::vector<int32_t>& lens) {
    view = c.view;
    if (!c.spec.paged) {
      seq_lens = lens;
      view.host.seq_lens = i32_view(seq_lens);
      return;
    }
    indptr = {0};
    for (size_t b = 0; b < lens.size(); ++b) {
      const int64_t pages = (lens[b] + c.cap - 1) / c.cap;
      for (int64_t pg = 0; pg < pages; ++pg) indices.push_back(c.indices[size_t(c.indptr[b] + pg)]);
      indptr.push_back(int32_t(indices.size()));
      last.push_back(pages == 0 ? 0 : int32_t(lens[b] - (pages - 1) * c.cap));
    }
    indices.push_back(0);  // never empty
    view.host.page_indptr = i32_view(indptr);
    view.host.page_indices = i32_view(indices);
    view.host.last_page_len = i32_view(last);
  }
};

// Chunked prefill: the sequences grow by chunks of `step` tokens (a prefix page table per step, ragged q = the new
// rows), and the rows written chunk by chunk equal one prefill of every row over the whole cache. `run` executes
// prefill() for host-side args on a backend (the cache's K/V bytes never change).
inline void check_chunked_equals_oneshot(bool paged, DType dtype, int64_t head_dim, std::vector<int32_t> lens, int32_t step,
                                         const std::function<void(HostCache&, PrefillArgs)>& run) {
  {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    PrefillCase t;
    t.dtype = dtype;
    t.head_dim = head_dim;
    t.name = "chunked";
    t.paged = paged;
    t.page_size = 16;
    t.lens = lens;
    t.chunks = t.lens;
    t.opt = window_opt(40, 4);
    HostCache cache(cache_of(t), 21);
    PrefillProblem whole(cache, spec_of(t), 22);
    PrefillProblem chunked(cache, spec_of(t), 22);  // same seed: the same q
    ASSERT_TRUE(whole.qbuf.bytes == chunked.qbuf.bytes);
    const auto out_before = whole.outbuf.bytes, lse_before = whole.lsebuf.bytes;
    run(cache, whole.args);
    expect_prefill_matches(whole, out_before, lse_before);

    const int64_t Hq = t.q_heads, D = t.head_dim;
    std::vector<int32_t> done(cache.spec.lens.size(), 0);
    for (int s = 0;; ++s) {
      std::vector<int32_t> lens, cu = {0};
      bool any = false;
      for (size_t b = 0; b < done.size(); ++b) {
        lens.push_back(std::min<int32_t>(cache.spec.lens[b], done[b] + step));
        cu.push_back(cu.back() + lens[b] - done[b]);
        any |= lens[b] > done[b];
      }
      if (!any) break;
      Prefix prefix(cache, lens);
      // q / out / lse rows of this step: views into the whole problem's buffers, rows of each chunk gathered.
      const int64_t rows = cu.back();
      Buffer q(t.dtype, rows * Hq * D), out(t.dtype, rows * Hq * D), lse(DType::f32, Hq * rows);
      out.poison();
      const size_t es = fltest::elem_size(t.dtype);
      for (size_t b = 0; b < done.size(); ++b)
        for (int32_t i = done[b]; i < lens[b]; ++i)
          std::memcpy(q.at((cu[b] + i - done[b]) * Hq * D), chunked.qbuf.bytes.data() + (chunked.cu[b] + i) * Hq * D * int64_t(es),
                      size_t(Hq * D) * es);
      PrefillArgs a;
      a.cache = prefix.view;
      a.q = fltest::view_n(q.data(), t.dtype, {1, rows, Hq, D}, {rows * Hq * D, Hq * D, D, 1});
      a.out = fltest::view_n(out.data(), t.dtype, {1, rows, Hq, D}, {rows * Hq * D, Hq * D, D, 1});
      a.lse = fltest::view_n(lse.data(), DType::f32, {1, Hq, rows}, {Hq * rows, rows, 1});
      a.options = t.opt;
      a.options.cu_seqlens_q = i32_view(cu);
      run(cache, a);
      for (size_t b = 0; b < done.size(); ++b)
        for (int32_t i = done[b]; i < lens[b]; ++i) {
          const int64_t r = cu[b] + i - done[b], whole_row = chunked.cu[b] + i;
          std::memcpy(chunked.outbuf.at(whole_row * Hq * D), out.at(r * Hq * D), size_t(Hq * D) * es);
          for (int64_t h = 0; h < Hq; ++h)
            fltest::store(DType::f32, chunked.lsebuf.data(), h * chunked.rows + whole_row, fltest::load(DType::f32, lse.data(), h * rows + r));
        }
      done = lens;
    }
    double d2 = 0, r2 = 0;
    const int64_t total = chunked.cu.back() * Hq * D;
    for (int64_t i = 0; i < total; ++i) {
      const double a = fltest::load(t.dtype, chunked.outbuf.bytes.data(), i), b = fltest::load(t.dtype, whole.outbuf.bytes.data(), i);
      ASSERT_TRUE(std::isfinite(a)) << "chunked output " << i << " unwritten";
      d2 += (a - b) * (a - b), r2 += b * b;
    }
    EXPECT_LT(std::sqrt(d2 / r2), 2e-3) << "chunked vs one-shot";
    expect_prefill_matches(chunked, out_before, lse_before);
  }
}

}  // namespace kvtest
