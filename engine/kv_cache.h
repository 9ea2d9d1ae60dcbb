#pragma once
// The engine's KV cache is a flashlite KV cache (include/flashlite/kv_cache.h, docs/kv-cache.md), contiguous layout,
// one per layer: k, v [slots, capacity, kv_heads, head_dim], slot s holding length(s) tokens at rows 0... Both models
// write it through the library (CPU: append_kv, which applies the RoPE; CUDA: append_kv, or the QKV GEMV's epilogue
// with the library's device RoPE writing row slot * capacity + position of the same layout) and attend over it with
// flashlite::decode / prefill. A step follows the library's order: grow the lengths, append, attend.
//   kv_cache_view  the flashlite view of any storage in this layout (CPU fp32 here, bf16 / fp32 device memory in
//                  engine/cuda_ops) for a run of slots and their lengths;
//   kv_groups      a forward call's inputs as the runs of slots the library's batched calls take;
//   KvCache        the CPU model's storage (fp32) and the slots' lengths.
#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "flashlite/kv_cache.h"

namespace flashlite::engine {

struct KvCacheShape {
  int layers = 0, slots = 0, capacity = 0, kv_heads = 0, head_dim = 0;
};

// The flashlite view of one layer's storage k, v (each [slots, capacity, kv_heads, head_dim], contiguous) over the
// `count` slots from `slot0`, holding host_lens[0 .. count) tokens; device_lens: the same lengths on the cache's
// device (CUDA caches; null for CPU ones).
KvCacheView kv_cache_view(const KvCacheShape& shape, void* k, void* v, DType dtype, Device device, int slot0, int count,
                          const int32_t* host_lens, const int32_t* device_lens = nullptr);

// A run of a forward call's inputs that one library call serves: `count` consecutive inputs from `first` on the
// consecutive slots slot0 .. slot0 + count - 1, each with n new tokens (a decode step over slots 0..B-1, or a batch of
// equal prompts, is one group).
struct KvGroup {
  int first = 0, count = 0, slot0 = 0, n = 0;
};
std::vector<KvGroup> kv_groups(const std::vector<SequenceInput>& inputs);

class KvCache {
 public:
  KvCache() = default;
  explicit KvCache(const KvCacheShape& shape);  // throws Error when a size is not positive or too large

  const KvCacheShape& shape() const { return s_; }
  int length(int slot) const { return lengths_.at(slot); }
  void set_length(int slot, int len);  // throws Error outside [0, capacity]
  void reset(int slot) { set_length(slot, 0); }

  // Layer `layer` as a flashlite cache over the `count` slots from slot0 (default: every slot) at their lengths.
  KvCacheView view(int layer, int slot0 = 0, int count = -1);
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  KvCacheShape s_;
  std::vector<float> k_, v_;      // (layer, slot, capacity, kv_heads, head_dim)
  std::vector<int32_t> lengths_;  // (slots): the views' host seq_lens
};

}  // namespace flashlite::engine
