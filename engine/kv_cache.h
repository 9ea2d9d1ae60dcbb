#pragma once
// The CPU KV cache: one fp32 buffer per K and V, (layer, slot, capacity, kv_heads, head_dim). A slot is one
// sequence; its first length(slot) positions are valid. Views handed to flashlite cover exactly that prefix.
#include <cstdint>
#include <vector>

#include "flashlite/tensor.h"

namespace flashlite::engine {

struct KvCacheShape {
  int layers = 0, slots = 0, capacity = 0, kv_heads = 0, head_dim = 0;
};

class KvCache {
 public:
  KvCache() = default;
  explicit KvCache(const KvCacheShape& shape);  // throws Error when a size is not positive or too large

  const KvCacheShape& shape() const { return s_; }
  int length(int slot) const { return lengths_.at(slot); }
  void set_length(int slot, int len);  // throws Error outside [0, capacity]
  void reset(int slot) { set_length(slot, 0); }

  float* k(int layer, int slot, int pos) { return k_.data() + offset(layer, slot, pos); }
  float* v(int layer, int slot, int pos) { return v_.data() + offset(layer, slot, pos); }
  // [1, len, kv_heads, head_dim] views of positions [0, len) of one slot.
  TensorView k_view(int layer, int slot, int len);
  TensorView v_view(int layer, int slot, int len);
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  int64_t offset(int layer, int slot, int pos) const {
    return ((int64_t(layer) * s_.slots + slot) * s_.capacity + pos) * row_;
  }
  KvCacheShape s_;
  int64_t row_ = 0;  // kv_heads * head_dim
  std::vector<float> k_, v_;  // (layer, slot, capacity, kv_heads, head_dim)
  std::vector<int> lengths_;
};

}  // namespace flashlite::engine
