#include "engine/model.h"

#include <algorithm>

#include "engine/errors.h"
#include "engine/llama_cpu.h"
#include "engine/parallel/parallel_model.h"
#include "engine/sampler.h"
#if FLASHLITE_ENGINE_CUDA
#include "engine/llama_cuda.h"
#endif

namespace flashlite::engine {

LogitsRequest logits_request_for(const SamplingParams& params, int vocab) {
  LogitsRequest r;
  if (params.penalizes()) return r;  // the penalties change the row before any selection
  if (params.temperature == 0.0f) r.kind = LogitsRequest::Kind::argmax;
  else if (params.top_k > 0 && params.top_k < vocab) r = {LogitsRequest::Kind::top_k, params.top_k};
  return r;
}

LogitsOutput LlamaModel::forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  const std::vector<float>& logits = forward(inputs);
  const int vocab = config().vocab_size;
  return select_on_host(logits.data(), int(logits.size() / size_t(vocab)), request);
}

namespace {

// The sampler's refusal for a row the host reduces (the greedy and top-k paths never reach Sampler::sample's check),
// with the row named as the CUDA engine's device selection names it.
void refuse_unsampleable(const float* row, int vocab, int r) {
  if (std::string why = unsampleable(row, vocab, "logit"); !why.empty()) fail("logits row " + std::to_string(r) + ": " + why);
}

}  // namespace

KvUsage LlamaModel::kv_usage() {
  KvUsage u{context(), slots(), 0};
  for (int s = 0; s < slots(); ++s) u.pages_used += length(s) > 0;
  return u;
}

LogitsOutput LlamaModel::select_on_host(const float* logits, int rows, const LogitsRequest& request) {
  const int vocab = config().vocab_size;
  LogitsOutput out;
  out.kind = request.kind;
  out.rows = rows;
  out.vocab = vocab;
  if (request.kind == LogitsRequest::Kind::logits) {
    out.logits = logits;
  } else if (request.kind == LogitsRequest::Kind::argmax) {
    select_ids_.resize(rows);
    for (int r = 0; r < rows; ++r) {
      refuse_unsampleable(logits + size_t(r) * vocab, vocab, r);
      select_ids_[r] = argmax(logits + size_t(r) * vocab, vocab);
    }
    out.ids = select_ids_.data();
  } else {
    const int k = request.k;
    if (k <= 0 || k >= vocab) fail("top-k request for " + std::to_string(k) + " candidates; expected 0 < k < " + std::to_string(vocab));
    select_ids_.resize(size_t(rows) * k);
    select_values_.resize(size_t(rows) * k);
    std::vector<std::pair<float, int>> cand(vocab);
    for (int r = 0; r < rows; ++r) {
      const float* row = logits + size_t(r) * vocab;
      if (!request.shard) refuse_unsampleable(row, vocab, r);  // also keeps NaN out of `before`'s ordering
      for (int i = 0; i < vocab; ++i) cand[i] = {row[i], i};
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                        request.shard ? Sampler::before_nan_first : Sampler::before);
      for (int i = 0; i < k; ++i) {
        select_values_[size_t(r) * k + i] = cand[i].first;
        select_ids_[size_t(r) * k + i] = cand[i].second;
      }
    }
    out.k = k;
    out.ids = select_ids_.data();
    out.values = select_values_.data();
  }
  return out;
}

std::unique_ptr<LlamaModel> create_model_rank(const ModelWeights& weights, const RuntimeOptions& options,
                                              const std::string& device, Collective* collective) {
  if (device == "cpu") {
    if (options.precision != "auto" && options.precision != "fp32") {
      fail("precision '" + options.precision + "' is unavailable on the CPU; the CPU path computes in fp32");
    }
    return std::make_unique<LlamaCpu>(weights, options, collective);
  }
  if (device == "cuda") {
#if FLASHLITE_ENGINE_CUDA
    return create_llama_cuda(weights, options, collective);
#else
    fail("device 'cuda': this flashlite was built without CUDA; use --device cpu");
#endif
  }
  fail("device '" + device + "' is unknown; expected cpu or cuda");
}

std::unique_ptr<LlamaModel> create_model(const ModelWeights& weights, const RuntimeOptions& options,
                                         const std::string& device) {
  if (options.tp < 1) fail("--tp " + std::to_string(options.tp) + ": expected at least 1");
  if (options.tp == 1) return create_model_rank(weights, options, device, nullptr);
  return std::make_unique<ParallelModel>(
      options.tp, [&weights](int rank, int ranks) { return slice_weights(weights, rank, ranks); }, options, device);
}

}  // namespace flashlite::engine
