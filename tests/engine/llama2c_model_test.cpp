// The real tiny llama2.c models (stories260K, babyllama-tok105) against the independent float64 forward:
// teacher-forced and incremental logits within 1e-4, greedy generation that follows the float64 argmax and decodes
// to printable text, batches of different lengths equal to single runs, and clear errors for bad files and inputs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/generator.h"
#include "engine/llama_cpu.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "models_required.h"

namespace {

namespace eng = flashlite::engine;

struct ModelCase {
  const char* name;
  const char* model;      // relative to the models dir
  const char* tokenizer;  // relative to the models dir
};

const ModelCase kCases[] = {
    {"stories260K", "stories260K/stories260K.bin", "stories260K/tok512.bin"},
    {"babyllama_tok105", "babyllama-tok105/model5000.bin", "babyllama-tok105/tok105.bin"},
};

class Llama2cModel : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    model_path_ = reftest::models_dir() + "/" + GetParam().model;
    tok_path_ = reftest::models_dir() + "/" + GetParam().tokenizer;
    if (!std::filesystem::exists(model_path_) || !std::filesystem::exists(tok_path_)) {
      FLASHLITE_MODEL_ABSENT("model files absent (" << model_path_ << "); set FLASHLITE_MODELS to ../shared/models");
    }
    ASSERT_TRUE(reftest::read_llama2c(model_path_, ref_));
    weights_ = eng::load_checkpoint(model_path_);
    tok_ = eng::load_tokenizer(tok_path_);
  }

  std::vector<int> prompt(const std::string& text) const {
    std::vector<int> ids{1};
    for (int t : tok_->encode(text, false)) ids.push_back(t);
    return ids;
  }

  // BOS + a real sentence + random tokens: covers real and unusual positions.
  std::vector<int> mixed_tokens(int n, uint32_t seed) const {
    std::vector<int> ids = prompt("Once upon a time, there was a little dog.");
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> pick(3, ref_.vocab - 1);
    while (int(ids.size()) < n) ids.push_back(pick(rng));
    ids.resize(n);
    return ids;
  }

  std::string model_path_, tok_path_;
  reftest::RefModel ref_;
  eng::ModelWeights weights_;
  std::unique_ptr<eng::Tokenizer> tok_;
};

double max_abs_diff(const float* got, const std::vector<double>& want) {
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::abs(double(got[i]) - want[i]));
  }
  return e;
}

TEST_P(Llama2cModel, TeacherForcedLogitsMatchFloat64) {
  const std::vector<int> tokens = mixed_tokens(48, 7);
  const auto want = reftest::forward_all(ref_, tokens);
  eng::LlamaCpu model(weights_, {});
  const std::vector<float>& got = model.forward({{0, tokens, true}});
  ASSERT_EQ(got.size(), tokens.size() * size_t(ref_.vocab));
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) worst = std::max(worst, max_abs_diff(&got[t * ref_.vocab], want[t]));
  EXPECT_LT(worst, 1e-4) << "max abs logit error over " << tokens.size() << " positions";
}

TEST_P(Llama2cModel, IncrementalDecodeMatchesFloat64) {
  const std::vector<int> tokens = mixed_tokens(40, 11);
  const auto want = reftest::forward_all(ref_, tokens);
  eng::LlamaCpu model(weights_, {});
  // Chunks of 1, 3, 1, 7, ...: prefill and decode steps against a partially filled cache.
  const int chunks[] = {1, 3, 1, 7, 1, 1, 5, 2};
  size_t pos = 0;
  for (int c = 0; pos < tokens.size(); ++c) {
    const size_t n = std::min<size_t>(chunks[c % 8], tokens.size() - pos);
    std::vector<int> part(tokens.begin() + pos, tokens.begin() + pos + n);
    const std::vector<float>& got = model.forward({{0, part, true}});
    for (size_t i = 0; i < n; ++i) {
      EXPECT_LT(max_abs_diff(&got[i * ref_.vocab], want[pos + i]), 1e-4) << "position " << pos + i;
    }
    pos += n;
  }
  EXPECT_EQ(model.cache().length(0), int(tokens.size()));
}

