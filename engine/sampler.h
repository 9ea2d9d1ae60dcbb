#pragma once
// Next-token choice from one row of logits: greedy (temperature 0), or temperature + top-k + top-p (nucleus)
// sampling with a seeded, platform-independent RNG (xorshift64*), one stream per sequence.
#include <cstdint>
#include <vector>

namespace flashlite::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  void validate() const;     // throws Error naming the value
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t stream);  // stream: sequence index, so each sequence differs
  int sample(const float* logits, int vocab);
  // Uniform in [0, 1) with 24 random bits.
  float uniform();

 private:
  SamplingParams p_;
  uint64_t state_;
  std::vector<std::pair<float, int>> cand_;  // scratch
  std::vector<double> weights_;              // scratch
};

int argmax(const float* logits, int n);

}  // namespace flashlite::engine
