// Fuzz-style driver for the tokenizer loaders, meant to run under ASan+UBSan (CI: a sanitizer build, then this
// binary). tokenizer.json files get structure-aware mutations (a random value replaced by an odd one: huge, negative
// or fractional numbers, wrong types, empty or regex-breaking strings, deep nesting; keys dropped; array entries
// repeated or removed) plus raw byte damage; llama2.c tok*.bin files get their length fields set to boundary
// values, scores to NaN/inf, bytes flipped and cuts. Every load must either succeed or throw flashlite::Error, and a
// loaded tokenizer must encode texts to ids inside [0, vocab_size) (or throw flashlite::Error) and decode them.
//
//   FLASHLITE_TOKENIZER_FUZZ_ITERATIONS  mutations per base file (default 400)
//   FLASHLITE_TOKENIZER_FUZZ_SECONDS     wall-clock budget per test (default 60)
//   FLASHLITE_TOKENIZER_FUZZ_SEED        seed (default 1)
// The file being loaded is written to <tmp>/flashlite_tok_fuzz_*/case.* first, so a sanitizer abort leaves the
// input that caused it behind.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/tokenizer.h"
#include "flashlite/errors.h"
#include "reference_llama.h"
#include "synthetic_hf.h"

namespace {

namespace eng = flashlite::engine;
namespace fs = std::filesystem;
using json = nlohmann::json;

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

const char* const kTexts[] = {
    "hello world foo", "  Hello,   world!\n\n", "caf\xC3\xA9 na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
    "\xF0\x9F\x98\x80 emoji \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "12345 3.14", "<s>x</s><|end|> <unk>",
    "\xE2\x96\x81meta\xE2\x96\x81space", "bad utf8 \xC3\x28 \xFF\xFE end", "", " ", "\t\r\n",
};

// Loads `path` and runs every text through it. "ok" / "rejected" (flashlite::Error), or what went wrong.
std::string exercise(const fs::path& path) {
  std::unique_ptr<eng::Tokenizer> tok;
  try {
    tok = eng::load_tokenizer(path.string());
  } catch (const flashlite::Error&) {
    return "rejected";
  } catch (const std::exception& e) {
    return std::string("load threw a non-flashlite exception: ") + e.what();
  }
  const int n = tok->vocab_size();
  if (n <= 0 || n > eng::kMaxVocabSize) return "vocab_size " + std::to_string(n);
  for (const char* text : kTexts) {
    for (bool special : {true, false}) {
      try {
        const std::vector<int> ids = tok->encode(text, special);
        for (int id : ids) {
          if (id < 0 || id >= n) return "encode gave id " + std::to_string(id) + " outside [0, " + std::to_string(n) + ")";
          tok->decode_token(id);
          tok->is_special(id);
        }
        tok->decode(ids);
      } catch (const flashlite::Error&) {
        // an encode error (e.g. an unk token missing from the vocabulary) is a clear failure, not a crash
      } catch (const std::exception& e) {
        return std::string("encode/decode threw a non-flashlite exception: ") + e.what();
      }
    }
  }
  tok->kind();
  tok->token_id("<s>");
  return "ok";
}

// ---- tokenizer.json ----

json odd_value(std::mt19937& rng) {
  static const std::vector<json> kOdd = {
      nullptr, true, false, 0, 1, -1, 2147483647, 4294967295u, 4294967296ull, 16777216, 18446744073709551615ull,
      std::numeric_limits<int64_t>::min(), 0.5, 5.0, -0.0, 1e300, "", " ", "x", "\xE2\x96\x81", "<0x41>", "<unk>",
      "(", "[a-", "\\", "(?<=a)b", "\\p{Zz}", "a{99999}", "(a+)+$", "\\s*", "Removed", "Contiguous", "first",
      "BPE", "Sequence", "Split", "ByteLevel", "Metaspace", "\xF0\x9F\x98\x80", json::array(), json::object(),
      json::array({"a", "b"}), json::array({1, 2, 3}), json({{"String", " "}}), json({{"Regex", "\\s+"}}),
      json({{"type", "Split"}}), json({{"type", "Sequence"}, {"pretokenizers", json::array()}})};
  if (rng() % 20 == 0) {  // deep nesting
    json v = json::array();
    for (int i = 0; i < 200; ++i) v = json({{"type", "Sequence"}, {"pretokenizers", json::array({v})}});
    return v;
  }
  return kOdd[rng() % kOdd.size()];
}

// Every value in the document, with its parent (null for the root) and key/index.
struct Slot {
  json* value;
  json* parent;
  std::string key;
  size_t index;
};

void collect(json& v, json* parent, const std::string& key, size_t index, std::vector<Slot>& out) {
  out.push_back({&v, parent, key, index});
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) collect(it.value(), &v, it.key(), 0, out);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) collect(v[i], &v, "", i, out);
  }
}

