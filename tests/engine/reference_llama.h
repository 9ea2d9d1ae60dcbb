#pragma once
// An independent float64 Llama forward for the engine tests. It shares no code with engine/: it reads llama2.c files
// itself, keeps every weight as double in the checkpoint's own (unfused) layout and runs each position with explicit
// loops over the whole prefix (no KV cache, no flashlite). The engine must agree with it within 1e-4 on the logits.
#include <cstdint>
#include <string>
#include <vector>

namespace reftest {

struct RefModel {
  int dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, seq_len = 0;
  double eps = 1e-5, theta = 10000.0;
  bool interleaved = true;  // llama2.c pairs (2i, 2i+1); HF pairs (i, i + D/2)
  // RoPE scaling (config.json's rope_scaling), written here from the published recipes: linear divides every
  // position by `scale_factor`; llama3 sorts the rotary pairs by wavelength (rope_band below).
  enum class Scaling { none, linear, llama3 } scaling = Scaling::none;
  double scale_factor = 1, low_freq = 1, high_freq = 4;
  int original_ctx = 8192;
  bool tied = true;
  // Per layer, row-major [out, in]: wq (heads*hd, dim), wk/wv (kv_heads*hd, dim), wo (dim, heads*hd),
  // w1/w3 (hidden, dim), w2 (dim, hidden).
  std::vector<double> emb, rms_final, wcls;
  std::vector<std::vector<double>> rms_att, rms_ffn, wq, wk, wv, wo, w1, w2, w3;
};

// Llama 3 RoPE scaling of rotary pair `pair`, by its unscaled wavelength 2 pi / theta^(-2 pair / head_dim) against
// original_ctx / high_freq and original_ctx / low_freq: shorter is kept, longer slowed by scale_factor, and in between
// (bounds included) the pair's frequency is keep * freq + (1 - keep) * freq / scale_factor with
// keep = (original_ctx / wavelength - low_freq) / (high_freq - low_freq). `keep` receives that weight (1 when kept,
// 0 when slowed).
enum class RopeBand { kept, blended, slowed };
RopeBand rope_band(const RefModel& m, int pair, double* keep);

// Reads a legacy (version 0) llama2.c checkpoint. Returns false when the file is missing.
bool read_llama2c(const std::string& path, RefModel& m);

// Logits (vocab) of every position of `tokens`, each attending to the tokens before it.
std::vector<std::vector<double>> forward_all(const RefModel& m, const std::vector<int>& tokens);

// Greedy continuation of `prompt` for `steps` tokens with the float64 model. `min_margin` receives the
// smallest gap between the best and second-best logit seen (near-ties make greedy paths fragile).
std::vector<int> greedy(const RefModel& m, const std::vector<int>& prompt, int steps, double* min_margin);

// Where the tests find ../shared/models (env FLASHLITE_MODELS overrides).
std::string models_dir();

}  // namespace reftest
