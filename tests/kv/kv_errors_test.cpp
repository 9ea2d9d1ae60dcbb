// Bad input to the KV-cache API: every case is rejected with a flashlite::Error naming the argument and the value,
// and no byte of any buffer (cache, index arrays, new tokens, q, outputs) is written.
#include <gtest/gtest.h>

#include <functional>

#include "kv_test_util.h"

namespace kvtest {
namespace {

using flashlite::AppendArgs;
using flashlite::Error;
using flashlite::ErrorKind;

// Runs f, expects an Error of `kind` whose message contains every part, and every watched buffer unchanged.
void expect_rejected(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& parts,
                     const std::vector<const std::vector<uint8_t>*>& watched) {
  std::vector<std::vector<uint8_t>> before;
  for (auto* w : watched) before.push_back(*w);
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << parts.front() << "', but the call succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << what;
    for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected flashlite::Error, got: " << e.what();
  }
  for (size_t i = 0; i < watched.size(); ++i) EXPECT_TRUE(*watched[i] == before[i]) << "buffer " << i << " was written";
}

// A paged and a contiguous cache with a decode problem and an append of 2 tokens, all valid.
struct KvFixture {
  HostCache cache;
  DecodeProblem dec;
  Buffer knew, vnew, q, qout;
  AppendArgs app;
  std::vector<uint8_t> idx_bytes;  // snapshot of the index arrays as bytes (kept current by watch())

