#include "engine/kv_cache.h"

#include "engine/errors.h"

namespace flashlite::engine {

KvCacheView kv_cache_view(const KvCacheShape& s, void* k, void* v, DType dtype, Device device, int slot0, int count,
                          const int32_t* host_lens, const int32_t* device_lens) {
  const int64_t row = int64_t(s.kv_heads) * s.head_dim, slot_stride = int64_t(s.capacity) * row;
  const size_t offset = size_t(slot0) * size_t(slot_stride) * dtype_size(dtype);
  KvCacheView c;
  c.layout = KvLayout::contiguous;
  c.k = TensorView::strided(static_cast<char*>(k) + offset, dtype, device, {count, s.capacity, s.kv_heads, s.head_dim},
                            {slot_stride, row, s.head_dim, 1});
  c.v = TensorView::strided(static_cast<char*>(v) + offset, dtype, device, {count, s.capacity, s.kv_heads, s.head_dim},
                            {slot_stride, row, s.head_dim, 1});
  c.host.seq_lens = TensorView::contiguous(const_cast<int32_t*>(host_lens), DType::i32, Device::cpu(), {count});
  if (device_lens) c.device.seq_lens = TensorView::contiguous(const_cast<int32_t*>(device_lens), DType::i32, device, {count});
  return c;
}

std::vector<KvGroup> kv_groups(const std::vector<SequenceInput>& inputs) {
  std::vector<KvGroup> groups;
  for (int i = 0; i < int(inputs.size()); ++i) {
    const int n = int(inputs[i].tokens.size());
    if (!groups.empty()) {
      KvGroup& g = groups.back();
      if (g.n == n && inputs[i].slot == g.slot0 + g.count) {
        ++g.count;
        continue;
      }
    }
    groups.push_back({i, 1, inputs[i].slot, n});
  }
  return groups;
}

KvCache::KvCache(const KvCacheShape& shape) : s_(shape) {
  if (s_.layers <= 0 || s_.slots <= 0 || s_.capacity <= 0 || s_.kv_heads <= 0 || s_.head_dim <= 0) {
    fail("KV cache shape (layers " + std::to_string(s_.layers) + ", slots " + std::to_string(s_.slots) + ", capacity " +
         std::to_string(s_.capacity) + ", kv_heads " + std::to_string(s_.kv_heads) + ", head_dim " +
         std::to_string(s_.head_dim) + ") must be all positive");
  }
  const int64_t row = int64_t(s_.kv_heads) * s_.head_dim;
  const double bytes = 2.0 * s_.layers * s_.slots * double(s_.capacity) * row * sizeof(float);
  if (bytes > 64.0 * (1ull << 30)) {
    fail("KV cache of " + std::to_string(int64_t(bytes / (1 << 20))) + " MiB for capacity " + std::to_string(s_.capacity) +
         " x " + std::to_string(s_.slots) + " sequences is too large; lower the context length or the batch");
  }
  const size_t n = size_t(s_.layers) * s_.slots * s_.capacity * row;
  k_.assign(n, 0.f);
  v_.assign(n, 0.f);
  lengths_.assign(s_.slots, 0);
}

void KvCache::set_length(int slot, int len) {
  if (slot < 0 || slot >= s_.slots) fail("KV cache slot " + std::to_string(slot) + " is outside [0, " + std::to_string(s_.slots) + ")");
  if (len < 0 || len > s_.capacity) {
    fail("KV cache length " + std::to_string(len) + " is outside [0, " + std::to_string(s_.capacity) + "]");
  }
  lengths_[slot] = len;
}

KvCacheView KvCache::view(int layer, int slot0, int count) {
  if (count < 0) count = s_.slots - slot0;
  if (layer < 0 || layer >= s_.layers || slot0 < 0 || count < 1 || slot0 + count > s_.slots) {
    fail("KV cache view of layer " + std::to_string(layer) + ", slots [" + std::to_string(slot0) + ", " +
         std::to_string(slot0 + count) + ") is outside " + std::to_string(s_.layers) + " layers x " + std::to_string(s_.slots) +
         " slots");
  }
  const size_t layer_off = size_t(layer) * s_.slots * s_.capacity * s_.kv_heads * s_.head_dim;
  return kv_cache_view(s_, k_.data() + layer_off, v_.data() + layer_off, DType::f32, Device::cpu(), slot0, count,
                       lengths_.data() + slot0);
}

}  // namespace flashlite::engine
