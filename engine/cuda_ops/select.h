#pragma once
// Token selection where the logits live: the greedy token and the top-k candidates of each logits row, so a decode
// step copies back 8 bytes (or k pairs) per sequence instead of the whole fp32 row. Both follow the host sampler's
// tie rules exactly (engine/sampler.cpp): the first index of the maximum; at the k-th value, the lowest ids.
// Rows are assumed NaN-free (the host sampler's answer on NaN rows depends on scan order).
#include <cstddef>
#include <cstdint>

namespace flashlite::engine::cuda_ops {

// keys[r] = the maximum over row r of (ordered value << 32 | ~index): the largest logit, the lowest index among equal
// ones (-0 counts as +0). keys: (rows) device, fully written; logits: (rows, vocab) fp32 device.
void argmax_rows(uint64_t* keys, const float* logits, int rows, int vocab, void* stream);
inline int32_t argmax_key_index(uint64_t key) { return int32_t(~uint32_t(key)); }

// The k largest logits of each row and their ids, in no particular order (exact: radix select on the same keys).
// values, ids: (rows, k) device; 0 < k < vocab.
void top_k_rows(float* values, int32_t* ids, const float* logits, int rows, int vocab, int k, void* stream);

}  // namespace flashlite::engine::cuda_ops