std::string mutate_json(const json& base, std::mt19937& rng, std::string& what) {
  json doc = base;
  const int rounds = rng() % 10 < 7 ? 1 : 2;
  for (int r = 0; r < rounds; ++r) {
    std::vector<Slot> slots;
    collect(doc, nullptr, "", 0, slots);
    // Prefer the small structural parts over the many vocabulary / merges entries.
    Slot s = slots[rng() % slots.size()];
    for (int tries = 0; tries < 4 && s.parent && s.parent->size() > 64; ++tries) s = slots[rng() % slots.size()];
    const int op = int(rng() % 20);
    if (op < 3 && s.parent && s.parent->is_object()) {
      what += " drop[" + s.key + "]";
      s.parent->erase(s.key);
    } else if (op < 5 && s.parent && s.parent->is_array() && !s.parent->empty()) {
      what += " dup[" + std::to_string(s.index) + "]";
      s.parent->insert(s.parent->begin() + long(rng() % (s.parent->size() + 1)), json(*s.value));
    } else if (op < 10 && s.value->is_string()) {  // same type, other value
      std::string str = s.value->get<std::string>();
      static const char* kBits[] = {"(", ")", "[", "\\", " ", "\xE2\x96\x81", "\xC3", "a", "*", "{2,1}"};
      if (!str.empty() && rng() % 2) str.erase(rng() % str.size(), 1 + rng() % 3);
      else str.insert(str.empty() ? 0 : rng() % str.size(), kBits[rng() % 10]);
      what += " edit-string";
      *s.value = json::parse(json(str).dump(-1, ' ', false, json::error_handler_t::replace));
    } else if (op < 10 && s.value->is_number_integer()) {
      static const int64_t kIds[] = {0, 1, 2, 3, 255, 256, 1000, 16777215, 16777216, -1, 2147483647};
      *s.value = rng() % 2 ? kIds[rng() % 11] : s.value->get<int64_t>() + int64_t(rng() % 5) - 2;
      what += " id=" + s.value->dump();
    } else if (op < 10 && s.value->is_boolean()) {
      *s.value = !s.value->get<bool>();
      what += " flip(" + s.key + ")";
    } else {
      *s.value = odd_value(rng);
      what += " set(" + s.key + ")";
    }
  }
  std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  if (rng() % 10 == 0) {  // raw damage on top: a cut or flipped bytes
    if (rng() % 2) text.resize(rng() % (text.size() + 1));
    else for (int k = 0; k < 3 && !text.empty(); ++k) text[rng() % text.size()] = char(rng());
    what += " raw";
  }
  return text;
}

json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool normalized = false) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"normalized", normalized}, {"special", special}};
}

json bpe_model(json vocab, json merges, bool byte_fallback, json unk) {
  return {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk}, {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", byte_fallback},
          {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}};
}

