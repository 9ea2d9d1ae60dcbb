// Hugging Face checkpoints written by the test itself (random weights, config.json, safetensors in F32/F16/BF16,
// sharded or not) load and give the independent float64 forward's logits; and every kind of broken checkpoint
// (truncated, bad JSON header, offsets out of range, unknown dtype, shape not matching the config, unsupported
// architecture, missing files) is a flashlite::Error with a message saying what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/llama_cpu.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace synth;

class HfCheckpoint : public ::testing::TestWithParam<Spec> {};

TEST_P(HfCheckpoint, LogitsMatchFloat64) {
  const Spec& s = GetParam();
  const fs::path dir = fresh_dir(s.name);
  const reftest::RefModel ref = write_checkpoint(dir, s, 1234);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  EXPECT_EQ(w.config.eos_ids, (std::vector<int>{2, 3})) << "generation_config.json stop tokens";
  EXPECT_EQ(w.config.tie_embeddings, s.tied);
  std::mt19937 rng(99);
  std::vector<int> tokens(50);
  for (int& t : tokens) t = int(rng() % s.vocab);
  const auto want = reftest::forward_all(ref, tokens);
  // Prefill 30 positions, then decode the rest one at a time: both paths checked.
  eng::LlamaCpu model(w, {});
  std::vector<float> got = model.forward({{0, std::vector<int>(tokens.begin(), tokens.begin() + 30), true}});
  for (size_t t = 30; t < tokens.size(); ++t) {
    const std::vector<float>& row = model.forward({{0, {tokens[t]}, true}});
    got.insert(got.end(), row.begin(), row.end());
  }
  double worst = 0, scale = 0;
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int v = 0; v < s.vocab; ++v) {
      const double g = got[t * s.vocab + v];
      worst = std::max(worst, std::isfinite(g) ? std::abs(g - want[t][v]) : INFINITY);
      scale = std::max(scale, std::abs(want[t][v]));
    }
  EXPECT_LT(worst, 1e-4) << "max abs logit error (logits up to " << scale << ")";
  EXPECT_GT(scale, 0.5) << "degenerate test model: logits too small to test anything";
  fs::remove_all(dir);
}

const Spec kSpecs[] = {
    {"f32_gqa3_untied", 48, 80, 2, 6, 2, 8, 97, "F32", false, false, 0},
    {"bf16_tied_headdim16", 48, 64, 2, 4, 1, 16, 61, "BF16", true, false, 0},
    {"f16_mha_sharded", 32, 72, 3, 4, 4, 8, 50, "F16", false, false, 3},
    {"f32_llama3_rope_scaling", 64, 96, 2, 4, 2, 16, 70, "F32", false, true, 0},
};
INSTANTIATE_TEST_SUITE_P(Synthetic, HfCheckpoint, ::testing::ValuesIn(kSpecs),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Broken checkpoints ----

class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("broken");
    write_checkpoint(dir_, spec_, 5);
    std::ifstream in(dir_ / "model.safetensors", std::ios::binary);
    good_ = std::string((std::istreambuf_iterator<char>(in)), {});
    uint64_t n;
    std::memcpy(&n, good_.data(), 8);
    header_ = json::parse(good_.substr(8, n));
    data_ = good_.substr(8 + n);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads and returns the error message ("" when it loaded).
  std::string error() {
    try {
      eng::load_checkpoint(dir_.string());
    } catch (const flashlite::Error& e) {
      return e.what();
    }
    return "";
  }
  void write_with_header(const json& h, const std::string& data) {
    std::string hs = h.dump();
    const uint64_t n = hs.size();
    write_file(dir_ / "model.safetensors", std::string(reinterpret_cast<const char*>(&n), 8) + hs + data);
  }

  Spec spec_{"broken", 32, 48, 1, 4, 2, 8, 40, "F32", true, false, 0};
  fs::path dir_;
  std::string good_, data_;
  json header_;
};

