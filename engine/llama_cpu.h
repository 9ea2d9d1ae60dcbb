#pragma once
// The Llama forward pass on the CPU (fp32): embedding, RMSNorm, fused QKV matmul, then per layer the library: the new
// tokens' K and V appended to the flashlite KV cache with q and k rotated on the way (flashlite::append_kv, the
// repository's one RoPE), attention over the cache through flashlite::decode (<= 8 new tokens per sequence) or
// flashlite::prefill (causal, bottom-right aligned, so a chunk of new queries attends to the whole cached prefix);
// output projection, SwiGLU MLP, final norm and LM head.
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/parallel/collective.h"
#include "engine/weights.h"
#include "flashlite/attention.h"

namespace flashlite::engine {

class LlamaCpu final : public LlamaModel {
 public:
  // `weights` must outlive the model. With `collective` (tensor parallelism: weights.shard is one rank's part), the
  // O and down projections' partial sums are all-reduced and the logits are the rank's vocabulary columns.
  LlamaCpu(const ModelWeights& weights, const RuntimeOptions& options, Collective* collective = nullptr);

  // Runs every sequence's new tokens in one pass (their rows share the matmuls). Returns the logits rows,
  // (sum over inputs of n or 1, vocab), in input order. Throws Error on a bad token or a context overflow.
  const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) override;

  const ModelConfig& config() const override { return c_; }  // the rank's shape (ModelWeights::rank_config)
  KvCache& cache() { return cache_; }
  int slots() const override { return cache_.shape().slots; }
  int context() const override { return cache_.shape().capacity; }
  int length(int slot) override { return cache_.length(slot); }
  void reset(int slot) override { cache_.reset(slot); }
  KvUsage kv_usage() override;
  int threads() const override { return threads_; }
  std::string device() const override { return "cpu"; }
  std::string attention_kernel() override;  // e.g. "cpu_decode (tiled cpu_tiled_avx2)"

  // The last layer's rows of the last forward call, for tests that check the cache against the public API: the fused
  // QKV rows (rows, q_dim + 2 kv_dim) with q rotated (k and v are in the cache), and the attention output (rows, q_dim).
  const float* last_qkv() const { return qkv_.data(); }
  const float* last_attention() const { return att_.data(); }

 private:
  void ensure_scratch(int rows, int logit_rows);
  // Appends the group's new K / V (rotating q and k) to layer `layer`'s cache, then attends; `row`: its first row.
  void attend(int layer, const KvGroup& g, int row);

  const ModelWeights& w_;
  ModelConfig c_;  // w_.rank_config()
  RuntimeOptions opt_;
  Collective* collective_ = nullptr;
  int threads_ = 1;
  KvCache cache_;
  RopeOptions rope_;
  // Scratch, grown on demand.
  std::vector<float> x_;       // (rows, dim) residual stream
  std::vector<float> xb_;      // (rows, dim) normed input
  std::vector<float> qkv_;     // (rows, q_dim + 2 kv_dim)
  std::vector<float> att_;     // (rows, q_dim) attention output
  std::vector<float> h13_;     // (rows, 2 hidden)
  std::vector<float> hb_;      // (rows, hidden)
  std::vector<float> xo_;      // (rows, dim) projection output
  std::vector<float> logits_;  // (logit rows, vocab)
};

}  // namespace flashlite::engine
