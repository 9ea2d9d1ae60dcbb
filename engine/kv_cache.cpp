#include "engine/kv_cache.h"

#include "engine/errors.h"

namespace flashlite::engine {

KvCache::KvCache(const KvCacheShape& shape) : s_(shape), row_(int64_t(shape.kv_heads) * shape.head_dim) {
  if (s_.layers <= 0 || s_.slots <= 0 || s_.capacity <= 0 || s_.kv_heads <= 0 || s_.head_dim <= 0) {
    fail("KV cache shape (layers " + std::to_string(s_.layers) + ", slots " + std::to_string(s_.slots) + ", capacity " +
         std::to_string(s_.capacity) + ", kv_heads " + std::to_string(s_.kv_heads) + ", head_dim " +
         std::to_string(s_.head_dim) + ") must be all positive");
  }
  const double bytes = 2.0 * s_.layers * s_.slots * double(s_.capacity) * row_ * sizeof(float);
  if (bytes > 64.0 * (1ull << 30)) {
    fail("KV cache of " + std::to_string(int64_t(bytes / (1 << 20))) + " MiB for capacity " + std::to_string(s_.capacity) +
         " x " + std::to_string(s_.slots) + " sequences is too large; lower the context length or the batch");
  }
  const size_t n = size_t(s_.layers) * s_.slots * s_.capacity * row_;
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

TensorView KvCache::k_view(int layer, int slot, int len) {
  return TensorView::strided(k(layer, slot, 0), DType::f32, Device::cpu(), {1, len, s_.kv_heads, s_.head_dim},
                             {int64_t(s_.capacity) * row_, row_, s_.head_dim, 1});
}

TensorView KvCache::v_view(int layer, int slot, int len) {
  return TensorView::strided(v(layer, slot, 0), DType::f32, Device::cpu(), {1, len, s_.kv_heads, s_.head_dim},
                             {int64_t(s_.capacity) * row_, row_, s_.head_dim, 1});
}

}  // namespace flashlite::engine
