// The engine's KV cache is a flashlite KV cache: after the CPU model's prefill and decode steps, each layer's cache
// seen only through the public API (KvCacheView, kv_length, plan_decode, decode, prefill) holds every sequence's
// length, its K / V at the documented contiguous layout, and flashlite::decode / prefill over it with the engine's
// rotated q reproduce the engine's attention output (exactly: the same library call) and a float64 attention read
// by hand from the layout. Also the library pieces the engine relies on: append_kv on the q / k / v column blocks of
// one fused QKV buffer (views that interleave in memory but share no element), the 'linear' RoPE factor, and the
// engine's config mapped onto RopeOptions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "engine/config.h"
#include "engine/kv_cache.h"
#include "engine/llama_cpu.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "flashlite/kv_cache.h"
#include "flashlite/rope.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;
using flashlite::DType;
using flashlite::Device;
using flashlite::TensorView;

// float64 causal attention (bottom-right) of q rows [n, heads, D] over K / V rows 0..len-1 of sequence b, read by hand
// from a contiguous flashlite cache view (k.data + b s0 + p s1 + h s2).
std::vector<double> attention_by_hand(const flashlite::KvCacheView& c, int64_t b, const float* q, int64_t q_row_stride,
                                      int n, int heads) {
  const int64_t len = flashlite::kv_length(c, b), D = c.k.shape[3], kvh = c.k.shape[2], group = heads / kvh;
  auto at = [&](const TensorView& t, int64_t p, int64_t h) {
    return static_cast<const float*>(t.data) + b * t.strides[0] + p * t.strides[1] + h * t.strides[2];
  };
  std::vector<double> out(size_t(n) * heads * D, 0.0);
  for (int i = 0; i < n; ++i) {
    const int64_t last = len - n + i;  // the query's own position
    for (int h = 0; h < heads; ++h) {
      const float* qr = q + i * q_row_stride + h * D;
      std::vector<double> s(size_t(last + 1));
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t p = 0; p <= last; ++p) {
        double dot = 0;
        for (int64_t e = 0; e < D; ++e) dot += double(qr[e]) * at(c.k, p, h / group)[e];
        s[size_t(p)] = dot / std::sqrt(double(D));
        m = std::max(m, s[size_t(p)]);
      }
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - m));
      for (int64_t p = 0; p <= last; ++p)
        for (int64_t e = 0; e < D; ++e) out[(size_t(i) * heads + h) * D + e] += s[size_t(p)] / sum * at(c.v, p, h / group)[e];
    }
  }
  return out;
}

class EngineKvCache : public ::testing::Test {
 protected:
  void SetUp() override {
    const synth::Spec spec{"kv_cache_view", 64, 96, 2, 4, 2, 16, 70, "F32", false, true, 0};
    const auto dir = synth::fresh_dir(spec.name);
    synth::write_checkpoint(dir, spec, 41);
    w_ = eng::load_checkpoint(dir.string());
  }
  std::unique_ptr<eng::LlamaCpu> model(int slots, int context) const {
    eng::RuntimeOptions ro;
    ro.slots = slots;
    ro.context = context;
    return std::make_unique<eng::LlamaCpu>(w_, ro);
  }
  eng::ModelWeights w_;
};

// The layer's cache after the last forward call: lengths, plan, and attention through the public API against the
// engine's own attention output (`rows` of the last call: sequence i's n rows from row i * n on slots 0..count-1).
void expect_cache_is_the_engines(eng::LlamaCpu& model, int count, int n) {
  const eng::ModelConfig& c = model.config();
  const int layer = c.n_layers - 1, H = c.n_heads, D = c.head_dim, qkv_w = c.q_dim() + 2 * c.kv_dim(), qd = c.q_dim();
  const flashlite::KvCacheView view = model.cache().view(layer, 0, count);
  for (int b = 0; b < count; ++b) EXPECT_EQ(flashlite::kv_length(view, b), model.length(b)) << "slot " << b;
  const TensorView q = TensorView::strided(const_cast<float*>(model.last_qkv()), DType::f32, Device::cpu(), {count, n, H, D},
                                           {int64_t(n) * qkv_w, qkv_w, D, 1});
  std::vector<float> out(size_t(count) * n * qd, std::numeric_limits<float>::quiet_NaN());
  const TensorView o = TensorView::contiguous(out.data(), DType::f32, Device::cpu(), {count, n, H, D});
  auto args = [&](auto a) {  // DecodeArgs or PrefillArgs
    a.q = q;
    a.cache = view;
    a.out = o;
    a.options.causal = true;
    a.backend = flashlite::Backend::cpu;
    return a;
  };
  if (n <= 8) {
    const flashlite::DecodeArgs a = args(flashlite::DecodeArgs{});
    ASSERT_TRUE(flashlite::plan_decode(a).supported()) << flashlite::plan_decode(a).unsupported;
    flashlite::decode(a);
  } else {
    flashlite::prefill(args(flashlite::PrefillArgs{}));
  }
  double worst_engine = 0, worst_hand = 0;
  for (int b = 0; b < count; ++b) {
    const float* qb = model.last_qkv() + size_t(b) * n * qkv_w;
    const std::vector<double> want = attention_by_hand(view, b, qb, qkv_w, n, H);
    for (size_t i = 0; i < want.size(); ++i) {
      const float got = out[size_t(b) * n * qd + i], engine = model.last_attention()[size_t(b) * n * qd + i];
      ASSERT_TRUE(std::isfinite(got)) << "sequence " << b << " element " << i << " unwritten";
      worst_engine = std::max(worst_engine, double(std::abs(got - engine)));
      worst_hand = std::max(worst_hand, std::abs(got - want[i]));
    }
  }
  EXPECT_EQ(worst_engine, 0.0) << "the library's attention over the engine's cache differs from the engine's";
  EXPECT_LT(worst_hand, 1e-5) << "the cache's K / V are not where the contiguous layout puts them";
}

