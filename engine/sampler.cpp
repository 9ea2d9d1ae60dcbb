#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/errors.h"

namespace flashlite::engine {

void SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    fail("temperature is " + std::to_string(temperature) + "; expected a finite number >= 0 (0 = greedy)");
  }
  if (top_k < 0) fail("top_k is " + std::to_string(top_k) + "; expected >= 0 (0 = off)");
  if (!(top_p > 0 && top_p <= 1)) fail("top_p is " + std::to_string(top_p) + "; expected a number in (0, 1]");
  // Bounded so that a penalized logit stays finite.
  if (!(repeat_penalty >= 0.01f && repeat_penalty <= 100.0f)) {
    fail("repeat_penalty is " + std::to_string(repeat_penalty) + "; expected a number in [0.01, 100] (1 = off)");
  }
  if (repeat_last_n < -1) fail("repeat_last_n is " + std::to_string(repeat_last_n) + "; expected >= 0 (0 = off) or -1 (all)");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    fail("frequency_penalty is " + std::to_string(frequency_penalty) + "; expected a number in [-2, 2] (0 = off)");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    fail("presence_penalty is " + std::to_string(presence_penalty) + "; expected a number in [-2, 2] (0 = off)");
  }
}

void apply_penalties(float* logits, int vocab, const int* recent, size_t n, const SamplingParams& params) {
  std::vector<int> ids(recent, recent + n);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    if (ids[i] >= 0 && ids[i] < vocab) {
      float& x = logits[ids[i]];
      x = x <= 0 ? x * params.repeat_penalty : x / params.repeat_penalty;
      x = x - float(j - i) * params.frequency_penalty - params.presence_penalty;
    }
    i = j;
  }
}

std::string unsampleable(const float* logits, int n, const char* what, const int32_t* ids) {
  int64_t nan_id = -1, inf_id = -1;  // the lowest ids of a NaN and of a +inf
  bool all_neg_inf = n > 0;
  for (int i = 0; i < n; ++i) {
    const float v = logits[i];
    const int64_t id = ids ? ids[i] : i;
    if (std::isnan(v)) {
      if (nan_id < 0 || id < nan_id) nan_id = id;
    } else if (v == INFINITY) {
      if (inf_id < 0 || id < inf_id) inf_id = id;
    }
    all_neg_inf &= v == -INFINITY;
  }
  if (nan_id >= 0 || inf_id >= 0) {
    return std::string(what) + " " + std::to_string(nan_id >= 0 ? nan_id : inf_id) + " is " + (nan_id >= 0 ? "NaN" : "+inf") +
           ": the model produced a non-finite logit; nothing can be sampled from this row";
  }
  if (all_neg_inf) return std::string("every ") + what + " is -inf: no token can be sampled";
  return {};
}

namespace {

void check_logits(const float* logits, int n, const char* what) {
  if (std::string why = unsampleable(logits, n, what); !why.empty()) fail(why);
}

}  // namespace

int argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;  // first index on ties
  return best;
}

Sampler::Sampler(const SamplingParams& params, uint64_t stream) : p_(params) {
  p_.validate();
  // splitmix64 of (seed, stream) so nearby seeds and streams give unrelated states; never zero.
  uint64_t z = params.seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  state_ = (z ^ (z >> 31)) | 1;
}

float Sampler::uniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return float((state_ * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

void Sampler::accept(int token) {
  if (!p_.penalizes()) return;
  recent_.push_back(token);
  if (p_.repeat_last_n > 0 && recent_.size() > size_t(p_.repeat_last_n)) recent_.erase(recent_.begin());
}

int Sampler::sample(const float* logits, int vocab) {
  if (vocab <= 0) fail("sample got " + std::to_string(vocab) + " logits; expected at least one");
  check_logits(logits, vocab, "logit");
  if (!recent_.empty()) {
    penalized_.assign(logits, logits + vocab);
    apply_penalties(penalized_.data(), vocab, recent_.data(), recent_.size(), p_);
    logits = penalized_.data();
  }
  if (p_.temperature == 0.0f) return argmax(logits, vocab);
  if (p_.top_k == 0 && p_.top_p >= 1.0f) {  // plain temperature sampling: no sort needed
    float mx = logits[0];
    for (int i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
    double total = 0;
    for (int i = 0; i < vocab; ++i) total += std::exp((double(logits[i]) - mx) / p_.temperature);
    const double r = double(uniform()) * total;
    double cum = 0;
    for (int i = 0; i < vocab; ++i) {
      cum += std::exp((double(logits[i]) - mx) / p_.temperature);
      if (r < cum) return i;
    }
    return argmax(logits, vocab);
  }
  // Descending logits (ties: lower id first) so top-k and top-p cut a prefix.
  int n = 0;
  double norm = 0;  // the softmax denominator top-p is measured against (all tokens, or the top k)
  cand_.clear();
  if (p_.top_k > 0 && p_.top_k < vocab) {
    cand_.resize(vocab);
    for (int i = 0; i < vocab; ++i) cand_[i] = {logits[i], i};
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), before);
    n = p_.top_k;
  } else {
    // Top-p only: a token with probability below (1 - top_p) / vocab can never be in the nucleus (all of them together
    // hold less than 1 - top_p of the mass), so only the others are sorted. Exact, and ~100x less sorting at 128K vocab.
    float mx = logits[0];
    for (int i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
    weights_.resize(vocab);
    double z = 0;
    for (int i = 0; i < vocab; ++i) z += weights_[i] = std::exp((double(logits[i]) - mx) / p_.temperature);
    const double floor_w = p_.top_p < 1.0f ? (1.0 - p_.top_p) / vocab * z : 0.0;
    for (int i = 0; i < vocab; ++i)
      if (weights_[i] >= floor_w) cand_.push_back({logits[i], i});
    std::sort(cand_.begin(), cand_.end(), before);
    n = int(cand_.size());
    norm = z;
  }
  return pick(n, norm);
}

int Sampler::sample_top_k(const float* values, const int32_t* ids, int k) {
  if (k <= 0) fail("sample_top_k got " + std::to_string(k) + " candidates; expected at least one");
  if (p_.penalizes()) fail("sample_top_k cannot apply repeat or frequency penalties; they need the full row (sample)");
  // Named by vocabulary id, as the full-row paths name them (the candidates hold a row's lowest-id NaN / +inf).
  if (std::string why = unsampleable(values, k, "logit", ids); !why.empty()) fail(why);
  cand_.resize(k);
  for (int i = 0; i < k; ++i) cand_[i] = {values[i], ids[i]};
  // The full sort of the k-set gives the partial sort's prefix exactly: `before` is a total order (ids are distinct).
  std::sort(cand_.begin(), cand_.end(), before);
  if (p_.temperature == 0.0f) return cand_[0].second;
  return pick(k, 0);
}

int Sampler::pick(int n, double norm) {
  // Softmax at the temperature over the kept prefix (float64 sums for stability).
  const double mx = cand_[0].first;
  std::vector<double> prob(n);
  double total = 0;
  for (int i = 0; i < n; ++i) total += prob[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature);
  if (norm == 0) norm = total;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    int keep = n;
    for (int i = 0; i < n; ++i) {
      cum += prob[i] / norm;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    total = 0;
    for (int i = 0; i < n; ++i) total += prob[i];
  }
  const double r = double(uniform()) * total;
  double cum = 0;
  for (int i = 0; i < n; ++i) {
    cum += prob[i];
    if (r < cum) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace flashlite::engine
