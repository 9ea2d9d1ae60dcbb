// Bad input to prefill(): every case is rejected with a flashlite::Error naming the argument and the value, and no
// byte of the cache, the index arrays, q or the outputs is written.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "prefill_test_util.h"

namespace kvtest {
namespace {

using flashlite::Error;
using flashlite::ErrorKind;

// A valid ragged prefill over a paged or contiguous fp32 cache (3 sequences, chunks 4 / 1 / 2).
struct Fixture {
  HostCache cache;
  PrefillProblem p;
  Buffer other;  // a spare buffer for bad views
  std::vector<int32_t> cu_bad;

  static PrefillCase tcase(bool paged, bool ragged) {
    PrefillCase t;
    t.paged = paged;
    t.dtype = DType::f32;
    t.head_dim = 8;
    t.kv_heads = 2;
    t.q_heads = 4;
    t.lens = {20, 33, 2};
    if (ragged) t.chunks = {4, 1, 2};
    t.q_len = 2;
    t.opt = causal_opt();
    return t;
  }
  Fixture(bool paged, bool ragged)
      : cache(cache_of(tcase(paged, ragged)), 3), p(cache, spec_of(tcase(paged, ragged)), 4), other(DType::f32, 4096) {
    p.args.backend = Backend::cpu;
  }
  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> s = {cache.kbuf.bytes, cache.vbuf.bytes, p.qbuf.bytes, p.outbuf.bytes, p.lsebuf.bytes};
    for (auto* v : {&cache.seq_lens, &cache.indptr, &cache.indices, &cache.last, &p.cu}) {
      const auto* b = reinterpret_cast<const uint8_t*>(v->data());
      s.emplace_back(b, b + v->size() * 4);
    }
    return s;
  }
};

struct Bad {
  std::string name;
  bool paged, ragged;
  std::function<void(Fixture&)> breaker;
  ErrorKind kind;
  std::vector<std::string> parts;
};

std::vector<Bad> bad_cases() {
  using K = ErrorKind;
  return {
      {"bad_page_id", true, true, [](Fixture& f) { f.cache.indices[1] = 999; }, K::invalid_value, {"page_indices[1] = 999", "bad page id"}},
      {"negative_page_id", true, false, [](Fixture& f) { f.cache.indices[0] = -1; }, K::invalid_value, {"bad page id"}},
      {"last_page_len_too_big", true, true, [](Fixture& f) { f.cache.last[0] = 17; }, K::invalid_value, {"last_page_len[0] = 17"}},
      {"seq_len_overflow", false, true, [](Fixture& f) { f.cache.seq_lens[1] = 1000; }, K::invalid_value, {"seq_lens[1] = 1000"}},
      {"padded_chunk_longer_than_sequence", false, false, [](Fixture& f) { f.cache.seq_lens[2] = 1; }, K::invalid_value,
       {"q_len 2", "sequence 2 holds 1 tokens", "cu_seqlens_q"}},
      {"ragged_chunk_longer_than_sequence", true, true, [](Fixture& f) { f.p.cu = {0, 4, 5, 8}; f.p.args.options.cu_seqlens_q = i32_view(f.p.cu); },
       K::invalid_value, {"sequence 2 has a chunk of 3 queries", "holds 2 tokens"}},
      {"cu_seqlens_q_not_monotone", true, true, [](Fixture& f) { f.p.cu[2] = 3; }, K::invalid_value, {"not non-decreasing"}},
      {"cu_seqlens_q_past_rows", false, true, [](Fixture& f) { f.p.cu = {0, 4, 30, 32}; f.p.args.options.cu_seqlens_q = i32_view(f.p.cu); },
       K::invalid_value, {"ends at 32", "past q's 10 rows"}},
      {"cu_seqlens_q_wrong_size", true, true,
       [](Fixture& f) { f.cu_bad = {0, 4}; f.p.args.options.cu_seqlens_q = i32_view(f.cu_bad); }, K::invalid_value, {"cu_seqlens_q has shape [2]", "expected [4]"}},
      {"cu_seqlens_q_first_not_zero", true, true, [](Fixture& f) { f.p.cu[0] = 1; }, K::invalid_value, {"cu_seqlens_q[0] is 1"}},
      {"cu_seqlens_k_given", true, true, [](Fixture& f) { f.p.args.options.cu_seqlens_k = f.p.args.options.cu_seqlens_q; }, K::invalid_value,
       {"cu_seqlens_k", "expected it empty"}},
      {"ragged_q_batch_not_1", true, true, [](Fixture& f) { f.p.args.q.shape[0] = 2; }, K::invalid_value, {"q has shape [2,", "expected batch 1"}},
      {"q_dtype", true, true, [](Fixture& f) { f.p.args.q.dtype = DType::bf16; }, K::invalid_type, {"q has dtype bfloat16"}},
      {"padded_q_dtype", false, false, [](Fixture& f) { f.p.args.q.dtype = DType::f16; }, K::invalid_type, {"q has dtype float16"}},
      {"q_head_dim", true, true, [](Fixture& f) { f.p.args.q.shape[3] = 16; f.p.args.out.shape[3] = 16; }, K::invalid_value, {"head_dim 16"}},
      {"q_heads_not_divisible", true, true, [](Fixture& f) { f.p.args.q.shape[2] = 3; f.p.args.out.shape[2] = 3; }, K::invalid_value,
       {"q_heads 3 is not divisible"}},
      {"out_shape", true, true, [](Fixture& f) { f.p.args.out.shape[2] = 2; }, K::invalid_value, {"out has shape"}},
      {"q_missing", true, true, [](Fixture& f) { f.p.args.q = {}; }, K::invalid_value, {"q is missing"}},
      {"q_rank", false, false, [](Fixture& f) { f.p.args.q.rank = 3; }, K::invalid_value, {"q has rank 3"}},
      {"lse_shape_ragged", true, true, [](Fixture& f) { f.p.args.lse.shape[2] = 7; }, K::invalid_value, {"lse has shape", "[1, 4,"}},
      {"lse_shape_padded", false, false, [](Fixture& f) { f.p.args.lse.shape[2] = 7; }, K::invalid_value, {"lse has q_len 7"}},
      {"lse_misaligned_ragged", true, true, [](Fixture& f) { f.p.args.lse.data = static_cast<char*>(f.p.args.lse.data) + 2; },
       K::invalid_value, {"lse's data pointer is not aligned to its 4-byte float32 elements"}},
      {"cu_seqlens_q_misaligned", false, true,
       [](Fixture& f) {
         f.cu_bad.assign(5, 0);  // the valid offsets {0, 4, 5, 7}, one byte off their int32 alignment
         const int32_t cu[4] = {0, 4, 5, 7};
         char* at = reinterpret_cast<char*>(f.cu_bad.data()) + 1;
         std::memcpy(at, cu, sizeof(cu));
         f.p.args.options.cu_seqlens_q.data = at;
       },
       K::invalid_value, {"options.cu_seqlens_q's data pointer is not aligned"}},
      {"lse_dtype", true, true, [](Fixture& f) { f.p.args.lse.dtype = DType::f16; }, K::invalid_type, {"lse has dtype float16"}},
      {"out_overlaps_q", true, true, [](Fixture& f) { f.p.args.out.data = f.p.args.q.data; }, K::invalid_value, {"out overlaps q"}},
      {"out_overlaps_cache", false, true, [](Fixture& f) { f.p.args.out.data = f.cache.kbuf.data(); }, K::invalid_value,
       {"out overlaps cache.k"}},
      {"padded_out_overlaps_cache", true, false, [](Fixture& f) { f.p.args.out.data = f.cache.vbuf.data(); }, K::invalid_value,
       {"out overlaps cache.v"}},
      {"negative_window", true, true, [](Fixture& f) { f.p.args.options.window_left = -3; }, K::invalid_value, {"window_left is -3"}},
      {"sink_logits_shape", true, true,
       [](Fixture& f) { f.p.args.options.sink_logits = fltest::view_n(f.other.data(), DType::f32, {3}, {1}); }, K::invalid_value,
       {"sink_logits has shape [3]", "expected [4]"}},
      {"backend_cuda_on_cpu_cache", true, true, [](Fixture& f) { f.p.args.backend = Backend::cuda; }, K::invalid_value,
       {"backend 'cuda' needs a CUDA cache"}},
      {"backend_naive", true, true, [](Fixture& f) { f.p.args.backend = Backend::naive; }, K::invalid_value, {"backend 'naive'"}},
  };
}

class PrefillErrors : public ::testing::TestWithParam<Bad> {};

TEST_P(PrefillErrors, RejectedAndNothingWritten) {
  const Bad& c = GetParam();
  Fixture f(c.paged, c.ragged);
  {  // the fixture is valid as is
    Fixture ok(c.paged, c.ragged);
    EXPECT_NO_THROW(flashlite::prefill(ok.p.args));
  }
  c.breaker(f);
  const auto before = f.snapshot();
  try {
    flashlite::prefill(f.p.args);
    ADD_FAILURE() << "expected an error containing '" << c.parts.front() << "', but the call succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(int(e.kind()), int(c.kind)) << what;
    for (const std::string& part : c.parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected flashlite::Error, got: " << e.what();
  }
  EXPECT_TRUE(f.snapshot() == before) << "a buffer was written";
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefillErrors, ::testing::ValuesIn(bad_cases()), [](const auto& info) { return info.param.name; });

// A ragged batch whose chunks are all empty: q / out / lse have no rows (numpy gives such arrays all-zero strides, and
// two of them may share one address). Accepted, nothing written -- not "out overlaps q" from the stand-in views the
// cache checks see, nor "head_dim stride 0".
TEST(PrefillEmptyRagged, AcceptedWithZeroStridesAndSharedAddresses) {
  for (bool paged : {false, true}) {
    Fixture f(paged, true);
    f.p.cu = {0, 0, 0, 0};
    f.p.args.options.cu_seqlens_q = i32_view(f.p.cu);
    for (TensorView* t : {&f.p.args.q, &f.p.args.out, &f.p.args.lse}) {
      t->shape[t->rank - 1 == 3 ? 1 : 2] = 0;
      t->strides = {0, 0, 0, 0};
      t->data = f.other.data();
    }
    const auto before = f.snapshot();
    EXPECT_NO_THROW(flashlite::prefill(f.p.args)) << (paged ? "paged" : "contiguous");
    EXPECT_TRUE(f.snapshot() == before) << "a buffer was written";
  }
}

}  // namespace
}  // namespace kvtest
