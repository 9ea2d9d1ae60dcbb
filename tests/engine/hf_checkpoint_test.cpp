// Hugging Face checkpoints written by the test itself (random weights, config.json, safetensors in F32/F16/BF16,
// sharded or not, every RoPE scaling the engine accepts: default, linear, llama3) load and give the independent
// float64 forward's logits; and every kind of broken checkpoint
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

constexpr int kTokens = 50;  // positions each synthetic checkpoint runs (prefill 30, then decode)

class HfCheckpoint : public ::testing::TestWithParam<Spec> {};

TEST_P(HfCheckpoint, LogitsMatchFloat64) {
  const Spec& s = GetParam();
  const fs::path dir = fresh_dir(s.name);
  const reftest::RefModel ref = write_checkpoint(dir, s, 1234);
  const eng::ModelWeights w = eng::load_checkpoint(dir.string());
  EXPECT_EQ(w.config.eos_ids, (std::vector<int>{2, 3})) << "generation_config.json stop tokens";
  EXPECT_EQ(w.config.tie_embeddings, s.tied);
  std::mt19937 rng(99);
  std::vector<int> tokens(kTokens);
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

// Llama 3.1's recipe (factor 8; low / high frequency factors 2 and 8, not the defaults 1 and 4, so both are read) at
// head_dim 16 and theta 10000, whose pairs have wavelengths 2 pi 10000^(i/8) = 6.3, 19.9, 62.8, 198.7, 628, ...: an
// original context of 696 keeps those below 696 / 8 = 87 (pairs 0-2), slows those above 696 / 2 = 348 (pairs 4-7)
// and blends pair 3 with weight (696 / 198.7 - 2) / 6 = 0.25 on the unscaled frequency: at position 49 its angle is
// 1.0 rad from the kept one, 0.34 from the slowed one and 0.68 from the blend with the weights swapped.
// Llama3RopeCaseCrossesEveryBand checks this with the reference's formula.
constexpr Rope kLlama3Bands{.theta = 10000.0, .type = "llama3", .factor = 8.0, .low_freq_factor = 2.0,
                            .high_freq_factor = 8.0, .original_max_position = 696};

const Spec kSpecs[] = {
    {"f32_gqa3_untied", 48, 80, 2, 6, 2, 8, 97, "F32", false, false, 0},
    {"bf16_tied_headdim16", 48, 64, 2, 4, 1, 16, 61, "BF16", true, false, 0},
    {"f16_mha_sharded", 32, 72, 3, 4, 4, 8, 50, "F16", false, false, 3},
    {"f32_llama3_rope_scaling", 64, 96, 2, 4, 2, 16, 70, "F32", false, false, 0, kLlama3Bands},
    // linear: positions divided by the factor, under the older configs' "type" key
    {"f32_linear_rope_scaling", 64, 96, 2, 4, 2, 16, 70, "F32", false, false, 0,
     {.theta = 10000.0, .type = "linear", .factor = 4.0, .type_key = "type"}},
    // transformers >= 5: rope_parameters carries the theta and the scaling (no top-level rope_theta)
    {"bf16_linear_rope_parameters", 48, 64, 2, 4, 2, 16, 61, "BF16", true, false, 0,
     {.theta = 20000.0, .type = "linear", .factor = 2.5, .parameters = true}},
    {"f16_default_rope_parameters", 48, 64, 2, 4, 2, 16, 61, "F16", false, false, 0,
     {.theta = 40000.0, .type = "default", .parameters = true}},
};
INSTANTIATE_TEST_SUITE_P(Synthetic, HfCheckpoint, ::testing::ValuesIn(kSpecs),
                         [](const auto& info) { return std::string(info.param.name); });

// The llama3 case puts at least one rotary pair in each band of the recipe (kept, blended, slowed), by the float64
// reference's own band rule; and its blended pairs turn, by the last position, more than 0.1 rad away from where
// the kept, the slowed and the swapped blend (keep and 1 - keep exchanged) would put them, so LogitsMatchFloat64
// sees a mistake in any band.
TEST(HfRopeScaling, Llama3RopeCaseCrossesEveryBand) {
  const Spec* spec = nullptr;
  for (const Spec& s : kSpecs)
    if (std::string(s.name) == "f32_llama3_rope_scaling") spec = &s;
  ASSERT_NE(spec, nullptr);
  reftest::RefModel m;
  m.head_dim = spec->head_dim;
  set_rope(*spec, m);
  ASSERT_EQ(m.scaling, reftest::RefModel::Scaling::llama3);
  std::map<reftest::RopeBand, int> pairs;
  for (int i = 0; i < m.head_dim / 2; ++i) {
    double keep = -1;
    const reftest::RopeBand band = reftest::rope_band(m, i, &keep);
    ++pairs[band];
    if (band != reftest::RopeBand::blended) continue;
    const double f = std::pow(m.theta, -2.0 * i / m.head_dim), slowed = f / m.scale_factor;
    const double blend = keep * f + (1 - keep) * slowed, swapped = (1 - keep) * f + keep * slowed;
    for (double other : {f, slowed, swapped})
      EXPECT_GT((kTokens - 1) * std::abs(blend - other), 0.1) << "blended pair " << i << " (keep " << keep << ")";
  }
  EXPECT_GE(pairs[reftest::RopeBand::kept], 1) << "no pair keeps its frequency";
  EXPECT_GE(pairs[reftest::RopeBand::blended], 1) << "no pair in the blended band";
  EXPECT_GE(pairs[reftest::RopeBand::slowed], 1) << "no pair slowed by the factor";
}

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
  h["model.layers.0.mlp.renamed.weight"] = h["model.layers.0.mlp.up_proj.weight"];  // its bytes stay covered
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
