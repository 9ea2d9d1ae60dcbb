#pragma once
// Synthetic Hugging Face Llama checkpoints for the engine tests: random weights rounded to the storage dtype, written
// as config.json + safetensors (single or sharded) by the tests' own writer; the returned RefModel holds the stored values.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reference_llama.h"

namespace synth {

struct Spec {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, head_dim, vocab;
  const char* dtype;  // F32, F16, BF16
  bool tied;
  bool llama3_scaling;
  int shards;  // 0 = single model.safetensors
};

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
// Random model (weights ~ N(0, c/sqrt(fan_in)), norms around 1) written to `dir`.
reftest::RefModel write_checkpoint(const std::filesystem::path& dir, const Spec& s, uint32_t seed);

}  // namespace synth
