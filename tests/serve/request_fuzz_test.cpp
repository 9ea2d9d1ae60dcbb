// Fuzz-style driver for the server's request parsing and response rendering, meant to run under ASan + UBSan (CI's
// sanitize step). Valid chat and completions bodies (n, batches, echo, logprobs, penalties, stops, streaming) get
// structure-aware mutations (a value replaced by an odd one: huge, negative or fractional numbers, wrong types, empty
// or long strings, deep nesting; keys dropped; array entries repeated or removed) plus raw byte damage. Every body
// must be either refused with an ApiError (a 4xx naming what is wrong) or parsed into a request the scheduler can
// take: every prompt non-empty with ids in the vocabulary, prompt + max_tokens within the context, n and the batch
// within their limits, sampling parameters its Sampler accepts. Responses and stream chunks rendered from parsed
// requests (random tokens, prompt events, invalid UTF-8 text) must serialise.
//
//   FLASHLITE_REQUEST_FUZZ_ITERATIONS  mutations per base body (default 3000)
//   FLASHLITE_REQUEST_FUZZ_SECONDS     wall-clock budget (default 60)
//   FLASHLITE_REQUEST_FUZZ_SEED        seed (default 1)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/server/openai.h"
#include "flashlite/errors.h"

namespace eng = flashlite::engine;
namespace srv = flashlite::engine::server;
using json = nlohmann::json;

namespace {

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

// Bytes as tokens (ids 0-255), then BOS (256) and EOS (257): every text encodes, every id decodes.
class ByteTokenizer final : public eng::Tokenizer {
 public:
  std::vector<int> encode(std::string_view text, bool) const override { return bytes(text); }
  std::string decode_token(int id) const override { return id < 256 ? std::string(1, char(id)) : std::string(); }
  int vocab_size() const override { return 258; }
  std::optional<int> token_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int id) const override { return id >= 256; }
  std::string kind() const override { return "bytes"; }
  int bos_id() const override { return 256; }

 private:
  static std::vector<int> bytes(std::string_view text) {
    std::vector<int> ids;
    for (unsigned char c : text) ids.push_back(int(c));
    return ids;
  }
};

const json kBases[] = {
    json::parse(R"({"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                    "top_k": 5, "seed": 3, "stop": ["\n", "end"], "logprobs": 2, "n": 2})"),
    json::parse(R"({"model": "m", "prompt": ["a b", "c", [1, 2, 3]], "max_tokens": 0, "echo": true, "logprobs": 1,
                    "best_of": 1})"),
    json::parse(R"({"model": "m", "prompt": [72, 105], "stream": true, "stream_options": {"include_usage": true},
                    "presence_penalty": 0.5, "frequency_penalty": -1.5, "ignore_eos": true, "suffix": ""})"),
    json::parse(R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 5,
                    "logprobs": true, "top_logprobs": 3, "n": 3, "stream": false})"),
    json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}], "max_tokens": 4,
                    "temperature": 0, "seed": -7, "stop": "q"})"),
};

class Mutator {
 public:
  explicit Mutator(uint32_t seed) : rng_(seed) {}
  int below(int n) { return int(rng_() % uint32_t(n)); }

  json odd_value() {
    switch (below(22)) {
      case 0: return json(nullptr);
      case 1: return json(true);
      case 2: return json(-1);
      case 3: return json(0);
      case 4: return json(std::numeric_limits<int64_t>::max());
      case 5: return json(std::numeric_limits<int64_t>::min());
      case 6: return json(std::numeric_limits<uint64_t>::max());
      case 7: return json(1e308);
      case 8: return json(-1e-300);
      case 9: return json(0.5);
      case 10: return json(2.0000001);
      case 11: return json("");
      case 12: return json(std::string(3000, 'a'));
      case 13: return json::array();
      case 14: return json::object();
      case 15: return json::array({json::array({1, 2}), "x", 3});
      case 16: return json(129);
      case 17: return json(1024);
      case 18: return json(257);
      case 19: return json::array({json(-5)});
      case 20: {
        json deep = json::array();
        for (int i = 0; i < 200; ++i) deep = json::array({deep});
        return deep;
      }
      default: return json(std::string("\xE2\x82\xAC\t\"<|eot_id|>"));
    }
  }

