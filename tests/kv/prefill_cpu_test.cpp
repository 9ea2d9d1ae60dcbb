// prefill() on the CPU against float64: contiguous and paged caches (shuffled non-contiguous page tables, page
// sizes 16 / 32 / 48 / 256), ragged chunks (1 token, empty, crossing pages, whole sequences) and padded q, every
// mask (causal, windows crossing pages, sink tokens, softcap, learned sink logits), GQA / MQA, fp32 / fp16 / bf16,
// outputs poisoned; append-then-prefill against attention over the concatenation; chunked prefill against one-shot.
#include <gtest/gtest.h>

#include "prefill_test_util.h"

namespace kvtest {
namespace {

std::vector<uint8_t> bytes_of(const Buffer& b) { return b.bytes; }

void run_and_check(HostCache& cache, PrefillProblem& p, const Tol& tol = {}) {
  const auto out_before = bytes_of(p.outbuf), lse_before = bytes_of(p.lsebuf);
  const auto k_before = bytes_of(cache.kbuf), v_before = bytes_of(cache.vbuf);
  p.args.backend = Backend::cpu;
  flashlite::prefill(p.args);
  expect_prefill_matches(p, out_before, lse_before, tol);
  EXPECT_TRUE(cache.kbuf.bytes == k_before && cache.vbuf.bytes == v_before) << "prefill wrote the cache";
}

class PrefillCpuGrid : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PrefillCpuGrid, MatchesFloat64) {
  const PrefillCase& t = GetParam();
  HostCache cache(cache_of(t), fltest::seed_of(t.name));
  PrefillProblem p(cache, spec_of(t), fltest::seed_of(t.name + "q"));
  run_and_check(cache, p);
  EXPECT_EQ(flashlite::prefill_kernel_name(p.args).rfind("cpu_prefill", 0), 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillCpuGrid, ::testing::ValuesIn(prefill_grid(true)),
                         [](const auto& info) { return info.param.name; });

// append_kv (RoPE on k and q) writes a chunk of n tokens into a paged cache, then prefill attends over the whole
// sequence: equal to attention over [old tokens, rotated new tokens] built independently in float64.
TEST(PrefillCpu, AppendThenPrefillEqualsAttentionOverConcatenation) {
  for (DType t : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(flashlite::dtype_name(t));
    const int64_t n = 12, H = 2, Hq = 8, D = 64;
    CacheSpec cs;
    cs.paged = true;
    cs.page_size = 16;
    cs.kv_heads = H;
    cs.head_dim = D;
    cs.dtype = t;
    cs.lens = {40, 12, 77};
    for (int32_t l : cs.lens) cs.filled.push_back(l - int32_t(n));
    HostCache cache(cs, 11);
    const int64_t B = cache.batch;
    AppendCase ac{"append_then_prefill", true, t, int(n), true, flashlite::RopeLayout::half_split, true, true, false};
    AppendFixture app(cache, ac);
    app.hq = Hq;
    // AppendFixture made q with 6 heads; make an 8-head q and its rotated output.
    Buffer q(t, B * n * Hq * D), q_rot(t, B * n * Hq * D);
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t i = 0; i < q.numel(); ++i) fltest::store(t, q.data(), i, normal(rng));
    q_rot.poison();
    app.args.q = fltest::view_n(q.data(), t, {B, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
    app.args.q_out = fltest::view_n(q_rot.data(), t, {B, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
    // The concatenation in float32, built before the append from the old tokens and the float64-rotated new ones.
    std::vector<Buffer> kc, vc;
    std::vector<Buffer> qc;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = cache.len(b);
      kc.emplace_back(DType::f32, L * H * D);
      vc.emplace_back(DType::f32, L * H * D);
      qc.emplace_back(DType::f32, n * Hq * D);
      for (int64_t j = 0; j < L - n; ++j)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t e = 0; e < D; ++e) {
            fltest::store(DType::f32, kc[size_t(b)].data(), (j * H + h) * D + e, cache.k_at(b, j, h, e));
            fltest::store(DType::f32, vc[size_t(b)].data(), (j * H + h) * D + e, cache.v_at(b, j, h, e));
          }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = L - n + i;
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> kr(static_cast<size_t>(D));
          for (int64_t e = 0; e < D; ++e) kr[size_t(e)] = fltest::load(t, app.k.bytes.data(), ((b * n + i) * H + h) * D + e);
          kr = test_rope(app.args.rope, kr, pos);
          for (int64_t e = 0; e < D; ++e) {
            fltest::store(DType::f32, kc[size_t(b)].data(), (pos * H + h) * D + e, float(kr[size_t(e)]));
            fltest::store(DType::f32, vc[size_t(b)].data(), (pos * H + h) * D + e,
                          fltest::load(t, app.v.bytes.data(), ((b * n + i) * H + h) * D + e));
          }
        }
        for (int64_t h = 0; h < Hq; ++h) {
          std::vector<double> qr(static_cast<size_t>(D));
          for (int64_t e = 0; e < D; ++e) qr[size_t(e)] = fltest::load(t, q.bytes.data(), ((b * n + i) * Hq + h) * D + e);
          qr = test_rope(app.args.rope, qr, pos);
          for (int64_t e = 0; e < D; ++e) fltest::store(DType::f32, qc[size_t(b)].data(), (i * Hq + h) * D + e, float(qr[size_t(e)]));
        }
      }
    }
    app.args.backend = Backend::cpu;
    flashlite::append_kv(app.args);

    PrefillArgs pa;
    pa.cache = cache.view;
    pa.q = app.args.q_out;
    Buffer out(t, B * n * Hq * D);
    out.poison();
    pa.out = fltest::view_n(out.data(), t, {B, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
    pa.options = window_opt(30, 2);
    pa.backend = Backend::cpu;
    flashlite::prefill(pa);

    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = cache.len(b);
      Buffer ref_out(DType::f32, n * Hq * D);
      ForwardArgs fa;
      fa.q = fltest::view_n(qc[size_t(b)].data(), DType::f32, {1, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
      fa.k = fltest::view_n(kc[size_t(b)].data(), DType::f32, {1, L, H, D}, {L * H * D, H * D, D, 1});
      fa.v = fltest::view_n(vc[size_t(b)].data(), DType::f32, {1, L, H, D}, {L * H * D, H * D, D, 1});
      fa.out = fltest::view_n(ref_out.data(), DType::f32, {1, n, Hq, D}, {n * Hq * D, Hq * D, D, 1});
      fa.options = pa.options;
      std::vector<double> ref(size_t(n * Hq * D));
      flashlite::reference_forward_f64(fa, ref.data(), nullptr);
      double d2 = 0, r2 = 0, max_abs = 0;
      for (int64_t i = 0; i < n * Hq * D; ++i) {
        const double got = fltest::load(t, out.bytes.data(), b * n * Hq * D + i), want = ref[size_t(i)];
        ASSERT_TRUE(std::isfinite(got)) << "sequence " << b << " element " << i;
        d2 += (got - want) * (got - want), r2 += want * want, max_abs = std::max(max_abs, std::fabs(got - want));
      }
      EXPECT_LT(std::sqrt(d2 / r2), t == DType::f32 ? 1e-5 : 1e-2) << "sequence " << b << " (max abs " << max_abs << ")";
    }
  }
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
// rows), and the rows written chunk by chunk equal one prefill of every row over the whole cache.
TEST(PrefillCpu, ChunkedEqualsOneShot) {
  for (bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    PrefillCase t;
    t.name = "chunked";
    t.paged = paged;
    t.page_size = 16;
    t.lens = {100, 37, 64};
    t.chunks = t.lens;
    t.opt = window_opt(40, 4);
    HostCache cache(cache_of(t), 21);
    PrefillProblem whole(cache, spec_of(t), 22);
    PrefillProblem chunked(cache, spec_of(t), 22);  // same seed: the same q
    ASSERT_TRUE(whole.qbuf.bytes == chunked.qbuf.bytes);
    const auto out_before = whole.outbuf.bytes, lse_before = whole.lsebuf.bytes;
    whole.args.backend = Backend::cpu;
    flashlite::prefill(whole.args);
    expect_prefill_matches(whole, out_before, lse_before);

    const int32_t step = 30;
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
      a.backend = Backend::cpu;
      flashlite::prefill(a);
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

}  // namespace
}  // namespace kvtest