TEST_F(EngineKvCache, DecodeStepOverTheEnginesCacheIsTheEnginesAttention) {
  const auto m = model(3, 40);
  m->forward({{0, {1, 5, 9, 11, 3}}, {1, {7, 8, 9, 10, 11, 12, 13, 14, 15}}, {2, {4, 2}}});  // ragged prefill
  m->forward({{0, {21}}, {1, {22}}, {2, {23}}});  // one decode step, one group of three sequences
  EXPECT_EQ(m->length(0), 6);
  EXPECT_EQ(m->length(1), 10);
  EXPECT_EQ(m->length(2), 3);
  expect_cache_is_the_engines(*m, 3, 1);
}

TEST_F(EngineKvCache, PrefillChunkOverTheEnginesCacheIsTheEnginesAttention) {
  const auto m = model(2, 64);
  m->forward({{0, {1, 2, 3}}, {1, {4, 5, 6}}});
  std::vector<int> chunk;
  for (int i = 0; i < 12; ++i) chunk.push_back((i * 13 + 5) % 70);
  m->forward({{0, chunk}, {1, chunk}});  // 12 new tokens each (> 8: flashlite::prefill)
  expect_cache_is_the_engines(*m, 2, 12);
}

// A failed call leaves the lengths as they were (they grow before the appends, as the library's order wants).
TEST_F(EngineKvCache, RejectedCallKeepsTheLengths) {
  const auto m = model(2, 8);
  m->forward({{0, {1, 2, 3}}});
  EXPECT_THROW(m->forward({{0, {1, 2, 3, 4, 5, 6}}}), flashlite::Error);  // past the context
  EXPECT_THROW(m->forward({{1, {1}}, {0, {70}}}), flashlite::Error);      // token outside the vocabulary
  EXPECT_EQ(m->length(0), 3);
  EXPECT_EQ(m->length(1), 0);
}

TEST(EngineKvGroups, ConsecutiveSlotsWithEqualLengthsShareACall) {
  const std::vector<eng::SequenceInput> in = {{0, {1}}, {1, {2}}, {2, {3}}, {4, {1}}, {5, {1, 2}}, {6, {3, 4}}, {3, {5, 6}}};
  const std::vector<eng::KvGroup> g = eng::kv_groups(in);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].first, 0); EXPECT_EQ(g[0].count, 3); EXPECT_EQ(g[0].slot0, 0); EXPECT_EQ(g[0].n, 1);
  EXPECT_EQ(g[1].first, 3); EXPECT_EQ(g[1].count, 1); EXPECT_EQ(g[1].slot0, 4); EXPECT_EQ(g[1].n, 1);
  EXPECT_EQ(g[2].first, 4); EXPECT_EQ(g[2].count, 2); EXPECT_EQ(g[2].slot0, 5); EXPECT_EQ(g[2].n, 2);
  EXPECT_EQ(g[3].first, 6); EXPECT_EQ(g[3].count, 1); EXPECT_EQ(g[3].slot0, 3); EXPECT_EQ(g[3].n, 2);
}

// A paged cache's page table lists the inputs in order: runs of equal n share a call whatever their slots.
TEST(EngineKvGroups, AnySlotsGroupsRunsOfEqualLengths) {
  const std::vector<eng::SequenceInput> in = {{3, {1}}, {0, {2}}, {5, {3}}, {1, {1, 2}}, {2, {3, 4}}, {4, {5}}};
  const std::vector<eng::KvGroup> g = eng::kv_groups(in, true);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].first, 0); EXPECT_EQ(g[0].count, 3); EXPECT_EQ(g[0].slot0, 3); EXPECT_EQ(g[0].n, 1);
  EXPECT_EQ(g[1].first, 3); EXPECT_EQ(g[1].count, 2); EXPECT_EQ(g[1].n, 2);
  EXPECT_EQ(g[2].first, 5); EXPECT_EQ(g[2].count, 1); EXPECT_EQ(g[2].slot0, 4); EXPECT_EQ(g[2].n, 1);
}