#define EXPECT_ERROR_HAS(text)                                                      \
  do {                                                                              \
    const std::string msg = error();                                                \
    EXPECT_NE(msg.find(text), std::string::npos) << "message: '" << msg << "'";  \
  } while (0)

TEST_F(BrokenCheckpoint, LoadsWhenIntact) { EXPECT_EQ(error(), ""); }

TEST_F(BrokenCheckpoint, TruncatedData) {
  write_file(dir_ / "model.safetensors", good_.substr(0, good_.size() - 64));
  EXPECT_ERROR_HAS("outside the");
}

TEST_F(BrokenCheckpoint, TruncatedHeader) {
  write_file(dir_ / "model.safetensors", good_.substr(0, 100));
  EXPECT_ERROR_HAS("truncated");
  write_file(dir_ / "model.safetensors", good_.substr(0, 5));
  EXPECT_ERROR_HAS("expected at least 8");
}

TEST_F(BrokenCheckpoint, HeaderNotJson) {
  std::string bad = good_;
  bad[8] = '[';
  bad[9] = '}';
  write_file(dir_ / "model.safetensors", bad);
  EXPECT_ERROR_HAS("not valid JSON");
}

TEST_F(BrokenCheckpoint, OffsetsOutOfRange) {
  json h = header_;
  h["model.norm.weight"]["data_offsets"][1] = data_.size() + 4;
  write_with_header(h, data_);
  EXPECT_ERROR_HAS("outside the");
}

TEST_F(BrokenCheckpoint, OffsetsNotMatchingShape) {
  json h = header_;
  auto off = h["model.norm.weight"]["data_offsets"];
  h["model.norm.weight"]["data_offsets"][1] = off[1].get<uint64_t>() - 4;
  write_with_header(h, data_);
  EXPECT_ERROR_HAS("offsets span");
}

TEST_F(BrokenCheckpoint, UnknownDtype) {
  json h = header_;
  h["model.norm.weight"]["dtype"] = "I8";
  write_with_header(h, data_);
  EXPECT_ERROR_HAS("dtype 'I8'");
}

TEST_F(BrokenCheckpoint, ShapeNotMatchingConfig) {
  json c = config_json(spec_);
  c["intermediate_size"] = 50;
  write_file(dir_ / "config.json", c.dump());
  EXPECT_ERROR_HAS("the config implies [50, 32]");
}

TEST_F(BrokenCheckpoint, MissingTensor) {
  json h = header_;
  h.erase("model.layers.0.mlp.up_proj.weight");
  write_with_header(h, data_);
  EXPECT_ERROR_HAS("no tensor 'model.layers.0.mlp.up_proj.weight'");
}

TEST_F(BrokenCheckpoint, UnsupportedArchitectureAndConfig) {
  json c = config_json(spec_);
  c["model_type"] = "gpt2";
  c["architectures"] = {"GPT2LMHeadModel"};
  write_file(dir_ / "config.json", c.dump());
  EXPECT_ERROR_HAS("'GPT2LMHeadModel' is unsupported");
  c = config_json(spec_);
  c["num_key_value_heads"] = 3;
  write_file(dir_ / "config.json", c.dump());
  EXPECT_ERROR_HAS("not a multiple of num_key_value_heads 3");
  c = config_json(spec_);
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_file(dir_ / "config.json", c.dump());
  EXPECT_ERROR_HAS("'yarn' is unsupported");
  write_file(dir_ / "config.json", "{not json");
  EXPECT_ERROR_HAS("is not valid JSON");
}

TEST_F(BrokenCheckpoint, MissingFiles) {
  fs::remove(dir_ / "model.safetensors");
  EXPECT_ERROR_HAS("neither model.safetensors nor model.safetensors.index.json");
  fs::remove(dir_ / "config.json");
  EXPECT_ERROR_HAS("has no config.json");
  write_file(dir_ / "config.json", config_json(spec_).dump());
  write_file(dir_ / "model.safetensors.index.json", json({{"weight_map", {{"model.norm.weight", "absent.safetensors"}}}}).dump());
  EXPECT_ERROR_HAS("absent.safetensors");
}

}  // namespace
