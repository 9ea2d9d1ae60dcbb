#include "engine/generator.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "engine/errors.h"

namespace flashlite::engine {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct SlotInput {
  int slot;
  std::vector<int> tokens;
};

GenerationResult run(LlamaModel& model, const std::vector<SlotInput>& inputs, const GenerationParams& params,
                     const TokenCallback& on_token, uint64_t stream_base, std::vector<std::vector<int>>* sampled) {
  params.sampling.validate();
  if (params.max_new_tokens < 0) fail("max_new_tokens is " + std::to_string(params.max_new_tokens) + "; expected >= 0");
  const int B = int(inputs.size()), vocab = model.config().vocab_size;
  GenerationResult res;
  res.tokens.resize(B);
  res.stop_token.assign(B, -1);
  res.finish_reason.assign(B, "length");
  res.stats.batch = B;
  std::vector<Sampler> samplers;
  for (int b = 0; b < B; ++b) samplers.emplace_back(params.sampling, stream_base + b);
  if (sampled) sampled->assign(B, {});
  const auto t0 = Clock::now();

  std::vector<SequenceInput> step;
  for (const SlotInput& in : inputs) {
    if (in.tokens.empty()) fail("prompt " + std::to_string(&in - inputs.data()) + " is empty; expected at least one token");
    if (model.length(in.slot) + int(in.tokens.size()) > model.context()) {
      fail("prompt " + std::to_string(&in - inputs.data()) + " has " + std::to_string(in.tokens.size()) +
           " tokens (plus " + std::to_string(model.length(in.slot)) + " cached); the context holds " +
           std::to_string(model.context()) + " tokens");
    }
    step.push_back({in.slot, in.tokens, false});
    res.stats.prompt_tokens += int(in.tokens.size());
    for (int t : in.tokens) samplers[size_t(&in - inputs.data())].accept(t);
  }
  if (params.max_new_tokens == 0) return res;

  std::vector<bool> live(B, true);
  // Only what the sampler needs comes back from the model: ids when greedy, the top k when top-k sampling.
  const LogitsRequest request = logits_request_for(params.sampling, vocab);
  auto emit = [&](const LogitsOutput& out, const std::vector<int>& who) {
    for (size_t r = 0; r < who.size(); ++r) {
      const int b = who[r];
      int tok;
      if (out.kind == LogitsRequest::Kind::argmax) tok = out.ids[r];
      else if (out.kind == LogitsRequest::Kind::top_k) tok = samplers[b].sample_top_k(out.values + r * out.k, out.ids + r * out.k, out.k);
      else tok = samplers[b].sample(out.logits + r * size_t(vocab), vocab);
      if (sampled) (*sampled)[b].push_back(tok);  // before anything that may throw
      samplers[b].accept(tok);
      if (std::find(params.stop_ids.begin(), params.stop_ids.end(), tok) != params.stop_ids.end()) {
        live[b] = false;
        res.stop_token[b] = tok;
        res.finish_reason[b] = "stop";
        continue;
      }
      res.tokens[b].push_back(tok);
      ++res.stats.generated_tokens;
      if (on_token) on_token(b, tok);
      if (int(res.tokens[b].size()) >= params.max_new_tokens) live[b] = false;
      else if (model.length(inputs[b].slot) >= model.context()) {
        live[b] = false;
        res.finish_reason[b] = "context";
      }
    }
  };
  std::vector<int> who(B);
  for (int b = 0; b < B; ++b) who[b] = b;
  emit(model.forward_select(step, request), who);
  res.stats.ttft_ms = ms_since(t0);

  while (true) {
    step.clear();
    who.clear();
    for (int b = 0; b < B; ++b) {
      if (!live[b]) continue;
      step.push_back({inputs[b].slot, {res.tokens[b].back()}, false});
      who.push_back(b);
    }
    if (step.empty()) break;
    const auto ts = Clock::now();
    const int before = res.stats.generated_tokens;
    emit(model.forward_select(step, request), who);
    res.stats.step_ms.push_back(ms_since(ts));
    res.stats.decode_tokens += res.stats.generated_tokens - before;
  }
  res.stats.total_ms = ms_since(t0);
  return res;
}

}  // namespace

double GenerationStats::mean_tbt_ms() const {
  if (step_ms.empty()) return 0;
  double s = 0;
  for (double v : step_ms) s += v;
  return s / step_ms.size();
}

double GenerationStats::median_tbt_ms() const {
  if (step_ms.empty()) return 0;
  std::vector<double> v = step_ms;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double GenerationStats::decode_tokens_per_s() const {
  double s = 0;
  for (double v : step_ms) s += v;
  return s > 0 ? decode_tokens / (s / 1e3) : 0;
}

GenerationResult generate(LlamaModel& model, const std::vector<std::vector<int>>& prompts, const GenerationParams& params,
                          const TokenCallback& on_token) {
  if (prompts.empty()) fail("no prompts given");
  if (int(prompts.size()) > model.slots()) {
    fail(std::to_string(prompts.size()) + " prompts exceed the " + std::to_string(model.slots()) +
         " sequences the runtime was created for");
  }
  std::vector<SlotInput> inputs;
  for (size_t b = 0; b < prompts.size(); ++b) {
    model.reset(int(b));
    inputs.push_back({int(b), prompts[b]});
  }
  return run(model, inputs, params, on_token, 0, nullptr);
}

GenerationResult ChatSession::turn(const std::vector<int>& new_tokens, const GenerationParams& params,
                                   const TokenCallback& on_token) {
  // With no new token the turn's tokens would not be fed, and the next turn would not see them.
  if (params.max_new_tokens < 1) fail("a chat turn needs max_new_tokens >= 1 (got " + std::to_string(params.max_new_tokens) + ")");
  // The cache takes the fed tokens (pending + new), then each sampled token but the last, in that order; whatever
  // has not reached it yet is pending. Settled the same way when the turn fails, so that the cache, the pending
  // tokens and the conversation agree: a turn that fails before anything was fed leaves the session as it was.
  const int before = model_.length(slot_);
  std::vector<int> fed = pending_;
  fed.insert(fed.end(), new_tokens.begin(), new_tokens.end());
  std::vector<std::vector<int>> sampled;
  auto settle = [&] {
    const size_t in_cache = size_t(model_.length(slot_) - before);
    if (in_cache == 0) return;
    std::vector<int> seq = fed;
    if (!sampled.empty()) seq.insert(seq.end(), sampled[0].begin(), sampled[0].end());
    pending_.assign(seq.begin() + std::min(in_cache, seq.size()), seq.end());
  };
  try {
    GenerationResult r = run(model_, {{slot_, fed}}, params, on_token, ++turns_ * 1000003ull, &sampled);
    settle();
    return r;
  } catch (...) {
    settle();
    throw;
  }
}

void ChatSession::reset() {
  model_.reset(slot_);
  pending_.clear();
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return size_t(u.ru_maxrss) * 1024;
}

}  // namespace flashlite::engine