// append_kv on the column blocks of one fused QKV buffer [batch, n, q + k + v heads, D] (what the engine's QKV
// projection writes): accepted although the views' address ranges interleave, and the same result as separate
// buffers. A q_out that does share elements with k is still rejected.
TEST(EngineKvLibrary, AppendTakesTheColumnBlocksOfAFusedQkvBuffer) {
  const int B = 2, n = 3, H = 4, KVH = 2, D = 8, cap = 6, W = (H + 2 * KVH) * D;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> qkv(size_t(B) * n * W);
  for (float& x : qkv) x = u(rng);
  auto cols = [&](float* base, int col, int heads) {
    return TensorView::strided(base + col, DType::f32, Device::cpu(), {B, n, heads, D}, {int64_t(n) * W, W, D, 1});
  };
  // Separate copies of q, k, v.
  std::vector<float> q(size_t(B) * n * H * D), k(size_t(B) * n * KVH * D), v(k.size());
  for (int r = 0; r < B * n; ++r) {
    std::copy_n(&qkv[size_t(r) * W], H * D, &q[size_t(r) * H * D]);
    std::copy_n(&qkv[size_t(r) * W + H * D], KVH * D, &k[size_t(r) * KVH * D]);
    std::copy_n(&qkv[size_t(r) * W + (H + KVH) * D], KVH * D, &v[size_t(r) * KVH * D]);
  }
  const eng::KvCacheShape shape{1, B, cap, KVH, D};
  const std::vector<int32_t> lens = {n, n + 2};
  std::vector<float> kc1(size_t(B) * cap * KVH * D, 0.f), vc1(kc1.size(), 0.f), kc2(kc1), vc2(kc1);
  flashlite::RopeOptions rope;
  rope.enabled = true;
  rope.linear_factor = 2.0;
  flashlite::AppendArgs a;
  a.cache = eng::kv_cache_view(shape, kc1.data(), vc1.data(), DType::f32, Device::cpu(), 0, B, lens.data());
  a.k = cols(qkv.data(), H * D, KVH);
  a.v = cols(qkv.data(), (H + KVH) * D, KVH);
  a.q = cols(qkv.data(), 0, H);
  a.q_out = a.q;
  a.rope = rope;
  flashlite::append_kv(a);
  flashlite::AppendArgs s = a;
  s.cache = eng::kv_cache_view(shape, kc2.data(), vc2.data(), DType::f32, Device::cpu(), 0, B, lens.data());
  s.k = TensorView::contiguous(k.data(), DType::f32, Device::cpu(), {B, n, KVH, D});
  s.v = TensorView::contiguous(v.data(), DType::f32, Device::cpu(), {B, n, KVH, D});
  s.q = s.q_out = TensorView::contiguous(q.data(), DType::f32, Device::cpu(), {B, n, H, D});
  flashlite::append_kv(s);
  EXPECT_EQ(kc1, kc2);
  EXPECT_EQ(vc1, vc2);
  for (int r = 0; r < B * n; ++r)
    for (int e = 0; e < H * D; ++e) ASSERT_EQ(qkv[size_t(r) * W + e], q[size_t(r) * H * D + e]) << r << " " << e;
  // q_out over the first half of k's columns (and past q's): shares elements with k.
  flashlite::AppendArgs bad = a;
  bad.q_out = cols(qkv.data(), H * D - 2 * D, H);
  try {
    flashlite::append_kv(bad);
    FAIL() << "an overlapping q_out was accepted";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_out overlaps"), std::string::npos) << e.what();
  }
}

// The 'linear' scaling divides every frequency; the engine maps its config onto the library's RopeOptions.
TEST(EngineKvLibrary, RopeOptionsOfTheConfig) {
  flashlite::RopeOptions r;
  r.enabled = true;
  r.theta = 500000.0;
  flashlite::RopeOptions lin = r;
  lin.linear_factor = 4.0;
  for (int c = 0; c < 32; ++c) EXPECT_EQ(flashlite::rope_frequency(lin, 64, c), flashlite::rope_frequency(r, 64, c) / 4.0);
  eng::ModelConfig m;
  m.head_dim = 64;
  m.rope_theta = 10000.0;
  m.rope_style = eng::RopeStyle::interleaved;
  m.rope_scaling.type = "linear";
  m.rope_scaling.factor = 2.5;
  flashlite::RopeOptions o = eng::rope_options(m);
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.theta, 10000.0);
  EXPECT_EQ(o.layout, flashlite::RopeLayout::interleaved);
  EXPECT_FALSE(o.llama3);
  EXPECT_EQ(o.linear_factor, 2.5);
  m.rope_style = eng::RopeStyle::half_split;
  m.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  o = eng::rope_options(m);
  EXPECT_EQ(o.layout, flashlite::RopeLayout::half_split);
  EXPECT_TRUE(o.llama3);
  EXPECT_EQ(o.llama3_factor, 8.0);
  EXPECT_EQ(o.llama3_high_freq_factor, 4.0);
  EXPECT_EQ(o.llama3_original_max_position, 8192.0);
  EXPECT_EQ(o.linear_factor, 1.0);
}

}  // namespace