TEST_P(Llama2cModel, GreedyGenerationFollowsFloat64AndIsText) {
  const std::vector<int> p = prompt("Once upon a time");
  eng::RuntimeOptions ro;
  eng::LlamaCpu model(weights_, ro);
  eng::GenerationParams gp;
  gp.max_new_tokens = 80;
  gp.stop_ids = weights_.config.eos_ids;
  const eng::GenerationResult r = eng::generate(model, {p}, gp);
  const std::vector<int>& out = r.tokens[0];
  ASSERT_GE(out.size(), 20u) << "generation stopped early: " << r.finish_reason[0];
  // Teacher-force the float64 model on prompt + output: every generated token must be its argmax (or tie it
  // within 1e-4, where float32 rounding may legitimately pick the other one).
  std::vector<int> seq = p;
  seq.insert(seq.end(), out.begin(), out.end());
  const auto logits = reftest::forward_all(ref_, seq);
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<double>& row = logits[p.size() - 1 + i];
    const double best = *std::max_element(row.begin(), row.end());
    EXPECT_GE(row[out[i]], best - 1e-4) << "step " << i << " picked token " << out[i];
  }
  const std::string text = tok_->decode(out);
  int letters = 0;
  for (unsigned char c : text) {
    EXPECT_TRUE(std::isprint(c) || c == '\n') << "unprintable byte " << int(c) << " in: " << text;
    letters += std::isalpha(c) != 0;
  }
  EXPECT_GT(letters, int(text.size()) / 2) << text;
  EXPECT_NE(text.find(' '), std::string::npos) << text;
}

TEST_P(Llama2cModel, BatchOfDifferentLengthsEqualsSingleRuns) {
  const std::vector<std::vector<int>> prompts = {prompt("Once upon a time"), prompt("The cat"),
                                                 prompt("Lily and Tom went to the park to play with a big red ball.")};
  eng::GenerationParams gp;
  gp.max_new_tokens = 30;
  eng::RuntimeOptions batch_opts;
  batch_opts.slots = 3;
  eng::LlamaCpu batch_model(weights_, batch_opts);
  const eng::GenerationResult batched = eng::generate(batch_model, prompts, gp);
  for (size_t b = 0; b < prompts.size(); ++b) {
    eng::LlamaCpu single(weights_, {});
    const eng::GenerationResult alone = eng::generate(single, {prompts[b]}, gp);
    EXPECT_EQ(batched.tokens[b], alone.tokens[0]) << "sequence " << b;
  }
}

TEST_P(Llama2cModel, SamplingIsSeededAndTopKOneIsGreedy) {
  const std::vector<int> p = prompt("Once upon a time");
  eng::LlamaCpu model(weights_, {});
  eng::GenerationParams gp;
  gp.max_new_tokens = 25;
  const auto greedy = eng::generate(model, {p}, gp).tokens[0];
  gp.sampling = {1.0f, 0, 1.0f, 42};
  const auto a = eng::generate(model, {p}, gp).tokens[0];
  const auto b = eng::generate(model, {p}, gp).tokens[0];
  EXPECT_EQ(a, b) << "same seed, different samples";
  gp.sampling.seed = 43;
  const auto c = eng::generate(model, {p}, gp).tokens[0];
  EXPECT_NE(a, c) << "different seeds gave identical 25-token samples";
  gp.sampling = {0.8f, 1, 1.0f, 5};
  EXPECT_EQ(eng::generate(model, {p}, gp).tokens[0], greedy) << "top_k = 1 must be greedy";
}

TEST_P(Llama2cModel, ContextOverflowAndBadTokensAreErrors) {
  eng::RuntimeOptions ro;
  ro.context = 16;
  eng::LlamaCpu model(weights_, ro);
  const std::vector<int> long_prompt = mixed_tokens(20, 3);
  eng::GenerationParams gp;
  try {
    eng::generate(model, {long_prompt}, gp);
    FAIL() << "no error for a prompt longer than the context";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("context holds 16"), std::string::npos) << e.what();
  }
  try {
    model.forward({{0, {1, ref_.vocab}, false}});
    FAIL() << "no error for an out-of-range token";
  } catch (const flashlite::Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the model's vocabulary"), std::string::npos) << e.what();
  }
  // Generation stops cleanly when the context fills up.
  gp.max_new_tokens = 100;
  const auto r = eng::generate(model, {mixed_tokens(10, 4)}, gp);
  EXPECT_EQ(r.finish_reason[0], "context");
  EXPECT_LE(r.tokens[0].size(), 7u);
}

