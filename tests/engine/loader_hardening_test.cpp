// Checkpoint loaders against hostile files (all crafted here, at test time): sizes that wrap 64-bit arithmetic,
// fields that overflow int, configs that would size a huge arena before any tensor is checked, safetensors files the
// reference implementation rejects, and config.json values of the wrong type. Every load either succeeds or throws
// flashlite::Error with a message naming the file, the field and the expectation; none crashes, none writes out of
// bounds (run under ASan/UBSan for the strongest check), none allocates more than the checkpoint implies.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/errors.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;
namespace fs = std::filesystem;
using json = nlohmann::json;

// "" when `load` succeeds, the Error's message when it throws one; any other exception fails the test.
template <typename F>
std::string error_of(const F& load) {
  try {
    load();
  } catch (const flashlite::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("[json.exception"), std::string::npos) << "raw nlohmann message: " << m;
    return m.empty() ? "(empty message)" : m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a flashlite::Error: " << e.what();
    return "unexpected";
  }
  return "";
}

// ASan's quarantine keeps freed memory resident for a while; the allocations these tests guard against (a config
// that sizes the arena before checking the tensors) are gigabytes, so either bound catches them.
#if defined(__SANITIZE_ADDRESS__)
constexpr long kRssSlackMb = 512;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr long kRssSlackMb = 512;
#else
constexpr long kRssSlackMb = 64;
#endif
#else
constexpr long kRssSlackMb = 64;
#endif

long peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::string u64le(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: '" << (msg) << "'"

// ---- the checked-arithmetic helper ----

TEST(CheckedSize, OverflowThrowsNamingWhat) {
  const std::string what = "the test's size";
  EXPECT_EQ((eng::CheckedSize(1u << 20, what) * (1u << 20) + 5).value(), (uint64_t(1) << 40) + 5);
  EXPECT_EQ(eng::CheckedSize(17, what).round_up(16).value(), 32u);
  EXPECT_HAS(error_of([&] { eng::CheckedSize(uint64_t(1) << 32, what) * (uint64_t(1) << 32); }),
             "the test's size overflows");
  EXPECT_HAS(error_of([&] { eng::CheckedSize(UINT64_MAX, what) + 1; }), "overflows 64 bits");
  EXPECT_HAS(error_of([&] { eng::CheckedSize(UINT64_MAX - 3, what).round_up(16); }), "overflows 64 bits");
}

// ---- a small Hugging Face checkpoint to corrupt ----

class HfHardening : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = synth::fresh_dir("hardening");
    synth::write_checkpoint(dir_, spec_, 11);
    config_ = synth::config_json(spec_);
    st_ = read_all(dir_ / "model.safetensors");
    uint64_t n;
    std::memcpy(&n, st_.data(), 8);
    header_ = json::parse(st_.substr(8, n));
    data_ = st_.substr(8 + n);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string load() {
    return error_of([&] { eng::load_checkpoint(dir_.string()); });
  }
  std::string load_config(const json& c) {
    synth::write_file(dir_ / "config.json", c.dump());
    return load();
  }
  // config.json with one key replaced (nested: "rope_scaling.factor").
  std::string load_with(const std::string& key, const json& value) {
    json c = config_;
    if (key.rfind("rope_scaling.", 0) == 0) {
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 64}};
      c["rope_scaling"][key.substr(13)] = value;
    } else {
      c[key] = value;
    }
    return load_config(c);
  }
  std::string load_safetensors(const std::string& header_text, const std::string& data) {
    synth::write_file(dir_ / "model.safetensors", u64le(header_text.size()) + header_text + data);
    return load();
  }
  std::string load_header(const json& h) { return load_safetensors(h.dump(), data_); }

  synth::Spec spec_{"hardening", 64, 96, 2, 4, 2, 16, 50, "F32", false, false, 0};
  fs::path dir_;
  json config_, header_;
  std::string st_, data_;
};

TEST_F(HfHardening, LoadsWhenIntact) { EXPECT_EQ(load(), ""); }

// ---- memory corruption (each of these wrote out of bounds or hit UB before) ----

