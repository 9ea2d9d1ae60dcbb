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

std::vector<KvGroup> kv_groups(const std::vector<SequenceInput>& inputs, bool any_slots) {
  std::vector<KvGroup> groups;
  for (int i = 0; i < int(inputs.size()); ++i) {
    const int n = int(inputs[i].tokens.size());
    if (!groups.empty()) {
      KvGroup& g = groups.back();
      if (g.n == n && (any_slots || inputs[i].slot == g.slot0 + g.count)) {
        ++g.count;
        continue;
      }
    }
    groups.push_back({i, 1, inputs[i].slot, n});
  }
  return groups;
}

PageAllocator::PageAllocator(int pages) : total_(pages) {
  for (int p = pages - 1; p >= 0; --p) free_.push_back(p);
}

void PageAllocator::take(int n, std::vector<int32_t>& pages) {
  if (n > free()) {
    fail("KV cache is out of pages: " + std::to_string(n) + " needed, " + std::to_string(free()) + " of " +
         std::to_string(total_) + " free");
  }
  for (int i = 0; i < n; ++i) {
    pages.push_back(free_.back());
    free_.pop_back();
  }
}

void PageAllocator::give_back(const int32_t* pages, int n) {
  for (int i = n - 1; i >= 0; --i) free_.push_back(pages[i]);
}

KvCacheView kv_paged_view(const KvCacheShape& s, void* k, void* v, DType dtype, Device device, int first, int count,
                          int64_t n_indices, const PageTablePointers& host, const PageTablePointers& dev) {
  KvCacheView c;
  c.layout = KvLayout::paged;
  c.k = TensorView::contiguous(k, dtype, device, {s.pages, s.page_size, s.kv_heads, s.head_dim});
  c.v = TensorView::contiguous(v, dtype, device, {s.pages, s.page_size, s.kv_heads, s.head_dim});
  auto i32 = [](const int32_t* p, int64_t len, Device d) {
    return TensorView::contiguous(const_cast<int32_t*>(p), DType::i32, d, {len});
  };
  c.host.page_indptr = i32(host.indptr + first, count + 1, Device::cpu());
  c.host.page_indices = i32(host.indices, n_indices, Device::cpu());
  c.host.last_page_len = i32(host.last_page_len + first, count, Device::cpu());
  if (dev.indptr) {
    c.device.page_indptr = i32(dev.indptr + first, count + 1, device);
    c.device.page_indices = i32(dev.indices, n_indices, device);
    c.device.last_page_len = i32(dev.last_page_len + first, count, device);
  }
  return c;
}

PageTablePointers pointers(const PageTable& t) { return {t.indptr.data(), t.indices.data(), t.last_page_len.data()}; }

KvBook::KvBook(const KvCacheShape& shape) : s_(shape) {
  if (s_.layers <= 0 || s_.slots <= 0 || s_.capacity <= 0 || s_.kv_heads <= 0 || s_.head_dim <= 0) {
    fail("KV cache shape (layers " + std::to_string(s_.layers) + ", slots " + std::to_string(s_.slots) + ", capacity " +
         std::to_string(s_.capacity) + ", kv_heads " + std::to_string(s_.kv_heads) + ", head_dim " +
         std::to_string(s_.head_dim) + ") must be all positive");
  }
  if (paged() && (s_.page_size < 16 || s_.page_size > 256 || s_.pages < 1)) {
    fail("paged KV cache of " + std::to_string(s_.pages) + " pages of " + std::to_string(s_.page_size) +
         " tokens: expected a page size in [16, 256] and at least one page");
  }
  lengths_.assign(s_.slots, 0);
  if (paged()) {
    alloc_ = PageAllocator(s_.pages);
    slot_pages_.assign(s_.slots, {});
  }
}

void KvBook::set_length(int slot, int len) {
  if (slot < 0 || slot >= s_.slots) fail("KV cache slot " + std::to_string(slot) + " is outside [0, " + std::to_string(s_.slots) + ")");
  if (len < 0 || len > s_.capacity) {
    fail("KV cache length " + std::to_string(len) + " is outside [0, " + std::to_string(s_.capacity) + "]");
  }
  if (paged()) {
    std::vector<int32_t>& own = slot_pages_[slot];
    const int need = (len + s_.page_size - 1) / s_.page_size, have = int(own.size());
    if (need > have) alloc_.take(need - have, own);
    if (need < have) {
      alloc_.give_back(own.data() + need, have - need);
      own.resize(size_t(need));
    }
  }
  lengths_[slot] = len;
}