  // One structure-aware change somewhere in `j` (recursing into a random child half the time).
  void mutate(json& j, int depth = 0) {
    if ((j.is_object() || j.is_array()) && !j.empty() && depth < 6 && below(2) == 0) {
      auto it = j.begin();
      std::advance(it, below(int(j.size())));
      mutate(*it, depth + 1);
      return;
    }
    if (j.is_object() && !j.empty() && below(3) == 0) {  // drop a key
      auto it = j.begin();
      std::advance(it, below(int(j.size())));
      j.erase(it);
      return;
    }
    if (j.is_array() && !j.empty() && below(3) == 0) {
      const int i = below(int(j.size()));
      if (below(2) == 0) j.erase(size_t(i));
      else for (int k = 0; k < 1 + below(300); ++k) j.push_back(j[size_t(i)]);
      return;
    }
    j = odd_value();
  }

  // Raw damage to the body's text: a byte flipped, the text cut, or junk inserted.
  void damage(std::string& s) {
    if (s.empty()) return;
    const size_t at = size_t(below(int(s.size())));
    switch (below(3)) {
      case 0: s[at] = char(rng_()); break;
      case 1: s.resize(at); break;
      default: s.insert(at, below(2) ? "\xFF\xFE" : "{[\"\\u0000\"]}"); break;
    }
  }

 private:
  std::mt19937 rng_;
};

// What the scheduler relies on in a parsed request; empty when it holds.
std::string broken(const srv::ParsedRequest& p, const srv::ServedModel& m) {
  if (p.n < 1 || p.n > srv::kMaxChoices) return "n " + std::to_string(p.n);
  if (p.prompts.empty() || p.prompts.size() > size_t(srv::kMaxPrompts)) {
    return "prompts " + std::to_string(p.prompts.size());
  }
  if (p.prompts.size() * size_t(p.n) > size_t(srv::kMaxSequences)) return "too many sequences";
  const srv::GenerationRequest& g = p.gen;
  if (g.max_tokens < 0 || (g.max_tokens == 0 && !p.echo)) return "max_tokens " + std::to_string(g.max_tokens);
  for (const auto& prompt : p.prompts) {
    if (prompt.empty()) return "an empty prompt";
    for (int id : prompt) {
      if (id < 0 || id >= m.vocab) return "token " + std::to_string(id);
    }
    if (int64_t(prompt.size()) + g.max_tokens > m.context) return "prompt + max_tokens past the context";
  }
  if (g.top_logprobs < -1 || g.top_logprobs > 20) return "top_logprobs " + std::to_string(g.top_logprobs);
  if (g.prompt_logprobs >= 0 && !p.echo) return "prompt logprobs without echo";
  if (int(g.stop.size()) > m.max_stop) return "stops";
  for (const auto& s : g.stop) {
    if (s.empty()) return "an empty stop string";
  }
  try {
    g.sampling.validate();
  } catch (const flashlite::Error& e) {
    return std::string("sampling: ") + e.what();
  }
  return {};
}

