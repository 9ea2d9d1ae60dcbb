#pragma once
// What the generation loop needs from a model, whatever runs it (CPU: LlamaCpu; CUDA: LlamaCuda).
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "flashlite/attention.h"

namespace flashlite::engine {

// New tokens of one sequence, appended at its current cache length.
struct SequenceInput {
  int slot = 0;
  std::vector<int> tokens;
  bool all_logits = false;  // logits for every new position (teacher forcing); else only the last
};

struct RuntimeOptions {
  int slots = 1;          // sequences held at once (batch)
  int context = 0;        // KV capacity per sequence; 0 = the model's max_seq_len
  int threads = 0;        // CPU: 0 = automatic (1 for models under ~5M parameters, else every core)
  Backend attention = Backend::automatic;  // flashlite backend; automatic = cpu on the CPU, cuda on the GPU
  std::string precision = "auto";          // CUDA: "bf16", "fp32", or auto (= bf16); the CPU path is fp32
  int device_index = 0;                    // CUDA device
};

class LlamaModel {
 public:
  virtual ~LlamaModel() = default;
  // Runs every sequence's new tokens in one pass and appends them to the KV cache. Returns fp32 logits on the host,
  // (sum over inputs of n or 1, vocab), in input order. Throws Error on a bad token or a context overflow.
  virtual const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) = 0;
  virtual const ModelConfig& config() const = 0;
  virtual int slots() const = 0;
  virtual int context() const = 0;     // KV positions per sequence
  virtual int length(int slot) = 0;    // cached positions of a sequence
  virtual void reset(int slot) = 0;    // forget a sequence
  virtual int threads() const { return 1; }
  virtual std::string device() const = 0;
  virtual size_t device_bytes() const { return 0; }  // accelerator memory held (weights, KV cache, scratch)
  virtual std::string attention_kernel() = 0;  // flashlite's kernel name for a decode step
};

struct ModelWeights;
// A model on `device` ("cpu" or "cuda"); throws Error when the device is unavailable in this build or machine.
std::unique_ptr<LlamaModel> create_model(const ModelWeights& weights, const RuntimeOptions& options,
                                         const std::string& device);

}  // namespace flashlite::engine