TEST_F(HfHardening, ConfigWhoseArenaSizeWraps) {
  // intermediate 715827754 x hidden 128 x 3 x 2^24 layers x 4 bytes = 2^64 + a little: the arena came out tiny.
  json c = config_;
  c["hidden_size"] = 128, c["intermediate_size"] = 715827754, c["num_hidden_layers"] = 1 << 24;
  c["head_dim"] = 32;
  std::string m = load_config(c);
  EXPECT_HAS(m, "intermediate_size (hidden_dim) is 715827754; expected at most 1048576");
  EXPECT_HAS(m, "config.json");
  c["intermediate_size"] = 96;
  EXPECT_HAS(load_config(c), "num_hidden_layers (n_layers) is 16777216; expected at most 1024");
}

TEST_F(HfHardening, ShapeWhoseElementCountOverflows) {
  json h = header_;
  h["model.norm.weight"]["shape"] = {uint64_t(1) << 32, uint64_t(1) << 32, 4};
  EXPECT_HAS(load_header(h), "overflows 64 bits");
}

TEST_F(HfHardening, HeadCountWhoseQDimOverflowsInt) {
  json c = config_;
  c["num_attention_heads"] = 1 << 30, c["num_key_value_heads"] = 1 << 30, c["head_dim"] = 8;
  EXPECT_HAS(load_config(c), "num_attention_heads (n_heads) is 1073741824; expected at most 1024");
}

// ---- llama2.c files written here ----

