// ChatSession keeps the KV cache between turns; after a failed turn the cache, the pending token and the formatted
// conversation still agree: a turn rejected before its tokens were accepted leaves the session as it was (an empty
// session still starts with BOS), and a turn that fails after its prompt was processed continues from what is in
// the cache. Checked against generate() on the whole conversation fed at once (greedy, stories260K).
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "engine/chat_template.h"
#include "engine/generator.h"
#include "engine/llama_cpu.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "models_required.h"

namespace {

namespace eng = flashlite::engine;

class ChatSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = reftest::models_dir() + "/stories260K/stories260K.bin";
    const std::string tok = reftest::models_dir() + "/stories260K/tok512.bin";
    if (!std::filesystem::exists(model) || !std::filesystem::exists(tok)) { FLASHLITE_MODEL_ABSENT("stories260K absent: " << model); }
    weights_ = eng::load_checkpoint(model);
    tok_ = eng::load_tokenizer(tok);
    gp_.max_new_tokens = 6;  // greedy, no stop tokens: every turn generates exactly 6
  }

  std::unique_ptr<eng::LlamaCpu> model(int context) {
    eng::RuntimeOptions ro;
    ro.context = context;
    return std::make_unique<eng::LlamaCpu>(weights_, ro);
  }
  std::vector<int> text(const std::string& s) const { return tok_->encode(s, false); }
  // Greedy continuation of the whole conversation fed at once, on a fresh model.
  std::vector<int> reference(const std::vector<int>& conversation, int context = 0) {
    auto m = model(context);
    return eng::generate(*m, {conversation}, gp_).tokens[0];
  }

  eng::ModelWeights weights_;
  std::unique_ptr<eng::Tokenizer> tok_;
  eng::GenerationParams gp_;
};

std::vector<int> cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A failure after the prompt was processed (here the token callback throws at the k-th token): the prompt and the
// tokens generated before it are in the cache, the k-th token is not; the next turn must feed exactly that token.
class ChatSessionFailsMidTurn : public ChatSessionTest, public ::testing::WithParamInterface<int> {};

TEST_P(ChatSessionFailsMidTurn, NextTurnContinuesFromTheCache) {
  const int k = GetParam();
  auto m = model(0);
  eng::ChatSession session(*m);
  const std::vector<int> p1 = cat({1}, text("Once upon a time"));
  const eng::GenerationResult r1 = session.turn(p1, gp_);
  ASSERT_EQ(r1.tokens[0].size(), 6u);

  const std::vector<int> p2 = text(" Then the dog");
  std::vector<int> seen;
  auto throw_at_k = [&](int, int tok) {
    seen.push_back(tok);
    if (int(seen.size()) == k) throw std::runtime_error("callback failed");
  };
  EXPECT_THROW(session.turn(p2, gp_, throw_at_k), std::runtime_error);
  ASSERT_EQ(int(seen.size()), k);
  // Cache: turn 1 (its last token was pending), turn 2's prompt, the k-1 tokens fed before the failure.
  EXPECT_EQ(session.cached_tokens(), int(p1.size() + r1.tokens[0].size() + p2.size()) + k - 1);

  const std::vector<int> p3 = text(" and the cat");
  const eng::GenerationResult r3 = session.turn(p3, gp_);
  const std::vector<int> whole = cat(cat(cat(p1, r1.tokens[0]), cat(p2, seen)), p3);
  EXPECT_EQ(r3.tokens[0], reference(whole));
  EXPECT_EQ(session.cached_tokens(), int(whole.size()) + 6 - 1);
}

INSTANTIATE_TEST_SUITE_P(AtToken, ChatSessionFailsMidTurn, ::testing::Values(1, 3));

// A turn rejected before anything was fed (too long for the context) changes nothing: the pending token of the
// previous turn is still fed next.
TEST_F(ChatSessionTest, RejectedTurnKeepsThePendingToken) {
  auto m = model(64);
  eng::ChatSession session(*m);
  const std::vector<int> p1 = cat({1}, text("Once upon a time"));
  const eng::GenerationResult r1 = session.turn(p1, gp_);
  const int cached = session.cached_tokens();
  std::vector<int> too_long;
  for (int i = 0; i < 10; ++i) too_long = cat(too_long, text(" the cat sat on the mat"));
  EXPECT_THROW(session.turn(too_long, gp_), flashlite::Error);
  EXPECT_EQ(session.cached_tokens(), cached);
  EXPECT_FALSE(session.empty());

  const std::vector<int> p3 = text(" Then the dog");
  const eng::GenerationResult r3 = session.turn(p3, gp_);
  EXPECT_EQ(r3.tokens[0], reference(cat(cat(p1, r1.tokens[0]), p3), 64));
}

// The formatter takes the conversation's start from the session: a rejected first turn leaves the session empty, so
// the next message still gets BOS (and, with the Llama 3 template, the system prompt).
TEST_F(ChatSessionTest, RejectedFirstTurnStillStartsWithBos) {
  auto m = model(64);
  eng::ChatSession session(*m);
  eng::ChatFormatter fmt(*tok_, 1, "");
  std::string too_long;
  for (int i = 0; i < 10; ++i) too_long += " the cat sat on the mat";
  EXPECT_THROW(session.turn(fmt.user_turn(too_long, session.empty()), gp_), flashlite::Error);
  EXPECT_TRUE(session.empty());

  const std::vector<int> turn = fmt.user_turn("Once upon a time", session.empty());
  ASSERT_EQ(turn.front(), 1);
  EXPECT_EQ(session.turn(turn, gp_).tokens[0], reference(turn, 64));
  EXPECT_FALSE(session.empty());
  EXPECT_NE(fmt.user_turn("Then", session.empty()).front(), 1);
}

TEST_F(ChatSessionTest, TurnWithoutNewTokensIsAnError) {
  auto m = model(0);
  eng::ChatSession session(*m);
  gp_.max_new_tokens = 0;
  EXPECT_THROW(session.turn(cat({1}, text("Once")), gp_), flashlite::Error);
  EXPECT_TRUE(session.empty());
}

}  // namespace
