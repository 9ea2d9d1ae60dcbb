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

// Chunked prefill (chunks of 30 tokens) equals one-shot prefill (prefill_test_util.h).
TEST(PrefillCpu, ChunkedEqualsOneShot) {
  for (bool paged : {true, false}) {
    check_chunked_equals_oneshot(paged, DType::bf16, 64, {100, 37, 64}, 30, [](HostCache&, PrefillArgs a) {
      a.backend = Backend::cpu;
      flashlite::prefill(a);
    });
  }
}

}  // namespace
}  // namespace kvtest