INSTANTIATE_TEST_SUITE_P(Real, Llama2cModel, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Broken files ----

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("flashlite_engine_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string load_error(const std::string& path) {
  try {
    eng::load_checkpoint(path);
  } catch (const flashlite::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Llama2cFiles, TruncatedCorruptAndMissingFilesAreErrors) {
  const std::string src = reftest::models_dir() + "/stories260K/stories260K.bin";
  if (!std::filesystem::exists(src)) { FLASHLITE_MODEL_ABSENT("model file absent: " << src); }
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string p = temp_path("bad.bin");
  auto write = [&](const std::string& data) { std::ofstream(p, std::ios::binary).write(data.data(), data.size()); };

  write(bytes.substr(0, bytes.size() - 100));
  EXPECT_NE(load_error(p).find("truncated"), std::string::npos) << load_error(p);
  write(bytes.substr(0, 10));
  EXPECT_NE(load_error(p).find("28-byte header"), std::string::npos) << load_error(p);
  std::string neg = bytes;
  const int32_t bad_dim = -64;
  std::memcpy(neg.data(), &bad_dim, 4);
  write(neg);
  EXPECT_NE(load_error(p).find("header field 0 = -64"), std::string::npos) << load_error(p);
  std::string heads = bytes;
  const int32_t three = 3;  // 8 heads / 3 kv heads
  std::memcpy(heads.data() + 16, &three, 4);
  write(heads);
  EXPECT_NE(load_error(p).find("not a multiple"), std::string::npos) << load_error(p);
  std::filesystem::remove(p);
  EXPECT_NE(load_error(p).find("does not exist"), std::string::npos) << load_error(p);
}

// The version-1 ("ak42") layout of the same weights loads to the same model: written here from the v0 file.
TEST(Llama2cFiles, Version1FormatEqualsLegacy) {
  const std::string src = reftest::models_dir() + "/stories260K/stories260K.bin";
  if (!std::filesystem::exists(src)) { FLASHLITE_MODEL_ABSENT("model file absent: " << src); }
  std::ifstream in(src, std::ios::binary);
  const std::string v0((std::istreambuf_iterator<char>(in)), {});
  int32_t h[7];
  std::memcpy(h, v0.data(), 28);
  const size_t dim = h[0], hid = h[1], L = h[2], hd = dim / h[3], kvd = size_t(h[4]) * hd, vocab = h[5];
  // v0 sections in order, as byte ranges.
  std::vector<std::pair<size_t, size_t>> sec;
  size_t off = 28;
  for (size_t n : {vocab * dim, L * dim, L * dim * dim, L * kvd * dim, L * kvd * dim, L * dim * dim, L * dim,
                   L * hid * dim, L * dim * hid, L * hid * dim, dim}) {
    sec.emplace_back(off, n * 4);
    off += n * 4;
  }
  enum { emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final };
  std::string v1(256, '\0');
  const uint32_t magic = 0x616b3432;
  const int32_t version = 1;
  std::memcpy(v1.data(), &magic, 4);
  std::memcpy(v1.data() + 4, &version, 4);
  std::memcpy(v1.data() + 8, h, 28);
  v1[36] = 1;  // shared classifier
  for (int k : {rms_att, rms_ffn, rms_final, emb, wq, wk, wv, wo, w1, w2, w3}) v1 += v0.substr(sec[k].first, sec[k].second);
  const std::string p = temp_path("v1.bin");
  std::ofstream(p, std::ios::binary).write(v1.data(), v1.size());
  const eng::ModelWeights a = eng::load_checkpoint(src), b = eng::load_checkpoint(p);
  std::filesystem::remove(p);
  const std::vector<int> tokens{1, 403, 407, 261, 378, 300, 301};
  eng::LlamaCpu ma(a, {}), mb(b, {});
  EXPECT_EQ(ma.forward({{0, tokens, true}}), mb.forward({{0, tokens, true}}));
}

}  // namespace
