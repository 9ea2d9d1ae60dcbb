#pragma once
// The engine's KV cache is a flashlite KV cache (include/flashlite/kv_cache.h, docs/kv-cache.md), one per layer:
// contiguous, k, v [slots, capacity, kv_heads, head_dim] with slot s holding length(s) tokens at rows 0..., or paged,
// [pages, page_size, kv_heads, head_dim] with each slot's pages in its page table (KvBook). Both models write it
// through the library (CPU: append_kv, which applies the RoPE; CUDA: append_kv, or the QKV GEMV's epilogue with the
// library's device RoPE writing the row KvBook::row names, the one append_kv writes) and attend over it with
// flashlite::decode / prefill. A step follows the library's order: grow the lengths, append, attend.
//   kv_cache_view  the flashlite view of any storage in this layout (CPU fp32 here, bf16 / fp32 device memory in
//                  engine/cuda_ops) for a run of slots and their lengths;
//   kv_groups      a forward call's inputs as the runs of slots the library's batched calls take;
//   KvCache        the CPU model's storage (fp32) and the slots' lengths; contiguous, or paged (page_size > 0: a pool
//                  of pages per layer, [pages, page_size, kv_heads, head_dim], each slot holding the pages its length
//                  needs, taken from PageAllocator as it grows and given back as it shrinks or resets; the server's
//                  continuous batching runs on it, docs/serving.md).
#include <cstdint>
#include <vector>

#include "engine/model.h"
#include "flashlite/kv_cache.h"

namespace flashlite::engine {

struct KvCacheShape {
  int layers = 0, slots = 0, capacity = 0, kv_heads = 0, head_dim = 0;
  int page_size = 0;  // 0: contiguous; else paged (16..256, the library's range) with `pages` pages per layer
  int pages = 0;
};

// Page ids of a paged cache's pool: the free ones, lowest first. Pages are the same ids in every layer's pool.
class PageAllocator {
 public:
  explicit PageAllocator(int pages = 0);
  int total() const { return total_; }
  int free() const { return int(free_.size()); }
  int used() const { return total_ - free(); }
  // Appends `n` page ids to `pages`; throws Error (taking none) when fewer than n are free.
  void take(int n, std::vector<int32_t>& pages);
  void give_back(const int32_t* pages, int n);

 private:
  int total_ = 0;
  std::vector<int32_t> free_;  // a stack, lowest id on top
};

// The flashlite view of one layer's storage k, v (each [slots, capacity, kv_heads, head_dim], contiguous) over the
// `count` slots from `slot0`, holding host_lens[0 .. count) tokens; device_lens: the same lengths on the cache's
// device (CUDA caches; null for CPU ones).
KvCacheView kv_cache_view(const KvCacheShape& shape, void* k, void* v, DType dtype, Device device, int slot0, int count,
                          const int32_t* host_lens, const int32_t* device_lens = nullptr);

// A CSR page table of `count` sequences (flashlite's paged index): indptr [count + 1], indices [indptr[count]] (at
// least one element, so that the pointer is valid), last_page_len [count].
struct PageTable {
  std::vector<int32_t> indptr, indices, last_page_len;
  int count() const { return int(last_page_len.size()); }
};
// Where a page table's arrays lie (host, or the same values on a CUDA cache's device).
struct PageTablePointers {
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
};
// The flashlite view of one layer's page pools k, v (each [pages, page_size, kv_heads, head_dim], contiguous) for
// sequences [first, first + count) of the page table `host` (`n_indices` page ids in all; its indptr values are
// absolute, so a run of sequences is a slice), and `device`: the same arrays on the cache's device for CUDA caches
// (null pointers otherwise).
KvCacheView kv_paged_view(const KvCacheShape& shape, void* k, void* v, DType dtype, Device device, int first, int count,
                          int64_t n_indices, const PageTablePointers& host, const PageTablePointers& device_table = {});
PageTablePointers pointers(const PageTable& t);

// The index of a cache, apart from its storage: each slot's length and, paged, the pages it holds (taken from a
// PageAllocator as it grows, given back as it shrinks or resets). The CPU cache (KvCache) and the CUDA model keep one.
class KvBook {
 public:
  KvBook() = default;
  explicit KvBook(const KvCacheShape& shape);  // throws Error when a size is not positive or the page size is out of range
  const KvCacheShape& shape() const { return s_; }
  bool paged() const { return s_.page_size > 0; }
  int length(int slot) const { return lengths_.at(slot); }
  const int32_t* lengths() const { return lengths_.data(); }
  // Throws Error outside [0, capacity] or, paged, when the pages it needs are not free (then nothing changes).
  void set_length(int slot, int len);
  const PageAllocator& pages() const { return alloc_; }
  // The page table of `slots` (in that order), or of the run slot0 .. slot0 + count - 1, at their lengths.
  void page_table(const int* slots, int count, PageTable& out) const;
  void page_table(int slot0, int count, PageTable& out) const;
  // One entry per position instead (paged only): for each i, positions from[i] .. to[i] - 1 of slots[i], in that
  // order, the entry of position p holding the slot's sequence up to and including p (its first p / page_size + 1
  // pages, the last holding p % page_size + 1 tokens). One decode call over such a table attends prompt rows causally
  // beside decode rows (the CUDA engine's mixed steps). Replaces `out`, as page_table does.
  void position_table(const int* slots, const int32_t* from, const int32_t* to, int count, PageTable& out) const;
  // Where position `pos` of `slot` lies in a layer's storage, in rows of kv_heads x head_dim: page * page_size +
  // pos % page_size (paged; the page must be held), else slot * capacity + pos.
  int64_t row(int slot, int pos) const;

 private:
  KvCacheShape s_;
  std::vector<int32_t> lengths_;
  PageAllocator alloc_;
  std::vector<std::vector<int32_t>> slot_pages_;  // paged: each slot's pages in token order
};

// A run of a forward call's inputs that one library call serves: `count` consecutive inputs from `first` on the
// consecutive slots slot0 .. slot0 + count - 1, each with n new tokens (a decode step over slots 0..B-1, or a batch of
// equal prompts, is one group). With `any_slots` (a paged cache, whose page table lists the inputs in their order),
// consecutive inputs of equal n form a group whatever their slots; slot0 is then the first input's slot.
struct KvGroup {
  int first = 0, count = 0, slot0 = 0, n = 0;
};
std::vector<KvGroup> kv_groups(const std::vector<SequenceInput>& inputs, bool any_slots = false);

class KvCache {
 public:
  KvCache() = default;
  explicit KvCache(const KvCacheShape& shape);  // throws Error when a size is not positive or too large

  const KvCacheShape& shape() const { return book_.shape(); }
  int length(int slot) const { return book_.length(slot); }
  // Throws Error outside [0, capacity] or, paged, when the pages it needs are not free (then nothing changes).
  void set_length(int slot, int len) { book_.set_length(slot, len); }
  void reset(int slot) { set_length(slot, 0); }
  bool paged() const { return book_.paged(); }
  const PageAllocator& pages() const { return book_.pages(); }

  // Layer `layer` as a flashlite cache over the `count` slots from slot0 (default: every slot) at their lengths.
  // Paged: its page table lives in this object until the next view() call.
  KvCacheView view(int layer, int slot0 = 0, int count = -1);
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  KvBook book_;
  std::vector<float> k_, v_;  // contiguous (layer, slot, capacity, kv_heads, head_dim); paged (layer, page, page_size, ...)
  PageTable table_;           // paged: the last view's page table
};

}  // namespace flashlite::engine
