// The pieces under `flashlite serve`: PageAllocator and the paged KvCache (pages follow the lengths, a failed growth
// changes nothing, the page table the library reads), the CPU model on a paged cache against the contiguous one, and
// TextStream (stop strings across tokens, UTF-8 characters split across tokens), and the scheduler's emitter thread (a
// stop string found off the scheduler thread, shutdown).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <thread>

#include "engine/errors.h"
#include "engine/kv_cache.h"
#include "engine/llama_cpu.h"
#include "engine/server/scheduler.h"
#include "engine/server/text_stream.h"
#include "engine/weights.h"
#include "synthetic_hf.h"

namespace eng = flashlite::engine;
namespace srv = flashlite::engine::server;

namespace {

// The tiny random checkpoint (fp32, GQA, vocabulary 70) these tests serve, written fresh under `name`.
synth::Spec tiny_spec(const char* name) { return {name, 64, 96, 2, 4, 2, 16, 70, "F32", false, true, 0}; }

eng::ModelWeights tiny_weights(const synth::Spec& spec, int seed) {
  const auto dir = synth::fresh_dir(spec.name);
  synth::write_checkpoint(dir, spec, seed);
  return eng::load_checkpoint(dir.string());
}

// Runtime options for the tiny model: `slots` slots of its whole context (96), on a paged cache of `pages` pages of
// 16 tokens when pages > 0.
eng::RuntimeOptions tiny_options(int slots, int pages = 0) {
  eng::RuntimeOptions ro;
  ro.slots = slots;
  ro.context = 96;
  if (pages > 0) {
    ro.kv_page_size = 16;
    ro.kv_pages = pages;
  }
  return ro;
}

TEST(PageAllocator, TakesLowestFirstAndRefusesWhatIsNotFree) {
  eng::PageAllocator a(4);
  std::vector<int32_t> got;
  a.take(3, got);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.free(), 1);
  EXPECT_THROW(a.take(2, got), flashlite::Error);
  EXPECT_EQ(got.size(), 3u) << "a refused take must take nothing";
  a.give_back(got.data() + 1, 2);
  EXPECT_EQ(a.used(), 1);
  a.take(1, got);
  EXPECT_EQ(got.back(), 1);
}

eng::KvCacheShape paged_shape(int pages) { return {2, 3, 100, 2, 8, 16, pages}; }

