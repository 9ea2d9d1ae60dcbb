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

namespace {

namespace eng = flashlite::engine;
namespace fs = std::filesystem;
using json = nlohmann::json;

struct Spec {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, head_dim, vocab;
  const char* dtype;  // F32, F16, BF16
  bool tied;
  bool llama3_scaling;
  int shards;  // 0 = single model.safetensors
};

// Rounds to the storage dtype (the test's own conversions) and returns the stored bytes.
uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);  // round to nearest even (inputs are finite)
  return uint16_t(b >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double>* values;  // rounded in place to what is stored
};

std::string encode(const std::string& dtype, std::vector<double>& v) {
  std::string out;
  for (double& x : v) {
    if (dtype == "F32") {
      const float f = float(x);
      x = f;
      out.append(reinterpret_cast<const char*>(&f), 4);
    } else if (dtype == "F16") {
      const _Float16 h = _Float16(float(x));
      x = double(float(h));
      out.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      const uint16_t h = to_bf16(float(x));
      x = from_bf16(h);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

// Writes `tensors` as one safetensors file; returns the file bytes so tests can corrupt them.
std::string safetensors_bytes(const std::string& dtype, std::vector<Tensor>& tensors, json* header_out = nullptr) {
  json header = json::object();
  std::string data;
  for (Tensor& t : tensors) {
    const std::string bytes = encode(dtype, *t.values);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  if (header_out) *header_out = header;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h + data;
}

void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary).write(s.data(), s.size()); }

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("flashlite_hf_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json config_json(const Spec& s) {
  json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", s.dim},
            {"intermediate_size", s.hidden}, {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"vocab_size", s.vocab},
            {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0},
            {"tie_word_embeddings", s.tied}, {"hidden_act", "silu"}, {"torch_dtype", "float32"},
            {"bos_token_id", 1}, {"eos_token_id", 2}};
  if (s.llama3_scaling) {
    // original context 32 so that positions < 64 cross all three bands (kept, blended, slowed)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  }
  return c;
}

// Random model (weights ~ N(0, 0.3/sqrt(fan_in)), norms around 1) written to `dir`; returns the stored values.
reftest::RefModel write_checkpoint(const fs::path& dir, const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  reftest::RefModel m;
  m.dim = s.dim, m.hidden = s.hidden, m.layers = s.layers, m.heads = s.heads, m.kv_heads = s.kv_heads;
  m.head_dim = s.head_dim, m.vocab = s.vocab, m.seq_len = 128, m.eps = 1e-5, m.theta = 500000.0;
  m.interleaved = false, m.tied = s.tied;
  if (s.llama3_scaling) m.scale_factor = 8, m.low_freq = 1, m.high_freq = 4, m.original_ctx = 32;
  auto randn = [&](size_t n, double sd, double mean = 0) {
    std::vector<double> v(n);
    for (double& x : v) x = mean + sd * nd(rng);
    return v;
  };
  const size_t qd = size_t(s.heads) * s.head_dim, kvd = size_t(s.kv_heads) * s.head_dim;
  m.emb = randn(size_t(s.vocab) * s.dim, 1.0);
  for (int l = 0; l < s.layers; ++l) {
    m.rms_att.push_back(randn(s.dim, 0.1, 1.0));
    m.wq.push_back(randn(qd * s.dim, 0.6 / std::sqrt(s.dim)));
    m.wk.push_back(randn(kvd * s.dim, 0.6 / std::sqrt(s.dim)));
    m.wv.push_back(randn(kvd * s.dim, 1.0 / std::sqrt(s.dim)));
    m.wo.push_back(randn(s.dim * qd, 0.5 / std::sqrt(qd)));
    m.rms_ffn.push_back(randn(s.dim, 0.1, 1.0));
    m.w1.push_back(randn(size_t(s.hidden) * s.dim, 1.0 / std::sqrt(s.dim)));
    m.w3.push_back(randn(size_t(s.hidden) * s.dim, 1.0 / std::sqrt(s.dim)));
    m.w2.push_back(randn(size_t(s.dim) * s.hidden, 0.5 / std::sqrt(s.hidden)));
  }
  m.rms_final = randn(s.dim, 0.1, 1.0);
  m.wcls = s.tied ? std::vector<double>() : randn(size_t(s.vocab) * s.dim, 1.0 / std::sqrt(s.dim));

  std::vector<Tensor> ts;
  const int64_t D = s.dim, H = s.hidden;
  ts.push_back({"model.embed_tokens.weight", {s.vocab, D}, &m.emb});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back({p + "input_layernorm.weight", {D}, &m.rms_att[l]});
    ts.push_back({p + "self_attn.q_proj.weight", {int64_t(qd), D}, &m.wq[l]});
    ts.push_back({p + "self_attn.k_proj.weight", {int64_t(kvd), D}, &m.wk[l]});
    ts.push_back({p + "self_attn.v_proj.weight", {int64_t(kvd), D}, &m.wv[l]});
    ts.push_back({p + "self_attn.o_proj.weight", {D, int64_t(qd)}, &m.wo[l]});
    ts.push_back({p + "post_attention_layernorm.weight", {D}, &m.rms_ffn[l]});
    ts.push_back({p + "mlp.gate_proj.weight", {H, D}, &m.w1[l]});
    ts.push_back({p + "mlp.up_proj.weight", {H, D}, &m.w3[l]});
    ts.push_back({p + "mlp.down_proj.weight", {D, H}, &m.w2[l]});
  }
  ts.push_back({"model.norm.weight", {D}, &m.rms_final});
  if (!s.tied) ts.push_back({"lm_head.weight", {s.vocab, D}, &m.wcls});
  if (s.shards == 0) {
    write_file(dir / "model.safetensors", safetensors_bytes(s.dtype, ts));
  } else {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    const size_t per = (ts.size() + s.shards - 1) / s.shards;
    for (int k = 0; k < s.shards; ++k) {
      std::vector<Tensor> part(ts.begin() + std::min(ts.size(), k * per), ts.begin() + std::min(ts.size(), (k + 1) * per));
      const std::string fname = "model-0000" + std::to_string(k + 1) + "-of-0000" + std::to_string(s.shards) + ".safetensors";
      write_file(dir / fname, safetensors_bytes(s.dtype, part));
      for (const Tensor& t : part) index["weight_map"][t.name] = fname;
    }
    write_file(dir / "model.safetensors.index.json", index.dump(1));
  }
  if (s.tied) m.wcls = m.emb;
  write_file(dir / "config.json", config_json(s).dump(2));
  write_file(dir / "generation_config.json", json({{"eos_token_id", {2, 3}}, {"bos_token_id", 1}}).dump());
  return m;
}

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
