#pragma once
// Runs one attention problem from the CLI's settings: random inputs, the chosen backend, timing, and a check
// against the float64 reference.
#include <cstdint>
#include <string>
#include <vector>

#include "flashlite/attention.h"

namespace flashlite::cli {

struct AttnSettings {
  int64_t batch = 1, heads = 8, kv_heads = 0, seq_q = 1024, seq_k = -1, head_dim = 64;  // kv_heads 0, seq_k -1: as q
  std::string dtype = "auto";  // auto: bf16 on a GPU, f32 on the CPU
  bool causal = false;
  std::vector<int> window;  // {left} or {left, right}
  int sink_tokens = 0;
  bool sink_logits = false;
  double softcap = 0.0;
  bool varlen = false;
  std::string backend = "auto";
  std::string device = "auto";  // auto: cuda when a GPU is present (for backends auto and naive)
  int repeat = 10;
  int warmup = 2;
  uint64_t seed = 0;
  bool check = true;
  bool json = false;
};

struct AttnReport {
  std::string device, backend, kernel, dtype;
  int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim;
  double median_ms = 0, min_ms = 0, flops = 0;
  bool checked = false;
  double max_abs_err = 0, rel_err = 0, lse_max_abs_err = 0;
  bool passed = true;
  std::string tolerance;
};

AttnReport run_attention(const AttnSettings& s);

}  // namespace flashlite::cli
