// Validation of prefill() (include/flashlite/kv_cache.h): the cache, the options and sink logits are checked by
// validate_decode (kv_validate.cpp, the same rules and messages as decode()); the chunk-specific rules are here:
// ragged q via cu_seqlens_q, chunk lengths vs the cached lengths, ragged lse, and overlaps of the outputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_checks.h"
#include "flashlite/errors.h"
#include "kv/kv_backends.h"
#include "kv/kv_prefill.h"

namespace flashlite {
namespace {

using std::to_string;

using checks::fail;
using checks::fail_type;

void check_present_rank4(const TensorView& t, const char* name, const char* layout) {
  if (!(t.rank == 0 && t.data == nullptr) && t.rank != 4) {  // (a null view is reported as missing below)
    fail(std::string(name) + " has rank " + to_string(t.rank) + " (shape " + t.shape_string() + "); expected rank 4 " +
         layout);
  }
  check_present(t, name);
}

// An output a must not meet a buffer b read (or written): any meeting of address ranges is an error here (unlike
// append_kv / decode, no exception for interleaving views whose elements are disjoint).
void check_no_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  checks::check_separate(a, a_name, b, b_name, /*rows_may_interleave=*/false);
}

// A stand-in [batch, 1, heads, head_dim] view with the cache's dtype and device at `data`, so that validate_decode
// checks the cache, options and sink logits of a ragged call (the real q / out are checked here).
TensorView stand_in(void* data, const KvCacheView& c, int64_t batch, int64_t heads) {
  TensorView t;
  t.data = data;
  t.dtype = c.k.dtype;
  t.device = c.k.device;
  t.rank = 4;
  t.shape = {batch, 1, heads, c.k.shape[3]};
  t.strides = {0, 0, c.k.shape[3], 1};
  return t;
}

}  // namespace

PrefillProblem prefill_from_decode(const DecodeProblem& dp) {
  const KvCacheDesc& c = dp.cache;
  PrefillProblem p;
  p.cache = c;
  AttentionProblem& t = p.attn;
  t.dtype = c.dtype;
  t.device = c.device;
  t.batch = c.batch;
  t.q_heads = dp.q_heads;
  t.kv_heads = c.kv_heads;
  t.head_dim = c.head_dim;
  t.k = c.k;
  t.v = c.v;
  t.k_stride = c.ks;
  t.v_stride = c.vs;
  t.seq_k = c.max_length;
  t.sink_logits = dp.sink_logits;
  t.scale = dp.scale;
  t.softcap = dp.softcap;
  t.mask = dp.mask;
  t.q = dp.q;
  t.out = dp.out;
  t.seq_q = t.q_tensor_rows = dp.q_len;
  t.q_stride = dp.q_st;
  t.out_stride = dp.o_st;
  t.lse = dp.lse;
  t.lse_stride = dp.lse_st;
  return p;
}