  static CacheSpec spec(bool paged) {
    CacheSpec s;
    s.paged = paged;
    s.page_size = 16;
    s.kv_heads = 2;
    s.head_dim = 8;
    s.dtype = DType::f32;
    s.lens = {20, 33, 2};
    return s;
  }
  explicit KvFixture(bool paged) : cache(spec(paged), 7), dec(cache, DecodeSpec{}, 8) {
    const int64_t B = 3, N = 2, H = 2, D = 8;
    knew = Buffer(DType::f32, B * N * H * D);
    vnew = Buffer(DType::f32, B * N * H * D);
    q = Buffer(DType::f32, B * N * 4 * D);
    qout = Buffer(DType::f32, B * N * 4 * D);
    for (Buffer* b : {&knew, &vnew, &q, &qout})
      for (int64_t i = 0; i < b->numel(); ++i) fltest::store(DType::f32, b->data(), i, float(i % 7) - 3.f);
    app.cache = cache.view;
    app.k = fltest::view_n(knew.data(), DType::f32, {B, N, H, D}, {N * H * D, H * D, D, 1});
    app.v = fltest::view_n(vnew.data(), DType::f32, {B, N, H, D}, {N * H * D, H * D, D, 1});
  }
  std::vector<const std::vector<uint8_t>*> watched() {
    idx_bytes.clear();
    for (auto* v : {&cache.seq_lens, &cache.indptr, &cache.indices, &cache.last}) {
      const auto* b = reinterpret_cast<const uint8_t*>(v->data());
      idx_bytes.insert(idx_bytes.end(), b, b + v->size() * 4);
    }
    return {&cache.kbuf.bytes, &cache.vbuf.bytes, &dec.outbuf.bytes, &dec.lsebuf.bytes, &dec.qbuf.bytes,
            &knew.bytes,       &vnew.bytes,       &q.bytes,          &qout.bytes};
  }
};

struct BadDecode {
  std::string name;
  bool paged;
  std::function<void(KvFixture&)> breaker;
  ErrorKind kind;
  std::vector<std::string> parts;
};

std::vector<BadDecode> bad_decodes() {
  const auto V = ErrorKind::invalid_value, T = ErrorKind::invalid_type;
  return {
      {"q_batch", false, [](KvFixture& s) { s.dec.args.q.shape[0] = 2; }, V, {"q has batch 2", "expected 3"}},
      {"out_broadcast", false, [](KvFixture& s) { s.dec.args.out.strides[2] = 0; }, V, {"out has stride 0 in dimension 2"}},
      {"q_misaligned", false, [](KvFixture& s) { s.dec.args.q.data = static_cast<char*>(s.dec.args.q.data) + 2; }, V,
       {"q's data pointer is not aligned to its 4-byte float32 elements"}},
      {"cache_k_misaligned", true, [](KvFixture& s) { s.dec.args.cache.k.data = static_cast<char*>(s.dec.args.cache.k.data) + 1; }, V,
       {"cache.k's data pointer is not aligned"}},
      {"q_head_dim", false, [](KvFixture& s) { s.dec.args.q.shape[3] = 4; }, V, {"q has head_dim 4", "expected 8"}},
      {"heads_not_divisible", false, [](KvFixture& s) { s.dec.args.q.shape[2] = 3, s.dec.args.out.shape[2] = 3; }, V, {"q_heads 3 is not divisible by", "kv_heads 2"}},
      {"out_shape", false, [](KvFixture& s) { s.dec.args.out.shape[1] = 2; }, V, {"out has q_len 2", "expected 1"}},
      {"out_dtype", false, [](KvFixture& s) { s.dec.args.out.dtype = DType::bf16; }, T, {"out has dtype bfloat16", "float32"}},
      {"lse_shape", false, [](KvFixture& s) { s.dec.args.lse.shape[1] = 5; }, V, {"lse has q_heads 5", "expected 4"}},
      {"lse_dtype", false, [](KvFixture& s) { s.dec.args.lse.dtype = DType::f16; }, T, {"lse has dtype float16"}},
      {"cu_seqlens", false, [](KvFixture& s) { s.dec.args.options.cu_seqlens_q = s.cache.view.host.seq_lens; }, V, {"cu_seqlens", "takes the lengths from the cache"}},
      {"window", false, [](KvFixture& s) { s.dec.args.options.window_left = -2; }, V, {"window_left is -2"}},
      {"seq_len_overflow", false, [](KvFixture& s) { s.cache.seq_lens[1] = 1000; }, V, {"cache.host.seq_lens[1] = 1000", "overflows", "max_len"}},
      {"seq_len_negative", false, [](KvFixture& s) { s.cache.seq_lens[0] = -1; }, V, {"cache.host.seq_lens[0] = -1"}},
      {"seq_lens_size", false, [](KvFixture& s) { s.dec.args.cache.host.seq_lens.shape[0] = 2; }, V, {"cache.host.seq_lens has shape [2]", "expected [3]"}},
      {"seq_lens_dtype", false, [](KvFixture& s) { s.dec.args.cache.host.seq_lens.dtype = DType::f32; }, T, {"cache.host.seq_lens has dtype float32", "int32"}},
      {"seq_lens_on_gpu", false, [](KvFixture& s) { s.dec.args.cache.host.seq_lens.device = Device::cuda(0); }, V, {"cache.host.seq_lens is on cuda:0", "CPU memory"}},
      {"v_shape", false, [](KvFixture& s) { s.dec.args.cache.v.shape[2] = 1; }, V, {"cache.v has"}},
      {"kv_dtype", false, [](KvFixture& s) { s.dec.args.cache.v.dtype = DType::f16; }, T, {"cache.v has dtype float16"}},
      {"bad_page_id", true, [](KvFixture& s) { s.cache.indices[2] = 99; }, V, {"cache.host.page_indices[2] = 99", "bad page id"}},
      {"negative_page_id", true, [](KvFixture& s) { s.cache.indices[0] = -1; }, V, {"page_indices[0] = -1", "bad page id"}},
      {"last_page_len_zero", true, [](KvFixture& s) { s.cache.last[1] = 0; }, V, {"cache.host.last_page_len[1] = 0", "1..page_size"}},
      {"last_page_len_big", true, [](KvFixture& s) { s.cache.last[0] = 17; }, V, {"last_page_len[0] = 17"}},
      {"indptr_decreasing", true, [](KvFixture& s) { s.cache.indptr[2] = 0; }, V, {"page_indptr is not non-decreasing"}},
      {"indptr_past_indices", true, [](KvFixture& s) { s.dec.args.cache.host.page_indices.shape[0] = 3; }, V, {"points past cache.host.page_indices"}},
      {"page_size", true, [](KvFixture& s) { s.dec.args.cache.k.shape[1] = 8, s.dec.args.cache.v.shape[1] = 8; }, V, {"page_size 8", "16..256"}},
      {"backend_naive", false, [](KvFixture& s) { s.dec.args.backend = Backend::naive; }, V, {"backend 'naive' is not available"}},
      {"backend_cuda_on_cpu", false, [](KvFixture& s) { s.dec.args.backend = Backend::cuda; }, V, {"backend 'cuda' needs a CUDA cache"}},
      {"sink_logits_shape", false, [](KvFixture& s) { s.dec.args.options.sink_logits = s.dec.args.lse; }, V, {"sink_logits has shape"}},
  };
}

class KvErrors : public ::testing::TestWithParam<BadDecode> {};

TEST_P(KvErrors, DecodeRejectedAndNothingWritten) {
  const BadDecode& c = GetParam();
  KvFixture s(c.paged);
  c.breaker(s);
  auto watched = s.watched();
  expect_rejected([&] { flashlite::decode(s.dec.args); }, c.kind, c.parts, watched);
  expect_rejected([&] { (void)flashlite::plan_decode(s.dec.args); }, c.kind, c.parts, watched);
  expect_rejected([&] { (void)flashlite::decode_kernel_name(s.dec.args); }, c.kind, c.parts, watched);
}

INSTANTIATE_TEST_SUITE_P(Kv, KvErrors, ::testing::ValuesIn(bad_decodes()), [](const auto& info) { return info.param.name; });

TEST(KvErrors, DecodePlanMismatches) {
  KvFixture s(false);
  flashlite::DecodePlan plan = flashlite::plan_decode(s.dec.args);
  plan.q_len = 2;
  s.dec.args.plan = &plan;
  expect_rejected([&] { flashlite::decode(s.dec.args); }, ErrorKind::invalid_value, {"plan was made for", "q_len 2"}, s.watched());
  flashlite::DecodePlan small = flashlite::plan_decode(s.dec.args);
  EXPECT_THROW((void)flashlite::plan_decode(s.dec.args, 10), Error);
  small.max_kv_len = 10;
  s.dec.args.plan = &small;
  expect_rejected([&] { flashlite::decode(s.dec.args); }, ErrorKind::invalid_value, {"max_kv_len 10 is below the longest sequence", "33"}, s.watched());
}

struct BadAppend {
  std::string name;
  bool paged;
  std::function<void(KvFixture&)> breaker;
  ErrorKind kind;
  std::vector<std::string> parts;
};

std::vector<BadAppend> bad_appends() {
  const auto V = ErrorKind::invalid_value, T = ErrorKind::invalid_type;
  return {
      {"length_below_n", false, [](KvFixture& s) { s.cache.seq_lens[2] = 1; }, V, {"appending 2 tokens to sequence 2", "seq_lens[2] = 1", "include the new tokens"}},
      {"overflow_max_len", false, [](KvFixture& s) { s.cache.seq_lens[0] = int32_t(s.cache.cap + 1); }, V, {"overflows the cache", "max_len"}},
      {"past_the_pages", true, [](KvFixture& s) { s.cache.last[2] = 1; }, V, {"appending 2 tokens to sequence 2 past the pages given", "hold 1 tokens"}},
      {"bad_page_id", true, [](KvFixture& s) { s.cache.indices[3] = 1000; }, V, {"page_indices[3] = 1000", "bad page id"}},
      {"page_written_twice", true, [](KvFixture& s) { s.cache.indices[5] = s.cache.indices[4]; }, V, {"written by sequences 1 and 2"}},
      {"page_twice_in_one_seq", true, [](KvFixture& s) { s.cache.indices[4] = s.cache.indices[3]; }, V,
       {"page_indices[3] and [4] of sequence 1 are both page", "pages of a sequence to be distinct"}},
      {"written_page_also_read_in_one_seq", true, [](KvFixture& s) { s.cache.indices[2] = s.cache.indices[4]; }, V,
       {"page_indices[2] and [4] of sequence 1 are both page", "pages of a sequence to be distinct"}},
      {"cache_k_broadcast", false, [](KvFixture& s) { s.app.cache.k.strides[2] = 0; }, V, {"cache.k has stride 0 in dimension 2"}},
      {"k_heads", false, [](KvFixture& s) { s.app.k.shape[2] = 1; }, V, {"k has kv_heads 1", "expected 2"}},
      {"v_n", false, [](KvFixture& s) { s.app.v.shape[1] = 1; }, V, {"v has n"}},
      {"k_batch", false, [](KvFixture& s) { s.app.k.shape[0] = 1; }, V, {"k has batch 1", "expected 3"}},
      {"k_dtype", false, [](KvFixture& s) { s.app.k.dtype = DType::bf16; }, T, {"k has dtype bfloat16", "the cache has float32"}},
      {"k_on_gpu", false, [](KvFixture& s) { s.app.k.device = Device::cuda(0); }, V, {"k is on cuda:0"}},
      {"q_without_rope", false, [](KvFixture& s) {
         s.app.q = fltest::view_n(s.q.data(), DType::f32, {3, 2, 4, 8}, {64, 32, 8, 1});
         s.app.q_out = s.app.q;
       }, V, {"q is given but rope.enabled is false"}},
      {"q_out_missing", false, [](KvFixture& s) {
         s.app.rope.enabled = true;
         s.app.q = fltest::view_n(s.q.data(), DType::f32, {3, 2, 4, 8}, {64, 32, 8, 1});
       }, V, {"q_out is missing"}},
      {"q_out_overlaps_q", false, [](KvFixture& s) {
         s.app.rope.enabled = true;
         s.app.q = fltest::view_n(s.q.data(), DType::f32, {3, 2, 4, 8}, {64, 32, 8, 1});
         s.app.q_out = fltest::view_n(s.q.at(8), DType::f32, {3, 2, 4, 8}, {64, 32, 8, 1});
       }, V, {"q_out overlaps q"}},
      {"cache_v_is_cache_k", false, [](KvFixture& s) { s.app.cache.v = s.app.cache.k; }, V, {"cache.v has the same data pointer as cache.k"}},
      {"paged_cache_v_is_cache_k", true, [](KvFixture& s) { s.app.cache.v.data = s.app.cache.k.data; }, V, {"cache.v has the same data pointer as cache.k"}},
      {"new_k_inside_cache", false, [](KvFixture& s) { s.app.k.data = s.cache.kbuf.data(); }, V, {"cache.k overlaps k"}},
      {"rope_theta", false, [](KvFixture& s) { s.app.rope.enabled = true, s.app.rope.theta = 0; }, V, {"rope.theta is 0"}},
      {"rope_llama3_factors", false, [](KvFixture& s) {
         s.app.rope.enabled = true, s.app.rope.llama3 = true, s.app.rope.llama3_low_freq_factor = 5;
       }, V, {"llama3_low_freq_factor", "0 < low < high"}},
      {"rope_linear_factor", false, [](KvFixture& s) { s.app.rope.enabled = true, s.app.rope.linear_factor = 0; }, V,
       {"rope.linear_factor is 0", "expected a finite number > 0"}},
      {"backend_reference", false, [](KvFixture& s) { s.app.backend = Backend::reference; }, V, {"append_kv: backend 'reference' is not available"}},
  };
}

class KvAppendErrors : public ::testing::TestWithParam<BadAppend> {};

TEST_P(KvAppendErrors, AppendRejectedAndNothingWritten) {
  const BadAppend& c = GetParam();
  KvFixture s(c.paged);
  c.breaker(s);
  expect_rejected([&] { flashlite::append_kv(s.app); }, c.kind, c.parts, s.watched());
}

INSTANTIATE_TEST_SUITE_P(Kv, KvAppendErrors, ::testing::ValuesIn(bad_appends()), [](const auto& info) { return info.param.name; });

TEST(KvErrors, OddHeadDimWithRope) {
  CacheSpec cs = KvFixture::spec(false);
  cs.head_dim = 7;
  HostCache cache(cs, 3);
  Buffer k(DType::f32, 3 * 1 * 2 * 7), v(DType::f32, 3 * 1 * 2 * 7);
  AppendArgs a;
  a.cache = cache.view;
  a.k = fltest::view_n(k.data(), DType::f32, {3, 1, 2, 7}, {14, 14, 7, 1});
  a.v = fltest::view_n(v.data(), DType::f32, {3, 1, 2, 7}, {14, 14, 7, 1});
  a.rope.enabled = true;
  expect_rejected([&] { flashlite::append_kv(a); }, ErrorKind::invalid_value, {"head_dim 7 is odd"}, {&cache.kbuf.bytes, &cache.vbuf.bytes});
  a.rope.enabled = false;  // without rope an odd head_dim is fine
  flashlite::append_kv(a);
}

}  // namespace
}  // namespace kvtest