namespace {

template <class SlotOf>
void fill_page_table(const std::vector<std::vector<int32_t>>& slot_pages, const std::vector<int32_t>& lengths,
                     int page_size, int count, SlotOf slot_of, PageTable& t) {
  t.indptr.assign(1, 0);
  t.indices.clear();
  t.last_page_len.clear();
  for (int i = 0; i < count; ++i) {
    const int s = slot_of(i);
    const std::vector<int32_t>& own = slot_pages.at(size_t(s));
    t.indices.insert(t.indices.end(), own.begin(), own.end());
    t.indptr.push_back(int32_t(t.indices.size()));
    t.last_page_len.push_back(own.empty() ? 0 : lengths[size_t(s)] - (int(own.size()) - 1) * page_size);
  }
  if (t.indices.empty()) t.indices.push_back(0);  // a valid pointer for a batch without pages
}

}  // namespace

void KvBook::page_table(const int* slots, int count, PageTable& t) const {
  fill_page_table(slot_pages_, lengths_, s_.page_size, count, [&](int i) { return slots[i]; }, t);
}

void KvBook::page_table(int slot0, int count, PageTable& t) const {
  fill_page_table(slot_pages_, lengths_, s_.page_size, count, [&](int i) { return slot0 + i; }, t);
}

void KvBook::position_table(const int* slots, const int32_t* from, const int32_t* to, int count, PageTable& t) const {
  if (!paged()) fail("internal error: a position table of a contiguous cache was asked for");
  t.indptr.assign(1, 0);  // replaces t, keeping its vectors' capacity (a row step per mixed step)
  t.indices.clear();
  t.last_page_len.clear();
  for (int i = 0; i < count; ++i) {
    const std::vector<int32_t>& own = slot_pages_.at(size_t(slots[i]));
    for (int32_t p = from[i]; p < to[i]; ++p) {
      if (p < 0 || p >= lengths_.at(size_t(slots[i]))) {
        fail("internal error: position " + std::to_string(p) + " of slot " + std::to_string(slots[i]) + " is not held");
      }
      const int pages = p / s_.page_size + 1;
      t.indices.insert(t.indices.end(), own.begin(), own.begin() + pages);
      t.indptr.push_back(int32_t(t.indices.size()));
      t.last_page_len.push_back(p % s_.page_size + 1);
    }
  }
}

int64_t KvBook::row(int slot, int pos) const {
  if (!paged()) return int64_t(slot) * s_.capacity + pos;
  return int64_t(slot_pages_.at(slot).at(size_t(pos / s_.page_size))) * s_.page_size + pos % s_.page_size;
}

KvCache::KvCache(const KvCacheShape& shape) : book_(shape) {
  const KvCacheShape& sh = book_.shape();
  const int64_t row = int64_t(sh.kv_heads) * sh.head_dim;
  const int64_t rows_per_layer = paged() ? int64_t(sh.pages) * sh.page_size : int64_t(sh.slots) * sh.capacity;
  const double bytes = 2.0 * sh.layers * double(rows_per_layer) * row * sizeof(float);
  if (bytes > 64.0 * (1ull << 30)) {
    fail("KV cache of " + std::to_string(int64_t(bytes / (1 << 20))) + " MiB for capacity " + std::to_string(sh.capacity) +
         " x " + std::to_string(sh.slots) + " sequences is too large; lower the context length or the batch");
  }
  const size_t n = size_t(sh.layers) * size_t(rows_per_layer) * row;
  k_.assign(n, 0.f);
  v_.assign(n, 0.f);
}

KvCacheView KvCache::view(int layer, int slot0, int count) {
  const KvCacheShape& sh = book_.shape();
  if (count < 0) count = sh.slots - slot0;
  if (layer < 0 || layer >= sh.layers || slot0 < 0 || count < 1 || slot0 + count > sh.slots) {
    fail("KV cache view of layer " + std::to_string(layer) + ", slots [" + std::to_string(slot0) + ", " +
         std::to_string(slot0 + count) + ") is outside " + std::to_string(sh.layers) + " layers x " + std::to_string(sh.slots) +
         " slots");
  }
  const int64_t row = int64_t(sh.kv_heads) * sh.head_dim;
  if (paged()) {
    book_.page_table(slot0, count, table_);
    const size_t layer_off = size_t(layer) * sh.pages * sh.page_size * row;
    return kv_paged_view(sh, k_.data() + layer_off, v_.data() + layer_off, DType::f32, Device::cpu(), 0, count,
                         int64_t(table_.indices.size()), pointers(table_));
  }
  const size_t layer_off = size_t(layer) * sh.slots * sh.capacity * row;
  return kv_cache_view(sh, k_.data() + layer_off, v_.data() + layer_off, DType::f32, Device::cpu(), slot0, count,
                       book_.lengths() + slot0);
}

}  // namespace flashlite::engine
