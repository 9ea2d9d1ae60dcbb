// The KV-cache API on the CPU backend (runs in CI): decode over contiguous and paged caches against the float64
// oracle, append with RoPE against a float64 RoPE, append-then-decode against attention over the concatenation,
// the split planner, and every bad input rejected with nothing written.
#include <gtest/gtest.h>

#include <functional>

#include "kv/kv_backends.h"
#include "kv_test_util.h"

namespace kvtest {
namespace {

using flashlite::AppendArgs;
using flashlite::Error;
using flashlite::ErrorKind;
using flashlite::RopeLayout;
using flashlite::RopeOptions;

// ------------------------------------------------------------------------------------------------ decode grid

struct CpuCase {
  std::string name;
  CacheSpec cache;
  DecodeSpec dec;
};

std::vector<CpuCase> cpu_cases() {
  std::vector<CpuCase> v;
  const std::vector<int32_t> ragged = {1, 15, 16, 17, 100, 300};
  for (bool paged : {false, true}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (auto [hq, hkv] : {std::pair{4, 4}, {8, 2}, {8, 1}, {6, 2}}) {
        for (int q_len : {1, 3, 8}) {
          CpuCase c;
          c.cache.paged = paged;
          c.cache.page_size = 16;
          c.cache.kv_heads = hkv;
          c.cache.head_dim = t == DType::f16 ? 32 : 64;
          c.cache.dtype = t;
          c.cache.lens = ragged;
          c.dec.q_heads = hq;
          c.dec.q_len = q_len;
          c.dec.opt.causal = q_len > 1;
          c.name = std::string(paged ? "paged16" : "contig") + "_" + flashlite::dtype_name(t) + "_hq" + std::to_string(hq) +
                   "_hkv" + std::to_string(hkv) + "_q" + std::to_string(q_len);
          v.push_back(c);
        }
      }
    }
  }
  // Masks: a window crossing pages, sink tokens, sink logits, softcap, non-causal multi-token, page size 32.
  auto masked = [&](std::string name, auto edit) {
    CpuCase c;
    c.cache.paged = true;
    c.cache.page_size = 16;
    c.cache.kv_heads = 2;
    c.cache.head_dim = 64;
    c.cache.dtype = DType::f32;
    c.cache.lens = {5, 40, 77, 200};
    c.dec.q_heads = 8;
    c.dec.q_len = 4;
    c.dec.opt.causal = true;
    edit(c);
    c.name = name;
    v.push_back(c);
  };
  masked("window_crossing_pages", [](CpuCase& c) { c.dec.opt.window_left = 20; });
  masked("window_sinks", [](CpuCase& c) { c.dec.opt.window_left = 20, c.dec.opt.sink_tokens = 3; });
  masked("window_sinks_bf16_padded", [](CpuCase& c) {
    c.dec.opt.window_left = 33, c.dec.opt.sink_tokens = 18, c.cache.dtype = DType::bf16, c.cache.padded = true;
    c.dec.padded_out = true;
  });
  masked("sink_logits", [](CpuCase& c) { c.dec.sink_logits = true; });
  masked("sink_logits_window_sinks", [](CpuCase& c) {
    c.dec.sink_logits = true, c.dec.opt.window_left = 10, c.dec.opt.sink_tokens = 2;
  });
  masked("softcap_scale", [](CpuCase& c) { c.dec.opt.softcap = 5.0, c.dec.opt.scale = 0.3; });
  masked("not_causal", [](CpuCase& c) { c.dec.opt.causal = false; });
  masked("window_right", [](CpuCase& c) { c.dec.opt.causal = false, c.dec.opt.window_left = 7, c.dec.opt.window_right = 2; });
  masked("page32_q8_rows_masked", [](CpuCase& c) {  // q_len > length: leading rows see nothing
    c.cache.page_size = 32, c.cache.lens = {3, 1, 64, 65}, c.dec.q_len = 8;
  });
  masked("page32_q8_sinklogits_empty_rows", [](CpuCase& c) {
    c.cache.page_size = 32, c.cache.lens = {3, 1, 64, 65}, c.dec.q_len = 8, c.dec.sink_logits = true;
  });
  masked("empty_sequence", [](CpuCase& c) { c.cache.lens = {0, 19, 0}; });
  masked("empty_sequence_sinklogits", [](CpuCase& c) { c.cache.lens = {0, 19, 0}, c.dec.sink_logits = true; });
  return v;
}

class CpuDecode : public ::testing::TestWithParam<CpuCase> {};

TEST_P(CpuDecode, MatchesFloat64Reference) {
  const CpuCase& tc = GetParam();
  HostCache cache(tc.cache, fltest::seed_of(tc.name));
  DecodeProblem p(cache, tc.dec, fltest::seed_of(tc.name + "q"));
  const std::vector<uint8_t> out_before = p.outbuf.bytes, k_before = cache.kbuf.bytes, v_before = cache.vbuf.bytes;
  for (Backend b : {Backend::automatic, Backend::cpu}) {
    p.args.backend = b;
    flashlite::decode(p.args);
    expect_decode_matches(p, out_before);
    p.outbuf.poison();
  }
  EXPECT_TRUE(cache.kbuf.bytes == k_before && cache.vbuf.bytes == v_before) << "the cache changed";
  EXPECT_EQ(flashlite::decode_kernel_name(p.args).rfind("cpu_decode (tiled ", 0), 0u) << flashlite::decode_kernel_name(p.args);
}

INSTANTIATE_TEST_SUITE_P(Kv, CpuDecode, ::testing::ValuesIn(cpu_cases()),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------------------------------ append + RoPE

std::vector<AppendCase> append_cases() {
  std::vector<AppendCase> v;
  for (bool paged : {false, true})
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      const std::string base = std::string(paged ? "paged" : "contig") + "_" + flashlite::dtype_name(t);
      v.push_back({base + "_plain_n1", paged, t, 1, false});
      v.push_back({base + "_rope_half_n1_q", paged, t, 1, true, RopeLayout::half_split, false, true});
      v.push_back({base + "_rope_interleaved_n5_q_inplace", paged, t, 5, true, RopeLayout::interleaved, false, true, true});
      v.push_back({base + "_rope_llama3_n17_q", paged, t, 17, true, RopeLayout::half_split, true, true});
    }
  return v;
}

class CpuAppend : public ::testing::TestWithParam<AppendCase> {};

TEST_P(CpuAppend, WritesRotatedTokensAndNothingElse) {
  const AppendCase& tc = GetParam();
  HostCache cache(append_cache(tc), fltest::seed_of(tc.name));
  AppendFixture f(cache, tc);
  const auto k_before = cache.kbuf.bytes, v_before = cache.vbuf.bytes, q_before = f.q.bytes;
  flashlite::append_kv(f.args);
  f.check(k_before, v_before, q_before);
}

INSTANTIATE_TEST_SUITE_P(Kv, CpuAppend, ::testing::ValuesIn(append_cases()), [](const auto& info) { return info.param.name; });

// One page in the page lists of several sequences that append different positions of it (what the engine's row steps
// do: one entry per new position of a sequence): accepted, each token where its own entry puts it. Two that append
// the same position are refused with nothing written.
TEST(CpuKv, SequencesSharingAPageAppendTheirOwnPositions) {
  const AppendCase tc{"shared_page", true, DType::f32, 1, true, RopeLayout::half_split, false, true};
  CacheSpec s = append_cache(tc);
  s.lens = {5, 6, 7};
  s.filled = {4, 5, 6};
  HostCache cache(s, 11);
  cache.indices[1] = cache.indices[2] = cache.indices[0];  // positions 4, 5 and 6 of one page
  AppendFixture f(cache, tc);
  const auto k_before = cache.kbuf.bytes, v_before = cache.vbuf.bytes, q_before = f.q.bytes;
  flashlite::append_kv(f.args);
  f.check(k_before, v_before, q_before);

  s.lens = {5, 5, 7};
  HostCache clash(s, 12);
  clash.indices[1] = clash.indices[0];  // both append position 4 of the page
  AppendFixture g(clash, tc);
  const auto k0 = clash.kbuf.bytes;
  try {
    flashlite::append_kv(g.args);
    ADD_FAILURE() << "two appends to one cache position were accepted";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("positions 4..4 of page"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("written by sequences 0 and 1"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(clash.kbuf.bytes == k0) << "a refused append wrote";
}

TEST(CpuRope, InvFreqMatchesHuggingFaceLlama3Rule) {
  RopeOptions r;
  r.theta = 500000.0, r.llama3 = true, r.llama3_factor = 32.0;
  for (int64_t c = 0; c < 64; ++c) EXPECT_NEAR(flashlite::rope_inv_freq(r, 128, c), test_inv_freq(r, 128, c), 1e-15) << c;
  r.llama3 = false;
  EXPECT_DOUBLE_EQ(flashlite::rope_inv_freq(r, 128, 0), 1.0);
  EXPECT_NEAR(flashlite::rope_inv_freq(r, 128, 32), std::pow(500000.0, -0.5), 1e-15);
}

// Append one token (rotated) to every sequence, then decode: equals attention over [old cache, rope(new token)]
// computed by the oracle from plain tensors built here (not from the cache).
TEST(CpuKv, AppendThenDecodeEqualsAttentionOverConcatenation) {
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    AppendCase tc{"concat", paged, DType::f32, 2, true, RopeLayout::half_split, true, true};
    HostCache cache(append_cache(tc), fltest::seed_of("concat"));
    AppendFixture f(cache, tc);
    // Plain [1, L, H, D] copies of each sequence: the filled prefix read back, then the new tokens rotated here.
    const int64_t H = cache.spec.kv_heads, D = cache.spec.head_dim, N = tc.n_new;
    std::vector<std::vector<float>> kcat(size_t(cache.batch)), vcat(size_t(cache.batch));
    for (int64_t b = 0; b < cache.batch; ++b) {
      const int64_t L = cache.len(b);
      kcat[size_t(b)].resize(size_t(L * H * D));
      vcat[size_t(b)].resize(size_t(L * H * D));
      for (int64_t j = 0; j < L - N; ++j)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < D; ++c) {
            kcat[size_t(b)][size_t((j * H + h) * D + c)] = cache.k_at(b, j, h, c);
            vcat[size_t(b)][size_t((j * H + h) * D + c)] = cache.v_at(b, j, h, c);
          }
      for (int64_t t = 0; t < N; ++t)
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> kr(static_cast<size_t>(D));
          for (int64_t c = 0; c < D; ++c) kr[size_t(c)] = fltest::load(DType::f32, f.k.bytes.data(), ((b * N + t) * H + h) * D + c);
          kr = test_rope(f.args.rope, kr, L - N + t);
          for (int64_t c = 0; c < D; ++c) {
            kcat[size_t(b)][size_t(((L - N + t) * H + h) * D + c)] = float(kr[size_t(c)]);
            vcat[size_t(b)][size_t(((L - N + t) * H + h) * D + c)] = fltest::load(DType::f32, f.v.bytes.data(), ((b * N + t) * H + h) * D + c);
          }
        }
    }
    flashlite::append_kv(f.args);
    DecodeSpec ds;
    ds.q_heads = 4, ds.q_len = N, ds.opt.causal = true;
    DecodeProblem p(cache, ds, fltest::seed_of("concat q"));
    flashlite::decode(p.args);
    for (int64_t b = 0; b < cache.batch; ++b) {
      const int64_t L = cache.len(b);
      ForwardArgs a;
      a.q = fltest::view_n(p.qbuf.at(b * N * 4 * D), DType::f32, {1, N, 4, D}, {N * 4 * D, 4 * D, D, 1});
      a.k = fltest::view_n(kcat[size_t(b)].data(), DType::f32, {1, L, H, D}, {L * H * D, H * D, D, 1});
      a.v = fltest::view_n(vcat[size_t(b)].data(), DType::f32, {1, L, H, D}, {L * H * D, H * D, D, 1});
      std::vector<float> dummy(static_cast<size_t>(N * 4 * D));
      a.out = fltest::view_n(dummy.data(), DType::f32, {1, N, 4, D}, {N * 4 * D, 4 * D, D, 1});
      a.options.causal = true;
      std::vector<double> ref(static_cast<size_t>(N * 4 * D));
      flashlite::reference_forward_f64(a, ref.data(), nullptr);
      double max_err = 0;
      for (int64_t i = 0; i < N * 4 * D; ++i) max_err = std::max(max_err, std::fabs(ref[size_t(i)] - fltest::load(DType::f32, p.outbuf.bytes.data(), b * N * 4 * D + i)));
      EXPECT_LT(max_err, 2e-5) << "sequence " << b;
    }
  }
}

// ------------------------------------------------------------------------------------------------ plan

TEST(DecodePlan, SplitCountFillsOneWaveAndEvensChunks) {
  using flashlite::choose_num_splits;
  // batch 1, 8 kv heads, 8192 keys, 264 resident blocks: 33 slots per pair, 128 tiles -> 4 tiles each -> 32 splits.
  EXPECT_EQ(choose_num_splits(8, 8192, 264, 64, 256), 32);
  EXPECT_EQ(choose_num_splits(8, 32768, 264, 64, 256), 32);  // 512 tiles, 33 -> 16 per split -> 32
  EXPECT_EQ(choose_num_splits(512, 8192, 264, 64, 256), 1);   // the pairs fill the device
  EXPECT_EQ(choose_num_splits(128, 1024, 264, 64, 256), 2);
  EXPECT_EQ(choose_num_splits(8, 100, 264, 64, 256), 2);      // never more splits than tiles
  EXPECT_EQ(choose_num_splits(8, 0, 264, 64, 256), 1);
  EXPECT_EQ(choose_num_splits(1, 1 << 20, 1000, 64, 256), 256);  // capped
  flashlite::MaskParams m;
  EXPECT_EQ(flashlite::decode_visible_keys_bound(m, 1, 5000), 5000);
  m.window_left = 100, m.sink_tokens = 4;
  EXPECT_EQ(flashlite::decode_visible_keys_bound(m, 1, 5000), 5000);  // not causal, no right limit: everything
  m.causal = true;
  EXPECT_EQ(flashlite::decode_visible_keys_bound(m, 2, 5000), 100 + 2 + 4);
  m.causal = false, m.window_right = 3;
  EXPECT_EQ(flashlite::decode_visible_keys_bound(m, 2, 5000), 100 + 2 + 3 + 4);
}

// The CUDA decode choice as a pure function of the problem and what the device offers (H100-like numbers): the split
// count, the merge (cluster when the splits fit one and the grid is at most one block per SM), the L2 policy, PDL, and
// the overrides (forced splits; the combine kernel anywhere; the cluster merge only where it can run).
TEST(DecodePlan, CudaChoiceAndOverrides) {
  using flashlite::DecodeMerge;
  flashlite::DecodeProblem p;
  p.cache.batch = 1, p.cache.kv_heads = 8, p.cache.head_dim = 128, p.cache.dtype = DType::bf16;
  p.cache.max_length = 8192;
  p.q_len = 1, p.q_heads = 32;
  flashlite::CudaDecodeDevice h100;
  h100.sms = 132, h100.slots = 264, h100.l2_bytes = 50 << 20, h100.cluster_splits = 16, h100.sm90_code = true;
  flashlite::CudaDecodeLaunch l;
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {}, h100, l), "");
  EXPECT_EQ(l.splits, 32);           // 33 slots per kv head, 128 key tiles
  EXPECT_FALSE(l.cluster_merge);     // 32 splits do not fit a cluster of 16
  EXPECT_TRUE(l.kv_evict_first);     // 2 x 32 MiB of K/V >= a 50 MiB L2
  EXPECT_TRUE(l.pdl);
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::automatic}, h100, l), "");
  EXPECT_EQ(l.splits, 8);
  EXPECT_TRUE(l.cluster_merge);      // 8 splits x 8 heads = 64 blocks <= 132 SMs
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::combine}, h100, l), "");
  EXPECT_FALSE(l.cluster_merge);
  EXPECT_NE(flashlite::plan_cuda_decode(p, 8192, {32, DecodeMerge::cluster}, h100, l).find("at most 16 splits"), std::string::npos);
  p.cache.batch = 4;                 // 4 x 8 x 8 = 256 blocks > 132 SMs: the combine kernel by default ...
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::automatic}, h100, l), "");
  EXPECT_FALSE(l.cluster_merge);
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::cluster}, h100, l), "");
  EXPECT_TRUE(l.cluster_merge);      // ... and the cluster merge when forced
  flashlite::CudaDecodeDevice a100 = h100;  // no sm_90 code: no cluster, no PDL
  a100.cluster_splits = 0, a100.sm90_code = false;
  p.cache.batch = 1;
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::automatic}, a100, l), "");
  EXPECT_FALSE(l.cluster_merge);
  EXPECT_FALSE(l.pdl);
  const std::string why = flashlite::plan_cuda_decode(p, 8192, {8, DecodeMerge::cluster}, a100, l);
  EXPECT_NE(why.find("the cluster merge needs"), std::string::npos) << why;
  // L2 policy: evict-first once the call's K/V is at least half the L2 (here 8192 x 8 x 128 x 2 x 2 B = 32 MiB).
  h100.l2_bytes = 64 << 20;
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {}, h100, l), "");
  EXPECT_TRUE(l.kv_evict_first);
  h100.l2_bytes = (64 << 20) + 1;
  EXPECT_EQ(flashlite::plan_cuda_decode(p, 8192, {}, h100, l), "");
  EXPECT_FALSE(l.kv_evict_first);
}

TEST(DecodePlan, CpuPlanHasOneSplitAndNoWorkspace) {
  CacheSpec cs;
  cs.lens = {10, 300};
  cs.dtype = DType::f32;
  HostCache cache(cs, 1);
  DecodeProblem p(cache, DecodeSpec{}, 2);
  const flashlite::DecodePlan plan = flashlite::plan_decode(p.args, 4096);
  EXPECT_EQ(plan.num_splits, 1);
  EXPECT_EQ(plan.workspace_bytes, 0u);
  EXPECT_EQ(plan.max_kv_len, 4096);
  EXPECT_EQ(plan.batch, 2);
  p.args.plan = &plan;
  const auto before = p.outbuf.bytes;
  flashlite::decode(p.args);
  expect_decode_matches(p, before);
}

}  // namespace
}  // namespace kvtest
