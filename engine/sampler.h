#pragma once
// Next-token choice from one row of logits: greedy (temperature 0), or temperature + top-k + top-p (nucleus)
// sampling with a seeded, platform-independent RNG (xorshift64*), one stream per sequence; optionally after llama.cpp's
// repeat and frequency penalties and OpenAI's presence penalty on the tokens seen last.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flashlite::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  // The penalties, over the last repeat_last_n tokens seen (those given to Sampler::accept: `flashlite generate` gives
  // the prompt's, then the sampled ones; the server the sampled ones, as OpenAI counts): a token seen there has its
  // logit divided by repeat_penalty when positive (multiplied when not), then lowered by frequency_penalty x its
  // count there and by presence_penalty once. Applied before temperature, top-k and top-p, greedy included.
  float repeat_penalty = 1.0f;     // 1 = off
  int repeat_last_n = 64;          // the window; 0 = off, -1 = every token seen
  float frequency_penalty = 0.0f;  // 0 = off
  float presence_penalty = 0.0f;   // 0 = off
  bool penalizes() const {
    return repeat_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
  void validate() const;     // throws Error naming the value
};

// The penalties of `params` applied in place to a row of `vocab` logits, for the window recent[0, n) (ids outside
// [0, vocab) are ignored).
void apply_penalties(float* logits, int vocab, const int* recent, size_t n, const SamplingParams& params);

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t stream);  // stream: sequence index, so each sequence differs
  int sample(const float* logits, int vocab);
  // A token the penalties should see (each prompt token, then each sampled one); kept while it is within the window.
  void accept(int token);
  // The same choice as sample() on the full row when 0 < top_k < vocab (or temperature is 0), from the row's top_k
  // largest logits and their ids in any order (LlamaModel::forward_select with a top-k request). Not with penalties:
  // they can move tokens into the top k, so they need the full row.
  int sample_top_k(const float* values, const int32_t* ids, int k);
  // Candidate order: larger logit first, lower id first among equals.
  static bool before(const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  }
  // `before` with NaN first (lowest id first among NaNs): a strict weak order on any values, the order the device
  // selection's keys give (engine/cuda_ops/select.h).
  static bool before_nan_first(const std::pair<float, int>& a, const std::pair<float, int>& b) {
    const bool an = a.first != a.first, bn = b.first != b.first;
    if (an || bn) return an && bn ? a.second < b.second : an;
    return before(a, b);
  }
  // Uniform in [0, 1) with 24 random bits.
  float uniform();

 private:
  int pick(int n, double norm);  // samples from the sorted prefix cand_[0, n); norm: top-p's denominator (0 = the prefix)
  SamplingParams p_;
  uint64_t state_;
  std::vector<std::pair<float, int>> cand_;  // scratch
  std::vector<double> weights_;              // scratch
  std::vector<int> recent_;                  // the penalties' window, oldest first
  std::vector<float> penalized_;             // scratch: the row after the penalties
};

int argmax(const float* logits, int n);

// Why no token can be sampled from this row, or empty: a NaN or +inf logit (a broken model or kernel, not a
// distribution) or every logit -inf. Named as every selection path names it (the device argmax key ranks NaN above
// +inf, then the lowest id): the lowest-id NaN if there is one, else the lowest-id +inf. `what` names an element
// ("logit"); ids: the elements' vocabulary ids (top-k candidates, in any order), else their indices. One pass.
std::string unsampleable(const float* logits, int n, const char* what, const int32_t* ids = nullptr);

}  // namespace flashlite::engine
