#pragma once
// Model weights for the CPU path: fp32, row-major [out_features, in_features], in one 64-byte aligned arena.
// Q/K/V and gate/up are stored fused so one matmul reads x once.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"

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

struct ModelWeights {
  ModelConfig config;
  FloatArena arena;
  const float* embedding = nullptr;  // (vocab, dim)
  std::vector<LayerWeights> layers;
  const float* rms_final = nullptr;  // (dim)
  const float* lm_head = nullptr;    // (vocab, dim); == embedding when tied
  size_t parameter_count() const;
};

// Plans the arena for `c` (sizes of every tensor above) and points the fields into it.
void layout_weights(ModelWeights& w);
// Non-const access for loaders writing into the arena.
inline float* writable(const float* p) { return const_cast<float*>(p); }

// Loads a checkpoint: a directory (Hugging Face: config.json + safetensors) or a llama2.c .bin file.
// Throws Error with the file, the value and the expectation on anything missing, truncated or inconsistent.
// `progress(layers_done, layers)` is called while a Hugging Face checkpoint converts (big models take seconds).
using LoadProgress = std::function<void(int, int)>;
ModelWeights load_checkpoint(const std::string& path, const LoadProgress& progress = {});
ModelWeights load_llama2c_checkpoint(const std::string& path);
ModelWeights load_hf_checkpoint(const std::string& dir, const LoadProgress& progress = {});

}  // namespace flashlite::engine