// A byte-level tokenizer: Split + ByteLevel, added tokens, merges as strings.
json byte_level_base() {
  json vocab = json::object();
  const char* chars[] = {"h", "e", "l", "o", "w", "r", "d", "f", "\xC4\xA0", "a", "b", "c", "1", "2", "3"};
  int id = 0;
  for (const char* c : chars) vocab[c] = id++;
  const char* merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"},
                             {"\xC4\xA0w", "or"}, {"f", "o"}, {"fo", "o"}, {"1", "2"}};
  json m = json::array();
  for (auto& mg : merges) {
    vocab[std::string(mg[0]) + mg[1]] = id++;
    m.push_back(std::string(mg[0]) + " " + mg[1]);
  }
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\p{L}+|\\p{N}{1,3}|[^\\s\\p{L}\\p{N}]+"}}},
                 {"behavior", "Isolated"}, {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
          {"added_tokens", {added(id, "<|end|>", true), added(id + 1, "<s>", true, true, true)}},
          {"normalizer", nullptr}, {"pre_tokenizer", pre}, {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", bpe_model(vocab, m, false, nullptr)}};
}

// A Llama-2-style tokenizer: normalizers, Metaspace "first", byte fallback with only some byte tokens, unk, merges
// as pairs, normalized and stripping added tokens.
json metaspace_base() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<0xC3>", 3}, {"<0xA9>", 4}, {"<0xE6>", 5}};
  const char* chars[] = {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d", "f", "a", "m", "t", "s", "p", "c"};
  int id = 6;
  for (const char* c : chars) vocab[c] = id++;
  const char* merges[][2] = {{"\xE2\x96\x81", "h"}, {"e", "l"}, {"\xE2\x96\x81h", "el"}, {"l", "o"}, {"o", "r"}};
  json m = json::array();
  for (auto& mg : merges) {
    vocab[std::string(mg[0]) + mg[1]] = id++;
    m.push_back({mg[0], mg[1]});
  }
  json norm = {{"type", "Sequence"},
               {"normalizers",
                {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                 {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  json pre = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  json dec = {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
          {"added_tokens", {added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true),
                            added(id, "hello", false, false, true, true)}},
          {"normalizer", norm}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", dec},
          {"model", bpe_model(vocab, m, true, "<unk>")}};
}

// Llama 3's tokenizer.json cut to its first `n` ids, the merges among them and its first added tokens.
json llama3_base(const std::string& path, int n) {
  json d = json::parse(read_all(path));
  json& m = d["model"];
  json vocab = json::object();
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it)
    if (it.value().get<int>() < n) vocab[it.key()] = it.value();
  json merges = json::array();
  for (const json& e : m["merges"]) {
    const std::string s = e.get<std::string>();
    const size_t sp = s.find(' ');
    const std::string a = s.substr(0, sp), b = s.substr(sp + 1);
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(e);
  }
  m["vocab"] = vocab;
  m["merges"] = merges;
  json add = json::array();
  for (int i = 0; i < 8; ++i) {
    json a = d["added_tokens"][i];
    a["id"] = int(vocab.size()) + i;
    add.push_back(a);
  }
  d["added_tokens"] = add;
  return d;
}

void fuzz_json(const std::string& name, const json& base) {
  const long iterations = env_long("FLASHLITE_TOKENIZER_FUZZ_ITERATIONS", 400);
  const double budget = double(env_long("FLASHLITE_TOKENIZER_FUZZ_SECONDS", 60));
  std::mt19937 rng(uint32_t(env_long("FLASHLITE_TOKENIZER_FUZZ_SEED", 1)) * 7919u + uint32_t(name.size()));
  const fs::path dir = synth::fresh_dir("flashlite_tok_fuzz_" + name);
  const fs::path path = dir / "case.json";
  synth::write_file(path, base.dump());
  ASSERT_EQ(exercise(path), "ok") << name << ": the unmutated base must load";
  const auto t0 = std::chrono::steady_clock::now();
  long ok = 0, rejected = 0, done = 0;
  for (; done < iterations; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > budget) break;
    std::string what;
    synth::write_file(path, mutate_json(base, rng, what));
    const std::string r = exercise(path);
    ASSERT_TRUE(r == "ok" || r == "rejected") << name << " iteration " << done << " (" << what << "): " << r
                                              << "\n  the input is " << path;
    (r == "ok" ? ok : rejected)++;
  }
  std::printf("[ tokenizer fuzz ] %s: %ld mutations, %ld loaded, %ld rejected, 0 crashes\n", name.c_str(), done, ok,
              rejected);
  EXPECT_GT(ok, 0) << "no mutation loaded: the mutations are too destructive to test encoding";
  EXPECT_GT(rejected, 0);
  fs::remove_all(dir);
}

TEST(TokenizerFuzz, ByteLevelJson) { fuzz_json("byte_level", byte_level_base()); }

TEST(TokenizerFuzz, MetaspaceJson) { fuzz_json("metaspace", metaspace_base()); }

TEST(TokenizerFuzz, Llama3Json) {
  const std::string path = reftest::models_dir() + "/llama3-tokenizer/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "llama3 tokenizer absent at " << path;
  fuzz_json("llama3", llama3_base(path, 600));
}

// ---- llama2.c .bin ----

std::string synthetic_bin() {
  const char* pieces[] = {"<unk>", "<s>", "</s>", "<0x00>", "<0xC3>", "<0xA9>", " ", "a", "b", " a", "ab", "\xC3\xA9"};
  std::string out(4, '\0');
  int32_t max_len = 6;
  std::memcpy(out.data(), &max_len, 4);
  for (const char* p : pieces) {
    const float score = -float(std::strlen(p));
    const int32_t len = int32_t(std::strlen(p));
    out.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&len), 4).append(p);
  }
  return out;
}

