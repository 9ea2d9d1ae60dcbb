#pragma once
// Token selection where the logits live: the greedy token and the top-k candidates of each logits row, so a decode
// step copies back 8 bytes (or k pairs) per sequence instead of the whole fp32 row. Both follow the host sampler's
// tie rules exactly (engine/sampler.cpp): the first index of the maximum; at the k-th value, the lowest ids.
// A NaN ranks above +inf (select_keys.cuh), so a row the host sampler would refuse (a NaN or +inf logit, or every
// logit -inf) shows in its argmax key: argmax_key_problem.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace flashlite::engine::cuda_ops {

// keys[r] = the maximum over row r of (ordered value << 32 | ~index): the largest logit, the lowest index among equal
// ones (-0 counts as +0). keys: (rows) device, fully written; logits: (rows, vocab) fp32 device.
void argmax_rows(uint64_t* keys, const float* logits, int rows, int vocab, void* stream);
inline int32_t argmax_key_index(uint64_t key) { return int32_t(~uint32_t(key)); }
// The logit an argmax key holds (select_keys.cuh's ordered_key undone): NaN for the NaN key, -0 as +0.
inline float argmax_key_value(uint64_t key) {
  const uint32_t v = uint32_t(key >> 32);
  if (v == 0xffffffffu) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t u = (v & 0x80000000u) ? (v & 0x7fffffffu) : ~v;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Why the row with this argmax key cannot be sampled, in the host sampler's words (engine/sampler.h unsampleable),
// or empty: its maximum is NaN (key 0xffffffff; the first NaN), +inf (0xff800000) or -inf (0x007fffff: every logit).
inline std::string argmax_key_problem(uint64_t key) {
  const uint32_t v = uint32_t(key >> 32);
  const std::string at = "logit " + std::to_string(argmax_key_index(key));
  if (v == 0xffffffffu) return at + " is NaN: the model produced a non-finite logit; nothing can be sampled from this row";
  if (v == 0xff800000u) return at + " is +inf: the model produced a non-finite logit; nothing can be sampled from this row";
  if (v == 0x007fffffu) return "every logit is -inf: no token can be sampled";
  return {};
}

// The k largest logits of each row and their ids, in no particular order (exact: radix select on the same keys).
// values, ids: (rows, k) device; 0 < k < vocab.
void top_k_rows(float* values, int32_t* ids, const float* logits, int rows, int vocab, int k, void* stream);

}  // namespace flashlite::engine::cuda_ops
