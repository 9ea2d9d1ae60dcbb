#pragma once
// The validated, resolved KV-cache problems every backend receives (built once by src/kv/kv_validate.cpp).
// Backends trust them: shapes, strides, lengths and page ids were checked on the host.
#include <cstdint>

#include "common/mask.h"
#include "common/paged.h"
#include "common/strides.h"
#include "flashlite/kv_cache.h"

namespace flashlite {

// One cache, resolved. Contiguous: token p of sequence b lives at (b, p); paged: at (pages[indptr[b] + p / page_size],
// p % page_size). `capacity` is max_len (contiguous) or page_size (paged).
struct KvCacheDesc {
  bool paged = false;
  DType dtype = DType::bf16;
  Device device{};
  int64_t batch = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;   // contiguous: max_len; paged: page_size
  int64_t num_pages = 0;  // paged: k.shape[0]
  void* k = nullptr;
  void* v = nullptr;
  RowStrides ks, vs;  // [sequence or page, slot, heads, head_dim] (head_dim stride 1)
  // Host index (CPU memory): validated.
  const int32_t* seq_lens = nullptr;
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
  // The same arrays as the kernels read them (the device copies for CUDA caches, the host ones for CPU caches).
  const int32_t* k_seq_lens = nullptr;
  const int32_t* k_indptr = nullptr;
  const int32_t* k_indices = nullptr;
  const int32_t* k_last_page_len = nullptr;
  int64_t max_length = 0;  // longest sequence (host index)

  int64_t length(int64_t b) const {
    if (!paged) return seq_lens[b];
    const int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
    return paged_length<int64_t>(pages, capacity, last_page_len, b);
  }
  // Element offset of token p of sequence b, head h, in k (use_v = false) or v. Host side only.
  int64_t offset(int64_t b, int64_t p, int64_t h, bool use_v) const {
    const RowStrides& s = use_v ? vs : ks;
    if (!paged) return s.offset(b, p, h);
    const int64_t page = indices[indptr[b] + p / capacity];
    return s.offset(page, p % capacity, h);
  }
};

struct RopeResolved {
  bool enabled = false;
  bool interleaved = false;
  RopeOptions options;
};

struct AppendProblem {
  KvCacheDesc cache;
  int64_t n_new = 0;  // tokens per sequence
  const void* k = nullptr;  // (batch, n_new, kv_heads, head_dim)
  const void* v = nullptr;
  RowStrides k_st, v_st;
  // Optional q rotation: (batch, n_new, q_heads, head_dim) -> q_out (may be q).
  const void* q = nullptr;
  void* q_out = nullptr;
  RowStrides q_st, qo_st;
  int64_t q_heads = 0;
  RopeResolved rope;
};

struct DecodeProblem {
  KvCacheDesc cache;
  int64_t q_len = 0, q_heads = 0;
  const void* q = nullptr;  // (batch, q_len, q_heads, head_dim)
  void* out = nullptr;      // (batch, q_len, q_heads, head_dim)
  RowStrides q_st, o_st;
  float* lse = nullptr;     // optional (batch, q_heads, q_len)
  LseStrides lse_st;
  const float* sink_logits = nullptr;  // optional (q_heads), same device as q
  double scale = 1.0;
  double softcap = 0.0;
  MaskParams mask;

  int64_t group() const { return q_heads / cache.kv_heads; }
};

}  // namespace flashlite