// Renders what a parsed request's answer and stream could hold: random tokens (and prompt events with echo), text with
// invalid UTF-8, every choice ended.
void render(const srv::ParsedRequest& p, const eng::Tokenizer& tok, int bos, std::mt19937& rng) {
  srv::ResponseHead h;
  h.endpoint = p.endpoint;
  h.id = "x";
  h.logprobs = p.gen.top_logprobs >= 0;
  h.n = p.n;
  if (p.echo) srv::set_echo(h, tok, bos, p.prompts);
  const size_t choices = std::min<size_t>(p.prompts.size() * size_t(p.n), 8);  // (a sample: rendering is per choice)
  std::vector<std::unique_ptr<srv::RequestStream>> ended;
  for (size_t c = 0; c < choices; ++c) ended.push_back(std::make_unique<srv::RequestStream>());
  std::vector<srv::ChoiceResult> results(choices);
  for (size_t c = 0; c < choices; ++c) {
    ended[c]->finish_reason = rng() % 2 ? "stop" : "length";
    ended[c]->prompt_tokens = int(p.prompts[c / size_t(p.n)].size());
    if (p.echo && h.logprobs) {
      for (size_t t = 1; t < p.prompts[c / size_t(p.n)].size(); ++t) {
        srv::TokenEvent e{int(rng() % 300), "", -float(rng() % 10), {{int(rng() % 258), -0.5f}}, true};
        results[c].events.push_back(e);
      }
    }
    for (int t = 0; t < int(rng() % 5); ++t) {
      srv::TokenEvent e{int(rng() % 258), std::string(1, char(rng())), -1.f, {{int(rng() % 258), -2.f}}, false};
      results[c].events.push_back(e);
    }
    ended[c]->completion_tokens = int(results[c].events.size());
    results[c].done = ended[c].get();
    const json chunk = c % 2 ? srv::stream_chunk(h, tok, results[c].events, ended[c].get(), true, 0, int(c))
                     : p.echo ? srv::echo_chunk(h, tok, results[c].events, int(c))
                              : srv::stream_chunk(h, tok, {}, nullptr, false, 0, int(c));
    (void)chunk.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  (void)srv::full_response(h, tok, results).dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(RequestFuzz, EveryBodyIsRefusedByNameOrParsedIntoARunnableRequest) {
  const ByteTokenizer tok;
  const eng::ChatFormatter chat(tok, 256, "");
  srv::ServedModel m;
  m.name = "m";
  m.tokenizer = &tok;
  m.chat = &chat;
  m.bos = 256;
  m.context = 96;
  m.vocab = tok.vocab_size();
  const long iterations = env_long("FLASHLITE_REQUEST_FUZZ_ITERATIONS", 3000);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(env_long("FLASHLITE_REQUEST_FUZZ_SECONDS", 60));
  Mutator mut(uint32_t(env_long("FLASHLITE_REQUEST_FUZZ_SEED", 1)));
  std::mt19937 rng(7);
  long parsed = 0, refused = 0;
  for (long it = 0; it < iterations && std::chrono::steady_clock::now() < deadline; ++it) {
    for (const json& base : kBases) {
      json body = base;
      for (int k = 0; k < 1 + mut.below(3); ++k) mut.mutate(body);
      std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
      if (mut.below(8) == 0) mut.damage(text);
      const srv::Endpoint endpoint = base.contains("messages") ? srv::Endpoint::chat : srv::Endpoint::completions;
      srv::ParsedRequest p;
      try {
        p = srv::parse_request(text, endpoint, m);
      } catch (const srv::ApiError& e) {
        ++refused;
        ASSERT_TRUE(e.status == 400 || e.status == 404) << e.status << " for " << text.substr(0, 300);
        ASSERT_FALSE(e.message.empty()) << text.substr(0, 300);
        continue;
      } catch (const std::exception& e) {
        FAIL() << "parse_request threw a non-ApiError: " << e.what() << " for " << text.substr(0, 300);
      }
      ++parsed;
      const std::string why = broken(p, m);
      ASSERT_TRUE(why.empty()) << why << " for " << text.substr(0, 300);
      try {
        render(p, tok, m.bos, rng);
      } catch (const std::exception& e) {
        FAIL() << "rendering threw: " << e.what() << " for " << text.substr(0, 300);
      }
    }
  }
  EXPECT_GT(parsed, 20) << "the mutations must leave some bodies valid";
  EXPECT_GT(refused, 20) << "and refuse others";
}

}  // namespace
