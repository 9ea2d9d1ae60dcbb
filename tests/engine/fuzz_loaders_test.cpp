// Broken files never crash the engine: a small valid safetensors checkpoint, llama2.c checkpoint and tokenizers are
// truncated at many lengths and have random bytes overwritten; every load must either succeed or throw
// flashlite::Error (never another exception type, never a crash). Run under ASan/UBSan for the strongest check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <random>

#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "synthetic_hf.h"
#include "models_required.h"

namespace {

namespace eng = flashlite::engine;
namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs `load` on `path` after writing `bytes` there; returns "ok", "error" or the unexpected exception text.
template <typename Load>
std::string outcome(const fs::path& path, const std::string& bytes, const Load& load) {
  synth::write_file(path, bytes);
  try {
    load();
    return "ok";
  } catch (const flashlite::Error&) {
    return "error";
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
}

// Truncations at `cuts` lengths and `flips` random overwrites of 1-4 bytes, all must be "ok" or "error".
template <typename Load>
void fuzz(const fs::path& path, const std::string& good, size_t flip_region, const Load& load, int cuts, int flips) {
  std::mt19937 rng(42);
  int errors = 0;
  for (int i = 0; i < cuts; ++i) {
    const size_t len = i == 0 ? 0 : rng() % good.size();
    const std::string r = outcome(path, good.substr(0, len), load);
    ASSERT_TRUE(r == "ok" || r == "error") << "truncated to " << len << ": " << r;
    errors += r == "error";
  }
  for (int i = 0; i < flips; ++i) {
    std::string bad = good;
    const int n = 1 + int(rng() % 4);
    for (int k = 0; k < n; ++k) bad[rng() % std::min(flip_region, bad.size())] = char(rng());
    const std::string r = outcome(path, bad, load);
    ASSERT_TRUE(r == "ok" || r == "error") << "flip " << i << ": " << r;
  }
  EXPECT_GT(errors, cuts / 2) << "most truncations must be detected";
  synth::write_file(path, good);
}

TEST(FuzzLoaders, Safetensors) {
  const fs::path dir = synth::fresh_dir("fuzz_st");
  synth::write_checkpoint(dir, {"fuzz", 16, 24, 1, 2, 1, 8, 20, "BF16", false, false, 0}, 3);
  const std::string good = read_all(dir / "model.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  auto load = [&] { eng::load_checkpoint(dir.string()); };
  fuzz(dir / "model.safetensors", good, size_t(8 + header), load, 150, 400);
  fuzz(dir / "config.json", read_all(dir / "config.json"), 4096, load, 100, 300);
  fs::remove_all(dir);
}

TEST(FuzzLoaders, Llama2cCheckpointAndTokenizer) {
  const std::string model = reftest::models_dir() + "/stories260K/stories260K.bin";
  const std::string tok = reftest::models_dir() + "/stories260K/tok512.bin";
  if (!fs::exists(model) || !fs::exists(tok)) { FLASHLITE_MODEL_ABSENT("stories260K absent"); }
  const fs::path dir = synth::fresh_dir("fuzz_l2c");
  fuzz(dir / "m.bin", read_all(model), 28, [&] { eng::load_checkpoint((dir / "m.bin").string()); }, 60, 200);
  auto load_tok = [&] {
    auto t = eng::load_tokenizer((dir / "t.bin").string());
    t->decode(t->encode("Once upon a time \xF0\x9F\x98\x80", true));
  };
  fuzz(dir / "t.bin", read_all(tok), 6227, load_tok, 100, 400);
  fs::remove_all(dir);
}

TEST(FuzzLoaders, TokenizerJson) {
  // A small but complete byte-level tokenizer.json (every field Hugging Face requires); mutations hit every field.
  const std::string good = R"({"version":"1.0","added_tokens":[{"id":6,"content":"<|end|>","single_word":false,"lstrip":false,
"rstrip":false,"normalized":false,"special":true}],
"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\p{L}+|\\p{N}"},
"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},
"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true},"model":{"type":"BPE","ignore_merges":true,
"vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"c":4,"abc":5},"merges":["a b","ab c"]}})";
  const fs::path dir = synth::fresh_dir("fuzz_tj");
  auto load = [&] {
    auto t = eng::load_tokenizer((dir / "tokenizer.json").string());
    t->decode(t->encode("abc ab<|end|>c", true));
  };
  EXPECT_EQ(outcome(dir / "tokenizer.json", good, load), "ok");
  fuzz(dir / "tokenizer.json", good, good.size(), load, 80, 700);
  fs::remove_all(dir);
}

}  // namespace
