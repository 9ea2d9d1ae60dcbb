#pragma once
// Synthetic Hugging Face Llama checkpoints for the engine tests: random weights rounded to the storage dtype, written
// as config.json + safetensors (single or sharded) by the tests' own writer; the returned RefModel holds the stored values.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "reference_llama.h"

namespace synth {

// config.json's RoPE: rope_theta and rope_scaling (none when `type` is null).
struct Rope {
  double theta = 500000.0;
  const char* type = nullptr;  // "llama3", "linear" or "default"
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position = 8192;
  const char* type_key = "rope_type";  // older configs write "type"
  bool parameters = false;  // transformers >= 5: theta and scaling in one "rope_parameters" object
};

// Llama 3.1's recipe at an original context of 32: with head_dim 64, pair 0 is kept, pairs 1-3 are blended and the
// rest slowed by 8 (the CUDA tests' models).
inline constexpr Rope kLlama3Rope{.theta = 500000.0, .type = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                                  .high_freq_factor = 4.0, .original_max_position = 32};

struct Spec {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, head_dim, vocab;
  const char* dtype;  // F32, F16, BF16
  bool tied;
  bool llama3_scaling;  // true: kLlama3Rope (`rope` is ignored)
  int shards;  // 0 = single model.safetensors
  Rope rope = {};
  int max_positions = 128;  // max_position_embeddings
};
inline void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }  // GoogleTest's name for a parameter

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double>* values;  // rounded in place to what is stored
};

// The bytes of one safetensors file holding `tensors` (values rounded to dtype in place).
std::string safetensors_bytes(const std::string& dtype, std::vector<Tensor>& tensors);
void write_file(const std::filesystem::path& p, const std::string& s);
std::filesystem::path fresh_dir(const std::string& name);
nlohmann::json config_json(const Spec& s);
// The reference's RoPE fields (theta, scaling) as the spec's config.json states them.
void set_rope(const Spec& s, reftest::RefModel& m);
// Random model (weights ~ N(0, c/sqrt(fan_in)), norms around 1) written to `dir`.
reftest::RefModel write_checkpoint(const std::filesystem::path& dir, const Spec& s, uint32_t seed);

}  // namespace synth
