#pragma once
// Model weights for the CPU path: fp32, row-major [out_features, in_features], in one 64-byte aligned arena.
// Q/K/V and gate/up are stored fused so one matmul reads x once.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/safetensors.h"

namespace flashlite::engine {

struct FloatArena {
  std::unique_ptr<float[], void (*)(float*)> data{nullptr, [](float*) {}};
  size_t size = 0;
  void allocate(size_t n);  // zero-filled
};

struct LayerWeights {
  const float* rms_att = nullptr;  // (dim)
  const float* wqkv = nullptr;     // (q_dim + 2 * kv_dim, dim): rows of wq, then wk, then wv
  const float* wo = nullptr;       // (dim, q_dim)
  const float* rms_ffn = nullptr;  // (dim)
  const float* w13 = nullptr;      // (2 * hidden_dim, dim): gate rows (w1), then up rows (w3)
  const float* w2 = nullptr;       // (dim, hidden_dim)
};

// The part of the model one rank holds under tensor parallelism (Megatron's split, docs/parallel.md): query and KV
// heads and FFN columns each a contiguous range, and the LM head's vocabulary rows; norms and the embedding whole.
// Rank 0 of 1 holds everything.
struct TensorShard {
  int rank = 0, ranks = 1;
  int head0 = 0, heads = 0;        // query heads [head0, head0 + heads)
  int kv_head0 = 0, kv_heads = 0;  // KV heads, the ones the rank's query heads read
  int hidden0 = 0, hidden = 0;     // FFN columns (gate / up rows, down columns)
  int vocab0 = 0, vocab = 0;       // LM-head rows: the rank's logits are columns [vocab0, vocab0 + vocab)
  // Rank `rank` of `ranks` of a model of config `c`; throws Error when the KV heads do not divide among the ranks
  // or a rank would hold no FFN column or vocabulary row.
  static TensorShard of(const ModelConfig& c, int rank, int ranks);
  // Throws Error unless a model of `model_ranks` ranks may run on these weights (the models' constructors).
  void require_ranks(int model_ranks) const;
};

struct ModelWeights {
  ModelConfig config;  // the whole model's
  TensorShard shard;   // what the tensors below hold (set before layout_weights; default: everything)
  FloatArena arena;
  const float* embedding = nullptr;  // (vocab, dim), always whole
  std::vector<LayerWeights> layers;  // shaped by rank_config()
  const float* rms_final = nullptr;  // (dim)
  const float* lm_head = nullptr;    // (shard.vocab, dim); == embedding when tied and whole
  size_t parameter_count() const;    // the whole model's
  // The shape of what this rank computes: config with the shard's heads, FFN width and LM-head rows (vocab_size is
  // then the width of its logits; token ids are still checked against config.vocab_size). == config when whole.
  ModelConfig rank_config() const;
};

// Plans the arena for config and shard (sizes of every tensor above) and points the fields into it. A shard left
// at its default (ranks 0) is set to the whole model.
void layout_weights(ModelWeights& w);
// One checkpoint tensor (Hugging Face names) as a model of `w.config` and `w.shard` reads it: the whole tensor's shape
// (with the config fields behind each dimension), the block of it this shard holds, and where that block lands in
// w's arena (row-major, block rows x block cols; null before layout_weights). A tied model's LM head is a block of
// the embedding's rows, so the embedding can appear twice.
struct TensorBlock {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;  // a 1-D tensor is one row
};
struct TensorSlot {
  std::string name;
  std::vector<ExpectedDim> shape;
  TensorBlock block;
  float* dst = nullptr;
};
std::vector<TensorSlot> tensor_slots(const ModelWeights& w);

// Rank `rank` of `ranks` of a whole model: its blocks copied out of `whole` (TensorShard::of's split).
ModelWeights slice_weights(const ModelWeights& whole, int rank, int ranks);

// Non-const access for loaders writing into the arena.
inline float* writable(const float* p) { return const_cast<float*>(p); }

// Loads a checkpoint: a directory (Hugging Face: config.json + safetensors) or a llama2.c .bin file.
// Throws Error with the file, the value and the expectation on anything missing, truncated or inconsistent.
// `progress(layers_done, layers)` is called while a Hugging Face checkpoint converts (big models take seconds).
// With ranks > 1, the weights of tensor-parallel rank `rank` only (TensorShard::of): a Hugging Face checkpoint reads
// just that rank's blocks of its mapped files; a llama2.c file (small models) is read whole and sliced.
using LoadProgress = std::function<void(int, int)>;
ModelWeights load_checkpoint(const std::string& path, const LoadProgress& progress = {}, int rank = 0, int ranks = 1);
ModelWeights load_llama2c_checkpoint(const std::string& path);
// The model's config alone, as load_checkpoint would set it (a Hugging Face checkpoint's tensors are not read; a
// llama2.c file, small, is).
ModelConfig load_checkpoint_config(const std::string& path);
size_t parameter_count(const ModelConfig& c);
ModelWeights load_hf_checkpoint(const std::string& dir, const LoadProgress& progress = {}, int rank = 0, int ranks = 1);
// Ties the embeddings of a Hugging Face config whose checkpoint holds no lm_head (some exports omit it without saying
// tie_word_embeddings); the loader and load_checkpoint_config read the model the same way.
void tie_if_head_missing(ModelConfig& c, const SafetensorsCheckpoint& ckpt);

}  // namespace flashlite::engine