TEST(PagedKvCache, PagesFollowTheLengths) {
  eng::KvCache c(paged_shape(8));
  c.set_length(0, 17);  // 2 pages
  c.set_length(2, 16);  // 1 page
  EXPECT_EQ(c.pages().used(), 3);
  const flashlite::KvCacheView v = c.view(1, 0, 3);
  ASSERT_EQ(v.layout, flashlite::KvLayout::paged);
  const auto* indptr = static_cast<const int32_t*>(v.host.page_indptr.data);
  const auto* last = static_cast<const int32_t*>(v.host.last_page_len.data);
  EXPECT_EQ(std::vector<int32_t>(indptr, indptr + 4), (std::vector<int32_t>{0, 2, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(last, last + 3), (std::vector<int32_t>{1, 0, 16}));
  for (int b = 0; b < 3; ++b) EXPECT_EQ(flashlite::kv_length(v, b), c.length(b));
  c.set_length(0, 3);  // shrinks to 1 page
  EXPECT_EQ(c.pages().used(), 2);
  c.reset(2);
  c.reset(0);
  EXPECT_EQ(c.pages().used(), 0);
}

TEST(PagedKvCache, GrowthPastTheFreePagesChangesNothing) {
  eng::KvCache c(paged_shape(4));
  c.set_length(0, 40);  // 3 pages
  try {
    c.set_length(1, 33);  // needs 3, 1 free
    FAIL() << "expected an Error";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of pages: 3 needed, 1 of 4 free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.length(1), 0);
  EXPECT_EQ(c.pages().used(), 3);
  EXPECT_THROW(eng::KvCache(eng::KvCacheShape{2, 3, 100, 2, 8, 8, 4}), flashlite::Error) << "page size below 16";
}

// The position table (the CUDA engine's mixed steps: one decode row per new position): entry p of a slot holds the
// prefix of the slot's own page list that covers positions 0..p, so the library reads p + 1 tokens there.
TEST(PagedKvBook, PositionTableHoldsEachPositionsPrefix) {
  eng::KvBook book(paged_shape(8));
  book.set_length(0, 20);  // pages taken in turns, so that no slot's pages are consecutive ids
  book.set_length(2, 17);
  book.set_length(1, 5);
  book.set_length(0, 40);
  const int slots[2] = {2, 0};
  const int32_t from[2] = {15, 30}, to[2] = {17, 33};
  eng::PageTable t;
  book.position_table(slots, from, to, 2, t);
  ASSERT_EQ(t.count(), 5);
  const int want_slot[5] = {2, 2, 0, 0, 0}, want_pos[5] = {15, 16, 30, 31, 32};
  for (int e = 0; e < 5; ++e) {
    eng::PageTable own;  // the slot's whole page list
    book.page_table(&want_slot[e], 1, own);
    const int pages = t.indptr[e + 1] - t.indptr[e];
    ASSERT_LE(pages, int(own.indices.size()));
    EXPECT_EQ(std::vector<int32_t>(t.indices.begin() + t.indptr[e], t.indices.begin() + t.indptr[e + 1]),
              std::vector<int32_t>(own.indices.begin(), own.indices.begin() + pages)) << "entry " << e;
    const flashlite::KvCacheView v = eng::kv_paged_view(paged_shape(8), nullptr, nullptr, flashlite::DType::f32,
                                                         flashlite::Device::cpu(), e, 1, int64_t(t.indices.size()),
                                                         eng::pointers(t));
    EXPECT_EQ(flashlite::kv_length(v, 0), want_pos[e] + 1) << "entry " << e;
  }
  const int slot1 = 1;
  const int32_t at5 = 5, at6 = 6;
  EXPECT_THROW(book.position_table(&slot1, &at5, &at6, 1, t), flashlite::Error) << "position 5 of a 5-token slot";
}

// The CPU model on a paged cache computes what it computes on the contiguous one: prefill chunks and decode steps of
// several sequences, slots in any order.
TEST(PagedLlamaCpu, LogitsEqualTheContiguousCache) {
  const synth::Spec spec = tiny_spec("serve_paged");
  const eng::ModelWeights w = tiny_weights(spec, 7);
  eng::LlamaCpu contiguous(w, tiny_options(3));
  eng::LlamaCpu paged(w, tiny_options(3, 9));
  std::vector<int> long_prompt;
  for (int i = 0; i < 37; ++i) long_prompt.push_back((i * 13 + 5) % 70);
  auto same = [&](const std::vector<eng::SequenceInput>& step) {
    const std::vector<float> want = contiguous.forward(step);
    const std::vector<float>& got = paged.forward(step);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
    EXPECT_LT(worst, 1e-5) << "step with " << step.size() << " sequences";
  };
  same({{2, long_prompt, false}, {0, {1, 2, 3}, false}});  // a prefill beside a short prompt
  for (int i = 0; i < 12; ++i) {
    if (i % 3 == 0) same({{0, {4 + i}, false}, {2, {9, 8, 7, 6, 5, 4, 3, 2, 1, 11}, false}});  // a chunk beside a decode
    else same({{1, {5, 6 + i}, false}, {0, {7}, false}, {2, {8}, false}});  // slots out of order
  }
  EXPECT_EQ(paged.kv_usage().pages_used, (paged.length(0) + 15) / 16 + (paged.length(1) + 15) / 16 + (paged.length(2) + 15) / 16);
  // Out of pages: the call fails and leaves every sequence as it was.
  const std::vector<int> lengths = {paged.length(0), paged.length(1), paged.length(2)};
  EXPECT_THROW(paged.forward({{1, std::vector<int>(40, 3), false}}), flashlite::Error);
  EXPECT_EQ((std::vector<int>{paged.length(0), paged.length(1), paged.length(2)}), lengths);
  for (int s = 0; s < 3; ++s) paged.reset(s);
  EXPECT_EQ(paged.kv_usage().pages_used, 0);
  EXPECT_EQ(paged.kv_usage().pages_total, 9);
}

// Tokens as fixed byte strings (a byte-level tokenizer splits characters, as Llama 3's does).
class PieceTokenizer final : public eng::Tokenizer {
 public:
  explicit PieceTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int> encode(std::string_view, bool) const override { return {}; }
  std::string decode_token(int id) const override { return pieces_.at(size_t(id)); }
  int vocab_size() const override { return int(pieces_.size()); }
  std::optional<int> token_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int) const override { return false; }
  std::string kind() const override { return "pieces"; }

 private:
  std::vector<std::string> pieces_;
};

const PieceTokenizer kTok({"He", "llo", " wor", "ld", "\xE2\x82", "\xAC", "!"});  // 4 + 5: the euro sign, split

std::vector<std::string> pushes(srv::TextStream& s, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (int id : ids) out.push_back(s.push(id));
  return out;
}

// Every token of the synthetic model's vocabulary as "<id>": a stop string "<id>" matches whole tokens only.
std::string id_piece(int id) {
  std::string p = "<";  // (not "<" + to_string(): GCC 12 warns of a false overlap there)
  p += std::to_string(id);
  return p += '>';
}

std::vector<std::string> id_pieces(int vocab) {
  std::vector<std::string> p;
  for (int i = 0; i < vocab; ++i) p.push_back(id_piece(i));
  return p;
}

std::vector<srv::TokenEvent> read_all(srv::RequestStream& s) {
  std::vector<srv::TokenEvent> events;
  while (!s.wait(events, std::chrono::seconds(20))) {
  }
  return events;
}

std::string text_of(const std::vector<srv::TokenEvent>& events) {
  std::string t;
  for (const srv::TokenEvent& e : events) t += e.text;
  return t;
}

// A metric's value in the scheduler's Prometheus text (-1: absent).
double metric(srv::Scheduler& s, const std::string& name) {
  const std::string text = "\n" + s.metrics_text();
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// A stop string is found by the emitter thread, after the scheduler sampled the token (and maybe more): the stream
// still ends with exactly the text before the stop string, finish "stop" and usage counting the tokens its client got
// (none sampled after), while the requests beside it run to their end; every KV page comes back.
TEST(Scheduler, StopStringEndsOneStreamWhileTheOthersGoOn) {
  const synth::Spec spec = tiny_spec("serve_sched");
  const eng::ModelWeights w = tiny_weights(spec, 11);
  eng::LlamaCpu model(w, tiny_options(4, 24));
  const PieceTokenizer tok(id_pieces(spec.vocab));
  srv::Scheduler sched(model, {&tok, -1, {}}, {});
  auto request = [](std::vector<int> prompt, int max_tokens, std::vector<std::string> stop = {}) {
    srv::GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.stop = std::move(stop);
    return r;
  };
  const std::vector<srv::TokenEvent> alone = read_all(*sched.submit(request({1, 2, 3}, 40)));
  ASSERT_EQ(alone.size(), 40u);
  // The stop string: the first token from the 4th on not seen before (else the first); cut before its first use.
  size_t k = 0;
  for (size_t i = 3; i < alone.size() && k == 0; ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || alone[j].token == alone[i].token;
    if (!seen) k = i;
  }
  const std::string stop = id_piece(alone[k].token);
  const std::string want = text_of(alone).substr(0, text_of(alone).find(stop));

  auto stopped = sched.submit(request({1, 2, 3}, 40, {stop, "never"}));
  auto same = sched.submit(request({1, 2, 3}, 40));
  auto other = sched.submit(request({4, 5}, 50));
  const std::vector<srv::TokenEvent> got = read_all(*stopped);
  EXPECT_EQ(text_of(got), want);
  EXPECT_EQ(stopped->finish_reason, "stop");
  EXPECT_EQ(stopped->error, "");
  EXPECT_EQ(got.size(), k + 1) << "one event per token up to the one completing the stop string, none after";
  EXPECT_EQ(stopped->completion_tokens, int(k + 1));
  EXPECT_EQ(stopped->prompt_tokens, 3);
  const std::vector<srv::TokenEvent> got_same = read_all(*same);
  EXPECT_EQ(text_of(got_same), text_of(alone));
  EXPECT_EQ(same->finish_reason, "length");
  EXPECT_EQ(same->completion_tokens, 40);
  EXPECT_EQ(read_all(*other).size(), 50u);
  EXPECT_EQ(other->finish_reason, "length");

  // The scheduler frees the stopped one at its next loop top: wait for an empty batch.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((metric(sched, "flashlite_requests_running") != 0 || metric(sched, "flashlite_kv_pages_used") != 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(metric(sched, "flashlite_kv_pages_used"), 0);
  EXPECT_EQ(metric(sched, "flashlite_requests_running"), 0);
  EXPECT_EQ(metric(sched, "flashlite_requests_finished_total"), 4);
  EXPECT_EQ(metric(sched, "flashlite_requests_failed_total"), 0);
  EXPECT_EQ(metric(sched, "flashlite_generation_tokens_total"), 40 + double(k + 1) + 40 + 50) << "tokens sent only";
  EXPECT_EQ(metric(sched, "flashlite_time_to_first_token_seconds_count"), 4);
  EXPECT_EQ(metric(sched, "flashlite_request_latency_seconds_count"), 4);
}

// stop() ends what is still queued or running with an error, through the emitter, which drains before it joins.
TEST(Scheduler, StopEndsEveryStreamWithAnError) {
  const synth::Spec spec = tiny_spec("serve_sched_stop");
  const eng::ModelWeights w = tiny_weights(spec, 12);
  eng::LlamaCpu model(w, tiny_options(1));
  const PieceTokenizer tok(id_pieces(spec.vocab));
  auto sched = std::make_unique<srv::Scheduler>(model, srv::ModelText{&tok, -1, {}}, srv::SchedulerOptions{});
  std::vector<std::shared_ptr<srv::RequestStream>> streams;
  for (int i = 0; i < 16; ++i) {  // one slot: about 1,400 steps of work, far more than stop() leaves them
    srv::GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 90;
    streams.push_back(sched->submit(r));
  }
  sched->stop();
  int errors = 0;
  for (auto& s : streams) {
    std::vector<srv::TokenEvent> events;
    ASSERT_TRUE(s->wait(events, std::chrono::seconds(0))) << "ended before stop() returned";
    EXPECT_TRUE(s->error == "the server is shutting down" || s->finish_reason == "length") << s->error;
    EXPECT_EQ(s->completion_tokens, int(events.size()));
    errors += !s->error.empty();
  }
  EXPECT_GE(errors, 1) << "one slot: at least the last request was still queued";
  EXPECT_THROW(sched->submit(srv::GenerationRequest{{1}, 1}), flashlite::Error);
}

TEST(TextStream, HoldsBackSplitCharacters) {
  srv::TextStream s(kTok, -1, -1, {});
  EXPECT_EQ(pushes(s, {0, 1, 4, 5, 6}), (std::vector<std::string>{"He", "llo", "", "\xE2\x82\xAC", "!"}));
  EXPECT_EQ(s.flush(), "");
  EXPECT_EQ(srv::incomplete_utf8_tail("a\xE2"), 1u);
  EXPECT_EQ(srv::incomplete_utf8_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(srv::incomplete_utf8_tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(srv::incomplete_utf8_tail("\x80\x80"), 0u) << "stray continuation bytes are not held";
}

TEST(TextStream, StopStringAcrossTokensIsNeverSent) {
  srv::TextStream s(kTok, -1, -1, {"lo w", "zzz"});
  EXPECT_EQ(pushes(s, {0, 1, 2, 3}), (std::vector<std::string>{"He", "l", "", ""}));
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "Hel");
  EXPECT_EQ(s.flush(), "");
}

TEST(TextStream, HeldPrefixIsReleasedWhenTheStopDoesNotComplete) {
  srv::TextStream s(kTok, -1, -1, {"low!"});
  EXPECT_EQ(pushes(s, {0, 1, 2}), (std::vector<std::string>{"He", "l", "lo wor"}));
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.text(), "Hello wor");
}

}  // namespace