PrefillProblem validate_prefill(const PrefillArgs& a) {
  const AttentionOptions& o = a.options;
  const bool ragged = !o.cu_seqlens_q.empty();
  if (!o.cu_seqlens_k.empty()) {
    fail("options.cu_seqlens_k is given; prefill takes the key lengths from the cache, expected it empty");
  }
  const char* layout = ragged ? "[1, total_q, q_heads, head_dim] (ragged: options.cu_seqlens_q is given)"
                              : "[batch, q_len, q_heads, head_dim]";
  check_present_rank4(a.q, "q", layout);
  check_present_rank4(a.out, "out", layout);
  check_not_broadcast(a.out, "out");
  if (!a.lse.empty()) check_not_broadcast(a.lse, "lse");

  DecodeArgs d;
  d.cache = a.cache;
  d.options = o;
  d.options.cu_seqlens_q = {};
  d.backend = a.backend;
  if (!ragged) {  // the decode rules are exactly the padded prefill rules, except q_len <= 8
    d.q = a.q;
    d.out = a.out;
    d.lse = a.lse;
  } else {
    // The cache's batch as validate_decode will resolve it (a malformed index fails there first).
    const bool paged = a.cache.layout == KvLayout::paged;
    const TensorView& idx = paged ? a.cache.host.page_indptr : a.cache.host.seq_lens;
    const int64_t batch = idx.rank == 1 ? idx.shape[0] - (paged ? 1 : 0) : 0;
    static float dummy_q[1], dummy_out[1];  // empty ragged batches may pass null data
    d.q = stand_in(a.q.data ? a.q.data : dummy_q, a.cache, batch, a.q.shape[2]);
    d.out = stand_in(a.out.data ? a.out.data : dummy_out, a.cache, batch, a.q.shape[2]);
  }
  const DecodeProblem dp = validate_decode(d, ragged);
  const KvCacheDesc& c = dp.cache;

  PrefillProblem p = prefill_from_decode(dp);
  AttentionProblem& t = p.attn;
  t.q = a.q.data;
  t.out = a.out.data;

  if (!ragged) {
    for (int64_t b = 0; b < c.batch; ++b) {
      if (c.length(b) < dp.q_len) {
        fail("q has q_len " + to_string(dp.q_len) + " but sequence " + to_string(b) + " holds " + to_string(c.length(b)) +
             " tokens in the cache; expected q_len <= every sequence's length (the chunk is the last q_len tokens of "
             "each sequence, appended first; pass options.cu_seqlens_q for chunks of different lengths)");
      }
    }
    return p;
  }

  // Ragged: q / out [1, total_q, q_heads, head_dim] in the cache's dtype on its device.
  for (auto [v, name] : {std::pair{&a.q, "q"}, {&a.out, "out"}}) {
    if (v->dtype != c.dtype) {
      fail_type(std::string(name) + " has dtype " + dtype_name(v->dtype) + " but the cache has " + dtype_name(c.dtype) +
                "; expected the cache's dtype");
    }
    if (!(v->device == c.device)) {
      fail(std::string(name) + " is on " + device_name(v->device) + " but the cache is on " + device_name(c.device) +
           "; expected the same device");
    }
    if (v->shape[0] != 1) fail(std::string(name) + " has shape " + v->shape_string() + "; expected batch 1 " + layout);
    if (v->shape[3] != c.head_dim) {
      fail(std::string(name) + " has head_dim " + to_string(v->shape[3]) + " (shape " + v->shape_string() + "); expected " +
           to_string(c.head_dim) + " (the cache's)");
    }
    if (v->shape[3] > 1 && v->strides[3] != 1 && v->numel() > 0) {  // (an empty view is never touched)
      fail(std::string(name) + " has head_dim stride " + to_string(v->strides[3]) + "; expected 1 (head_dim contiguous)");
    }
  }
  for (int i = 1; i < 3; ++i) {
    if (a.out.shape[i] != a.q.shape[i]) {
      fail("out has shape " + a.out.shape_string() + " but q has " + a.q.shape_string() + "; expected the same shape");
    }
  }
  const int64_t rows = a.q.shape[1];
  t.q_tensor_rows = rows;
  t.q_stride = {a.q.strides[0], a.q.strides[1], a.q.strides[2]};
  t.out_stride = {a.out.strides[0], a.out.strides[1], a.out.strides[2]};

  const TensorView& cu = o.cu_seqlens_q;
  if (cu.dtype != DType::i32) fail_type(std::string("options.cu_seqlens_q has dtype ") + dtype_name(cu.dtype) + "; expected int32");
  if (cu.device.type != DeviceType::cpu) {
    fail("options.cu_seqlens_q is on " + device_name(cu.device) + "; expected CPU memory (offsets are read on the host)");
  }
  if (cu.rank != 1 || cu.shape[0] != c.batch + 1) {
    fail("options.cu_seqlens_q has shape " + cu.shape_string() + "; expected [" + to_string(c.batch + 1) +
         "] (batch + 1, the cache's batch)");
  }
  if (cu.data == nullptr) fail("options.cu_seqlens_q has a null data pointer");
  check_element_aligned(cu, "options.cu_seqlens_q");
  if (cu.shape[0] > 1 && cu.strides[0] != 1) fail("options.cu_seqlens_q has stride " + to_string(cu.strides[0]) + "; expected 1");
  const auto* cq = static_cast<const int32_t*>(cu.data);
  if (cq[0] != 0) fail("options.cu_seqlens_q[0] is " + to_string(cq[0]) + "; expected 0");
  int64_t longest = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = int64_t(cq[b + 1]) - cq[b];
    if (n < 0) {
      fail("options.cu_seqlens_q is not non-decreasing: entry " + to_string(b + 1) + " is " + to_string(cq[b + 1]) +
           " after " + to_string(cq[b]));
    }
    if (n > c.length(b)) {
      fail("sequence " + to_string(b) + " has a chunk of " + to_string(n) + " queries (options.cu_seqlens_q) but holds " +
           to_string(c.length(b)) + " tokens in the cache; expected chunks no longer than the cached sequence (append first)");
    }
    longest = std::max(longest, n);
  }
  if (cq[c.batch] > rows) {
    fail("options.cu_seqlens_q ends at " + to_string(cq[c.batch]) + ", past q's " + to_string(rows) + " rows");
  }
  t.seq_q = longest;
  t.cu_seqlens_q = cq;

  if (!a.lse.empty()) {
    const TensorView& l = a.lse;
    if (l.data == nullptr && l.numel() > 0) fail("lse has a null data pointer");
    check_element_aligned(l, "lse");
    if (l.dtype != DType::f32) fail_type(std::string("lse has dtype ") + dtype_name(l.dtype) + "; expected float32");
    if (!(l.device == c.device)) fail("lse is on " + device_name(l.device) + " but the cache is on " + device_name(c.device));
    if (l.rank != 3 || l.shape[0] != 1 || l.shape[1] != t.q_heads || l.shape[2] != rows) {
      fail("lse has shape " + l.shape_string() + "; expected [1, " + to_string(t.q_heads) + ", " + to_string(rows) +
           "] ([1, q_heads, total_q], ragged)");
    }
    t.lse = static_cast<float*>(l.data);
    t.lse_stride = {l.strides[0], l.strides[1], l.strides[2]};
  }

  // Outputs must not meet what is read (validate_decode saw only stand-ins for q / out).
  const std::vector<std::pair<const TensorView*, std::string>> read = {
      {&a.q, "q"},
      {&a.cache.k, "cache.k"},
      {&a.cache.v, "cache.v"},
      {&o.sink_logits, "sink_logits"},
      {&a.cache.host.seq_lens, "cache.host.seq_lens"},
      {&a.cache.host.page_indptr, "cache.host.page_indptr"},
      {&a.cache.host.page_indices, "cache.host.page_indices"},
      {&a.cache.host.last_page_len, "cache.host.last_page_len"},
      {&a.cache.device.seq_lens, "cache.device.seq_lens"},
      {&a.cache.device.page_indptr, "cache.device.page_indptr"},
      {&a.cache.device.page_indices, "cache.device.page_indices"},
      {&a.cache.device.last_page_len, "cache.device.last_page_len"},
      {&cu, "options.cu_seqlens_q"}};
  for (auto [w, wn] : {std::pair{&a.out, "out"}, {&a.lse, "lse"}}) {
    for (const auto& [r, rn] : read) check_no_overlap(*w, wn, *r, rn.c_str());
  }
  check_no_overlap(a.out, "out", a.lse, "lse");
  return p;
}

}  // namespace flashlite