// A llama2.c checkpoint: `h` = dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: classifier
// follows, legacy only), seq_len; `floats` random weights after the header (legacy 28 bytes, v1 256).
std::string llama2c_bytes(int version, const std::vector<int32_t>& h, bool shared, uint64_t floats) {
  std::string out;
  if (version == 1) {
    const uint32_t magic = 0x616b3432, v = 1;
    out.append(reinterpret_cast<const char*>(&magic), 4);
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  out.append(reinterpret_cast<const char*>(h.data()), 28);
  if (version == 1) {
    out.push_back(shared ? 1 : 0);
    out.resize(256, '\0');
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (uint64_t i = 0; i < floats; ++i) {
    const float f = nd(rng);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  return out;
}

// The number of floats the format implies (unsigned __int128: the true value, never wrapped).
unsigned __int128 llama2c_floats(int version, const std::vector<int64_t>& h, bool shared) {
  using U = unsigned __int128;
  const U D = h[0], H = h[1], L = h[2], NH = h[3], NKV = h[4], V = h[5], S = h[6], hd = D / NH;
  const U rope = version == 0 ? 2 * S * (hd / 2) : 0;
  return V * D + L * (2 * D + 2 * D * (NH * hd) + 2 * D * (NKV * hd) + 3 * D * H) + D + rope + (shared ? 0 : V * D);
}

class Llama2cHardening : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = synth::fresh_dir("hardening_l2c"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string load(const std::string& bytes) {
    synth::write_file(dir_ / "m.bin", bytes);
    return error_of([&] { eng::load_checkpoint((dir_ / "m.bin").string()); });
  }
  fs::path dir_;
};

TEST_F(Llama2cHardening, SmallValidFilesLoad) {
  const std::vector<int32_t> h = {16, 32, 2, 4, 2, 32, 16};
  const std::vector<int64_t> w(h.begin(), h.end());
  EXPECT_EQ(load(llama2c_bytes(1, h, true, uint64_t(llama2c_floats(1, w, true)))), "");
  EXPECT_EQ(load(llama2c_bytes(0, h, true, uint64_t(llama2c_floats(0, w, true)))), "");
  std::vector<int32_t> unshared = h;
  unshared[5] = -unshared[5];
  EXPECT_EQ(load(llama2c_bytes(0, unshared, false, uint64_t(llama2c_floats(0, w, false)))), "");
}

TEST_F(Llama2cHardening, V1HeaderWhoseSizeWrapsToTheFileSize) {
  // Every field <= 2^24 and consistent (head_dim 512, 32 heads, 1 kv head), yet 256 + 4 * floats = 2^64 + 65792:
  // a 65,792-byte file matched the wrapped size and the loader copied gigabytes into a small arena.
  const std::vector<int32_t> h = {16384, 16777215, 5588653, 32, 1, 14946989, 256};
  const std::vector<int64_t> w(h.begin(), h.end());
  const unsigned __int128 bytes = 256 + 4 * llama2c_floats(1, w, true);
  ASSERT_EQ(uint64_t(bytes >> 64), 1u);
  ASSERT_EQ(uint64_t(bytes), 65792u);
  const std::string file = llama2c_bytes(1, h, true, (65792 - 256) / 4);
  ASSERT_EQ(file.size(), 65792u);
  const std::string m = load(file);
  EXPECT_NE(m, "");
  EXPECT_HAS(m, "llama2.c checkpoint");
}

TEST_F(Llama2cHardening, LegacyVocabIntMin) {
  // The legacy format negates vocab_size; -INT32_MIN was signed overflow.
  const std::string m = load(llama2c_bytes(0, {16, 32, 2, 4, 2, INT32_MIN, 16}, false, 1000));
  EXPECT_HAS(m, "header field 5 = 2147483648 (vocab_size)");
}

TEST_F(Llama2cHardening, FieldsBeyondTheLimitsNamed) {
  const std::vector<int32_t> good = {16, 32, 2, 4, 2, 32, 16};
  const char* names[] = {"hidden_size (dim)", "intermediate_size (hidden_dim)", "num_hidden_layers (n_layers)",
                         "num_attention_heads (n_heads)", nullptr, "vocab_size", "max_position_embeddings (seq_len)"};
  const int32_t over[] = {1 << 17, (1 << 20) + 1, 1025, 2048, 0, (1 << 22) + 1, (1 << 22) + 1};
  for (int i = 0; i < 7; ++i) {
    if (!names[i]) continue;
    std::vector<int32_t> h = good;
    h[i] = over[i];
    if (i == 3) h[0] = 2048 * 2, h[4] = 2048;  // heads need dim divisible by them
    EXPECT_HAS(load(llama2c_bytes(1, h, true, 100)), names[i]);
  }
}

// Random header fields from a hostile set, with the file resized to what the header claims when that is small: every
// load is a success or an Error.
TEST_F(Llama2cHardening, HeaderFuzz) {
  const int32_t values[] = {0, -1, 1, 2, 3, 7, 8, 16, 32, 64, 512, 1 << 16, (1 << 16) + 1, 1 << 24, (1 << 24) + 1,
                            INT32_MAX, INT32_MIN, -(1 << 24), 715827754, 14946989, 5588653, 16777215};
  std::mt19937 rng(5);
  int loaded = 0;
  const long rss_before = peak_rss_mb();
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> h = {16, 32, 2, 4, 2, 32, 16};
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) h[rng() % 7] = values[rng() % std::size(values)];
    const int version = int(rng() % 2);
    const bool shared = version == 0 ? h[5] > 0 : rng() % 2;
    std::vector<int64_t> w(h.begin(), h.end());
    w[5] = w[5] < 0 ? -w[5] : w[5];
    bool positive = true;
    for (int64_t v : w) positive = positive && v > 0;
    const unsigned __int128 want = positive && w[3] <= w[0] ? llama2c_floats(version, w, shared) : 0;
    const uint64_t floats = want > 0 && want < (1u << 20) ? uint64_t(want) : 1000;
    loaded += load(llama2c_bytes(version, h, shared, floats)) == "";
  }
  EXPECT_GT(loaded, 0) << "no case got past validation: the fuzz tests only the first check";
  EXPECT_LT(peak_rss_mb() - rss_before, kRssSlackMb) << "a hostile header made the loader allocate";
}

// ---- unbounded allocations: the arena is sized only after every tensor matched the config ----

TEST_F(HfHardening, HugeVocabFailsBeforeAllocating) {
  const long before = peak_rss_mb();
  // 8M x 64 x 4 bytes x 2 (embedding + lm_head) = 4 GB of zeros before the first shape check, before.
  EXPECT_HAS(load_with("vocab_size", 8'000'000), "vocab_size is 8000000; expected at most 4194304");
  // Under the limit, the embedding's shape names the field instead.
  std::string m = load_with("vocab_size", 4'000'000);
  EXPECT_HAS(m, "model.embed_tokens.weight");
  EXPECT_HAS(m, "has shape [50, 64]; the config implies [4000000, 64] ([vocab_size, hidden_size])");
  m = load_with("intermediate_size", 1'000'000);
  EXPECT_HAS(m, "[1000000, 64] ([intermediate_size, hidden_size])");
  m = load_with("hidden_size", 60'000);
  EXPECT_HAS(m, "hidden_size");
  EXPECT_LT(peak_rss_mb() - before, kRssSlackMb) << "a config that disagrees with the tensors made the loader allocate";
}

// ---- safetensors strictness (what the reference implementation rejects) ----

TEST_F(HfHardening, SafetensorsTilingRules) {
  json h = header_;
  h["alias"] = h["model.norm.weight"];  // two tensors on the same bytes
  EXPECT_HAS(load_header(h), "the tensors overlap");
  h = header_;
  h.erase("model.norm.weight");  // its bytes become a gap
  EXPECT_HAS(load_header(h), "the bytes between are unused");
  EXPECT_HAS(load_safetensors(header_.dump(), data_ + std::string(4, '\0')), "4 data bytes after its last tensor");
  EXPECT_HAS(load_safetensors(header_.dump(), data_ + std::string(1, '\0')), "1 data bytes after its last tensor");
  h = header_;
  h["zero"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {data_.size() + 4, data_.size() + 4}}};
  EXPECT_HAS(load_header(h), "outside the");
}

TEST_F(HfHardening, SafetensorsHeaderLengthOffByOne) {
  uint64_t n;
  std::memcpy(&n, st_.data(), 8);
  for (int64_t d : {-1, 1, -2, 2}) {
    std::string bad = st_;
    const uint64_t m = n + d;
    std::memcpy(&bad[0], &m, 8);
    synth::write_file(dir_ / "model.safetensors", bad);
    EXPECT_NE(load(), "") << "header length " << m << " instead of " << n;
  }
}

TEST_F(HfHardening, SafetensorsHeaderRules) {
  json plain = header_;
  plain.erase("__metadata__");
  const std::string body = plain.dump().substr(1);  // the members and the closing brace
  struct Case {
    std::string header, message;
  };
  const Case cases[] = {
      {R"({"__metadata__":{"format":1},)" + body, "\"__metadata__\" value that is not a string"},
      {R"({"__metadata__":["pt"],)" + body, "\"__metadata__\" that is not an object of strings"},
      {R"({"__metadata__":{"a":1,"a":"b"},)" + body, "\"__metadata__\" value that is not a string"},
      {R"({"__metadata__":{},"__metadata__":{},)" + body, "two \"__metadata__\" entries"},
      {R"({"x":{"dtype":"F32","dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + body, "duplicate field 'dtype'"},
      {R"({"x":5,"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + body, "tensor 'x' is not an object"},
      {R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0,0]},)" + body, "not two non-negative integers"},
      {R"({"x":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]},)" + body, "shape entry that is not a non-negative"},
      {R"({"x":{"dtype":"F32","shape":[1.0],"data_offsets":[0,0]},)" + body, "shape entry that is not a non-negative"},
      {R"({"x":{"dtype":"F33","shape":[0],"data_offsets":[0,0]},)" + body, "unknown dtype 'F33'"},
      {R"({"x":{"dtype":{"F32":1},"shape":[0],"data_offsets":[0,0]},)" + body, "dtype map whose value is not null"},
      {R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,0]},)" + body, "not a whole number of bytes"},
      {R"({"x":["F32",[0]],)" + body, "a list of 2 entries; expected 3"},
      {R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"n":1e999},)" + body, "not valid JSON"},
      {R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"d":)" + std::string(200, '[') +
           std::string(200, ']') + "}," + body,
       "nests JSON deeper than 127 levels"},
      {"\xEF\xBB\xBF{" + body, "byte-order mark"},
      {"{" + body + std::string(1, '\0'), "NUL byte"},
      {"[]", "is a JSON array; expected an object"},
  };
  for (const Case& c : cases) EXPECT_HAS(load_safetensors(c.header, data_), c.message) << c.header.substr(0, 60);
  // Valid forms the reference accepts: a zero-size tensor, unknown fields, the array and dtype-map forms, a later
  // duplicate replacing an earlier one, null metadata.
  const std::string ok[] = {
      R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"note":{"deep":[[1]]}},"__metadata__":null,)" + body,
      R"({"x":["F32",[0,7],[0,0]],"y":{"dtype":{"BF16":null},"shape":[0],"data_offsets":[0,0]},)" + body,
      R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,20]},)"
      R"("x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + body,
  };
  for (const std::string& h : ok) {
    synth::write_file(dir_ / "model.safetensors", u64le(h.size()) + h + data_);
    EXPECT_EQ(error_of([&] { eng::SafetensorsFile((dir_ / "model.safetensors").string()); }), "") << h.substr(0, 80);
  }
  // ... and the engine then refuses their tensors as unused, or of a dtype it cannot convert.
  EXPECT_HAS(load_safetensors(ok[0], data_), "tensor(s) the config does not use: x");
  json h = header_;
  h["model.norm.weight"]["dtype"] = "I32";
  EXPECT_HAS(load_header(h), "has dtype 'I32'; expected F32, F16 or BF16");
  synth::write_file(dir_ / "model.safetensors", u64le(1000) + "{}");
  EXPECT_HAS(load(), "declares a 1000-byte JSON header but only 2 bytes follow");
  synth::write_file(dir_ / "model.safetensors", u64le(100'000'001) + std::string(64, ' '));
  EXPECT_HAS(load(), "the format allows at most 100000000");
}

