#pragma once
// The generation loop: prefill every prompt in one pass, then decode one token per live sequence per step,
// sampling, stopping on stop tokens, the token budget or a full context; timing for TTFT / TBT / tok/s.
#include <functional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/sampler.h"

namespace flashlite::engine {

struct GenerationParams {
  int max_new_tokens = 256;
  SamplingParams sampling;  // its penalties look back on each sequence's prompt (a chat turn's tokens) and what follows
  std::vector<int> stop_ids;  // generation of a sequence ends when it samples one of these (not emitted)
};

struct GenerationStats {
  int batch = 0;
  int prompt_tokens = 0;     // tokens prefilled (all sequences)
  int generated_tokens = 0;  // tokens emitted (all sequences)
  double ttft_ms = 0;        // call start to the first sampled token (prefill + sampling)
  std::vector<double> step_ms;  // each decode step (one token per live sequence)
  double total_ms = 0;
  double mean_tbt_ms() const;
  double median_tbt_ms() const;
  double decode_tokens_per_s() const;  // tokens emitted by the decode steps / their time
  double prefill_tokens_per_s() const { return ttft_ms > 0 ? prompt_tokens / (ttft_ms / 1e3) : 0; }
  int decode_tokens = 0;
};

struct GenerationResult {
  std::vector<std::vector<int>> tokens;  // per sequence, generated tokens (stop token excluded)
  std::vector<int> stop_token;           // per sequence: the stop token sampled, or -1
  std::vector<std::string> finish_reason;  // "stop", "length" or "context"
  GenerationStats stats;
};

using TokenCallback = std::function<void(int sequence, int token)>;

// Generates for sequences in slots 0..prompts.size()-1; each slot's cache is cleared first.
GenerationResult generate(LlamaModel& model, const std::vector<std::vector<int>>& prompts, const GenerationParams& params,
                          const TokenCallback& on_token = {});

// Continues one slot without clearing it: appends `new_tokens` (plus the token the previous turn sampled last and
// left out of the cache) and generates. Keeps the KV cache between turns. When a turn throws, the session stays
// consistent: if nothing reached the cache (e.g. the prompt does not fit) it is as before the turn; otherwise the
// turn's tokens and what was generated before the failure stay in the conversation and the next turn continues
// from there.
class ChatSession {
 public:
  explicit ChatSession(LlamaModel& model, int slot = 0) : model_(model), slot_(slot) {}
  GenerationResult turn(const std::vector<int>& new_tokens, const GenerationParams& params, const TokenCallback& on_token = {});
  int cached_tokens() { return model_.length(slot_); }
  bool empty() { return cached_tokens() == 0 && pending_.empty(); }  // no conversation yet: the next turn starts it
  void reset();

 private:
  LlamaModel& model_;
  int slot_;
  std::vector<int> pending_;  // tokens of the conversation not yet in the cache (the last sampled one)
  uint64_t turns_ = 0;
};

// Peak resident memory of this process in bytes (getrusage).
size_t peak_rss_bytes();

}  // namespace flashlite::engine
