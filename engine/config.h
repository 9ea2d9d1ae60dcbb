#pragma once
// The model's shape and numerics, from a Hugging Face config.json or a llama2.c header.
#include <string>
#include <vector>

#include "flashlite/kv_cache.h"

namespace flashlite::engine {

// How RoPE pairs the elements of a head: llama2.c rotates adjacent pairs (2i, 2i+1); Hugging Face checkpoints
// rotate the two halves (i, i + head_dim/2) ("rotate_half").
enum class RopeStyle { interleaved, half_split };

struct RopeScaling {
  std::string type = "none";  // "none", "linear" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position = 8192;
};

// Upper bounds on the shape fields, far above any Llama-family model (Llama 3.1 405B: hidden 16384, intermediate
// 53248, 126 layers, 128 heads, vocabulary 128256), so that a hostile config.json or llama2.c header is refused by
// name before any size is computed from it, and every product the engine forms in int (q_dim, kv_dim) fits.
struct ConfigLimits {
  static constexpr int dim = 1 << 16, hidden_dim = 1 << 20, n_layers = 1024, n_heads = 1024, head_dim = 512;
  static constexpr int vocab_size = 1 << 22, max_seq_len = 1 << 22;
};

struct ModelConfig {
  std::string source;  // "hf" or "llama2c"
  int dim = 0;         // hidden_size
  int hidden_dim = 0;  // intermediate_size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;  // max_position_embeddings
  float rms_eps = 1e-5f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::half_split;
  bool tie_embeddings = false;
  std::string dtype = "float32";  // storage dtype of the checkpoint (informational)
  int bos_id = -1;
  std::vector<int> eos_ids;  // stop tokens (generation_config.json, else config.json)

  int q_dim() const { return n_heads * head_dim; }  // fits an int once validate() has passed
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Throws Error when a field is zero, negative, beyond the limits below or inconsistent (heads not divisible,
  // odd head_dim, stop token outside the vocabulary, ...), naming the field, its value and the expectation.
  void validate(const std::string& where) const;
  std::string summary() const;
};

// Parses config.json (and generation_config.json when present) of a Hugging Face Llama-family checkpoint.
ModelConfig load_hf_config(const std::string& dir);

// The model's RoPE as flashlite applies it (append_kv, flashlite/rope.h): theta, pair layout, llama3 / linear scaling.
RopeOptions rope_options(const ModelConfig& c);

}  // namespace flashlite::engine