// ---- config.json strictness ----

TEST_F(HfHardening, FewerLayersThanTheCheckpointIsAnError) {
  // Declaring 1 layer on this 2-layer checkpoint silently dropped layer 1.
  const std::string m = load_with("num_hidden_layers", 1);
  EXPECT_HAS(m, "9 tensor(s) the config does not use: model.layers.1.");
  EXPECT_HAS(m, "num_hidden_layers (1)");
  synth::write_file(dir_ / "config.json", config_.dump());
  json h = header_;
  h["model.extra.weight"] = h["model.norm.weight"];
  h["model.extra.weight"]["data_offsets"] = {data_.size(), data_.size() + 256};
  EXPECT_HAS(load_safetensors(h.dump(), data_ + std::string(256, '\0')), "does not use: model.extra.weight");
  // Older exports' RoPE tables are ignored, as transformers ignores them.
  h.erase("model.extra.weight");
  h["model.layers.0.self_attn.rotary_emb.inv_freq"] = {
      {"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {data_.size(), data_.size() + 32}}};
  EXPECT_EQ(load_safetensors(h.dump(), data_ + std::string(32, '\0')), "");
}

TEST_F(HfHardening, StopTokensMustBeIntegers) {
  fs::remove(dir_ / "generation_config.json");  // it would override config.json's tokens
  std::string m = load_with("eos_token_id", "2");
  EXPECT_HAS(m, "config.json': 'eos_token_id' is \"2\" (string); expected an integer or a list of integers");
  EXPECT_HAS(load_with("eos_token_id", json::array({2, "3"})), "'eos_token_id' is [2,\"3\"] (array)");
  EXPECT_HAS(load_with("eos_token_id", uint64_t(1) << 40), "'eos_token_id' = 1099511627776 is out of range");
  EXPECT_HAS(load_with("eos_token_id", 50), "stop token (eos_token_id) 50 is outside the vocabulary of 50");
  EXPECT_HAS(load_with("bos_token_id", 77), "bos_token_id 77 is outside the vocabulary");
  synth::write_file(dir_ / "generation_config.json", R"({"eos_token_id": "2"})");
  m = load();
  EXPECT_HAS(m, "generation_config.json': 'eos_token_id' is \"2\"");
}

TEST_F(HfHardening, RopeScalingOriginalContextMustBePositive) {
  EXPECT_HAS(load_with("rope_scaling.original_max_position_embeddings", 0),
             "rope_scaling original_max_position_embeddings is 0; expected a positive integer");
  EXPECT_HAS(load_with("rope_scaling.original_max_position_embeddings", -8), "is -8");
  EXPECT_HAS(load_with("rope_scaling.factor", 0), "rope_scaling factor is 0");
  EXPECT_HAS(load_with("rope_scaling.factor", "8"), "rope_scaling: 'factor' is \"8\" (string); expected a number");
  EXPECT_EQ(load_with("rope_scaling.original_max_position_embeddings", 64), "");
}

TEST_F(HfHardening, WrongTypesNameTheKeyAndTheExpectation) {
  struct Case {
    const char* key;
    json value;
    const char* expected;
  };
  const Case cases[] = {
      {"tie_word_embeddings", "yes", "expected true or false"},
      {"attention_bias", "false", "expected true or false"},
      {"hidden_size", "64", "expected an integer"},
      {"num_hidden_layers", 2.0, "expected an integer"},
      {"num_key_value_heads", json::array({2}), "expected an integer"},
      {"head_dim", uint64_t(1) << 63, "out of range; expected a 32-bit integer"},
      {"vocab_size", -(int64_t(1) << 40), "out of range; expected a 32-bit integer"},
      {"rms_norm_eps", "1e-5", "expected a number"},
      {"rope_theta", true, "expected a number"},
      {"model_type", 5, "expected a string"},
      {"hidden_act", json::object(), "expected a string"},
      {"torch_dtype", 16, "expected a string"},
      {"architectures", "LlamaForCausalLM", "expected a list of strings"},
      {"rope_scaling", "llama3", "expected an object"},
      {"rope_parameters", json::array(), "expected an object"},
      {"bos_token_id", "1", "expected an integer"},
  };
  for (const Case& c : cases) {
    const std::string m = load_with(c.key, c.value);
    EXPECT_HAS(m, "config.json'");
    EXPECT_HAS(m, std::string("'") + c.key + "' ");
    EXPECT_HAS(m, c.expected);
  }
}

TEST_F(HfHardening, ZeroNegativeAndOversizedFieldsNamed) {
  const std::pair<const char*, const char*> fields[] = {
      {"hidden_size", "hidden_size (dim)"},         {"intermediate_size", "intermediate_size (hidden_dim)"},
      {"num_hidden_layers", "num_hidden_layers"},   {"num_attention_heads", "num_attention_heads"},
      {"num_key_value_heads", "num_key_value_heads"}, {"head_dim", "head_dim"},
      {"vocab_size", "vocab_size"},                 {"max_position_embeddings", "max_position_embeddings"}};
  for (const auto& [key, name] : fields)
    for (int64_t v : {int64_t(0), int64_t(-1), int64_t(INT32_MAX)}) EXPECT_HAS(load_with(key, v), name) << key << " = " << v;
}

// Random keys of config.json (and its rope_scaling) set to hostile values: a success or an Error, never a raw
// nlohmann message, never a big allocation.
TEST_F(HfHardening, ConfigFuzz) {
  const char* keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                        "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id", "model_type",
                        "architectures", "hidden_act", "attention_bias", "mlp_bias", "torch_dtype", "rope_scaling",
                        "rope_parameters", "rope_scaling.factor", "rope_scaling.low_freq_factor",
                        "rope_scaling.high_freq_factor", "rope_scaling.original_max_position_embeddings",
                        "rope_scaling.rope_type"};
  const json values[] = {0, -1, 1, 2, 3, 16, 64, INT32_MIN, INT32_MAX, int64_t(1) << 31, int64_t(1) << 40,
                         uint64_t(1) << 63, 1.5, -0.0, 1e308, 1e-300, "2", "", "llama3", true, false, nullptr,
                         json::array(), json::array({1, 2}), json::array({2, "x"}), json::object(),
                         json{{"rope_type", "linear"}, {"factor", 0}}, 1 << 24, 715827754, 8'000'000};
  std::mt19937 rng(17);
  const long before = peak_rss_mb();
  int loaded = 0;
  for (int i = 0; i < 400; ++i) {
    const char* key = keys[rng() % std::size(keys)];
    const json& v = values[rng() % std::size(values)];
    const std::string m = load_with(key, v);
    loaded += m.empty();
    if (!m.empty()) {
      EXPECT_TRUE(m.find("config.json") != std::string::npos || m.find("tensor") != std::string::npos) << m;
    }
  }
  EXPECT_GT(loaded, 5);
  EXPECT_LT(peak_rss_mb() - before, kRssSlackMb);
}

// Random shape and offset values in the safetensors header: a success or an Error, never an allocation.
TEST_F(HfHardening, SafetensorsShapeAndOffsetFuzz) {
  const uint64_t values[] = {0, 1, 2, 3, 4, 15, 16, 50, 64, 96, 1u << 20, 1ull << 31, 1ull << 32, 1ull << 62,
                             1ull << 63, UINT64_MAX, UINT64_MAX / 4, 715827754};
  std::vector<std::string> names;
  for (auto it = header_.begin(); it != header_.end(); ++it) {
    if (it.key() != "__metadata__") names.push_back(it.key());
  }
  std::mt19937 rng(23);
  const long before = peak_rss_mb();
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    json h = header_;
    json& t = h[names[rng() % names.size()]];
    const uint64_t v = values[rng() % std::size(values)];
    switch (rng() % 4) {
      case 0: t["shape"][rng() % t["shape"].size()] = v; break;
      case 1: t["shape"].push_back(v); break;
      case 2: t["data_offsets"][rng() % 2] = v; break;
      default: t["shape"] = {v, values[rng() % std::size(values)]};
    }
    errors += load_header(h) != "";
  }
  EXPECT_GT(errors, 250) << "most edits break the tiling or the config's shapes";
  EXPECT_LT(peak_rss_mb() - before, kRssSlackMb);
}

}  // namespace