// Offsets of every token record's score field.
std::vector<size_t> record_offsets(const std::string& bin) {
  std::vector<size_t> offs;
  for (size_t off = 4; off + 8 <= bin.size();) {
    int32_t len;
    std::memcpy(&len, bin.data() + off + 4, 4);
    offs.push_back(off);
    if (len < 0 || size_t(len) > bin.size() - off - 8) break;
    off += 8 + size_t(len);
  }
  return offs;
}

std::string mutate_bin(const std::string& base, const std::vector<size_t>& records, std::mt19937& rng, std::string& what) {
  std::string b = base;
  static const int32_t kLens[] = {0, 1, -1, -2147483647 - 1, 2147483647, 4096, 4097, 65535, 1 << 24};
  auto put = [&](size_t off, int32_t v) {
    if (off + 4 <= b.size()) std::memcpy(b.data() + off, &v, 4);
  };
  switch (rng() % 6) {
    case 0:
      put(0, kLens[rng() % 9]);
      what = "max_token_length";
      break;
    case 1: {
      const size_t r = records[rng() % records.size()];
      const int32_t remaining = int32_t(std::min<size_t>(b.size() - r - 8, 1u << 30));
      const int32_t lens[] = {kLens[rng() % 9], remaining, remaining + 1, remaining - 1};
      put(r + 4, lens[rng() % 4]);
      what = "length of the record at " + std::to_string(r);
      break;
    }
    case 2: {
      const float scores[] = {std::nanf(""), INFINITY, -INFINITY, 1e30f, -0.0f};
      const float s = scores[rng() % 5];
      std::memcpy(b.data() + records[rng() % records.size()], &s, 4);
      what = "score";
      break;
    }
    case 3:
      b.resize(rng() % (b.size() + 1));
      what = "cut at " + std::to_string(b.size());
      break;
    case 4:
      for (int k = 1 + int(rng() % 4); k > 0 && !b.empty(); --k) b[rng() % b.size()] = char(rng());
      what = "flipped bytes";
      break;
    default:
      for (int k = int(rng() % 16); k > 0; --k) b += char(rng());
      what = "appended bytes";
  }
  return b;
}

void fuzz_bin(const std::string& name, const std::string& base) {
  const long iterations = env_long("FLASHLITE_TOKENIZER_FUZZ_ITERATIONS", 400);
  const double budget = double(env_long("FLASHLITE_TOKENIZER_FUZZ_SECONDS", 60));
  std::mt19937 rng(uint32_t(env_long("FLASHLITE_TOKENIZER_FUZZ_SEED", 1)) * 104729u + uint32_t(name.size()));
  const fs::path dir = synth::fresh_dir("flashlite_tok_fuzz_" + name);
  const fs::path path = dir / "case.bin";
  synth::write_file(path, base);
  ASSERT_EQ(exercise(path), "ok") << name << ": the unmutated base must load";
  const std::vector<size_t> records = record_offsets(base);
  const auto t0 = std::chrono::steady_clock::now();
  long ok = 0, rejected = 0, done = 0;
  for (; done < iterations; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > budget) break;
    std::string what;
    synth::write_file(path, mutate_bin(base, records, rng, what));
    const std::string r = exercise(path);
    ASSERT_TRUE(r == "ok" || r == "rejected") << name << " iteration " << done << " (" << what << "): " << r
                                              << "\n  the input is " << path;
    (r == "ok" ? ok : rejected)++;
  }
  std::printf("[ tokenizer fuzz ] %s: %ld mutations, %ld loaded, %ld rejected, 0 crashes\n", name.c_str(), done, ok,
              rejected);
  EXPECT_GT(rejected, 0);
  fs::remove_all(dir);
}

TEST(TokenizerFuzz, SyntheticBin) { fuzz_bin("synthetic_bin", synthetic_bin()); }

TEST(TokenizerFuzz, RealBins) {
  int found = 0;
  for (const char* rel : {"/stories260K/tok512.bin", "/babyllama-tok105/tok105.bin"}) {
    const std::string path = reftest::models_dir() + rel;
    if (!fs::exists(path)) continue;
    ++found;
    fuzz_bin(fs::path(path).stem().string(), read_all(path));
  }
  if (found == 0) GTEST_SKIP() << "no llama2.c tokenizer under " << reftest::models_dir();
}

}  // namespace
