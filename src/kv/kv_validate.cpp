// Validation of the KV-cache API (append_kv, decode, plan_decode): every argument is checked on the host before
// anything is launched or written; messages name the argument, the value and what was expected (flashlite::Error).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "common/tensor_checks.h"
#include "flashlite/errors.h"
#include "kv/kv_backends.h"

namespace flashlite {
namespace {

using std::to_string;

using checks::check_device;  // (the form naming whose device is expected)
using checks::check_dim;
using checks::check_rank;
using checks::fail;
using checks::fail_type;

void check_dtype(const TensorView& t, const std::string& name, DType expected) {
  if (t.dtype != expected) {
    fail_type(name + " has dtype " + dtype_name(t.dtype) + " but the cache has " + dtype_name(expected) +
              "; expected the cache's dtype");
  }
}

// a is written while b is read (or written): their address ranges must not meet (or, interleaving, their elements:
// checks::disjoint_in_rows; the engine's fused-QKV append_kv passes such column blocks).
void check_no_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  checks::check_separate(a, a_name, b, b_name, /*rows_may_interleave=*/true);
}

// An int32 index array of exactly (or, with at_least, at least) n entries, contiguous, on `dev`.
const int32_t* check_index(const TensorView& t, const std::string& name, int64_t n, bool at_least, Device dev,
                           const char* where) {
  check_present(t, name);
  if (t.dtype != DType::i32) fail_type(name + " has dtype " + dtype_name(t.dtype) + "; expected int32");
  if (!(t.device == dev)) fail(name + " is on " + device_name(t.device) + "; expected " + where);
  if (t.rank != 1) fail(name + " has rank " + to_string(t.rank) + " (shape " + t.shape_string() + "); expected rank 1");
  if (at_least ? t.shape[0] < n : t.shape[0] != n) {
    fail(name + " has " + to_string(t.shape[0]) + " entries; expected " + (at_least ? "at least " : "") + to_string(n));
  }
  if (t.shape[0] > 1 && t.strides[0] != 1) fail(name + " has stride " + to_string(t.strides[0]) + "; expected 1 (contiguous)");
  return static_cast<const int32_t*>(t.data);
}

KvCacheDesc validate_cache(const KvCacheView& c) {
  check_present(c.k, "cache.k");
  check_present(c.v, "cache.v");
  const bool paged = c.layout == KvLayout::paged;
  const char* layout = paged ? "[num_pages, page_size, kv_heads, head_dim]" : "[batch, max_len, kv_heads, head_dim]";
  check_rank(c.k, "cache.k", 4, layout);
  check_rank(c.v, "cache.v", 4, layout);
  if (!checks::is_float_dtype(c.k.dtype)) {
    fail_type(std::string("cache.k has dtype ") + dtype_name(c.k.dtype) + "; expected float16, bfloat16 or float32");
  }
  if (c.v.dtype != c.k.dtype) {
    fail_type(std::string("cache.v has dtype ") + dtype_name(c.v.dtype) + " but cache.k has " + dtype_name(c.k.dtype) +
              "; expected one dtype");
  }
  check_device(c.v, "cache.v", c.k.device, "cache.k");
  for (int i = 0; i < 4; ++i) check_dim(c.v, "cache.v", i, c.k.shape[i], "a dimension different from cache.k:");
  KvCacheDesc d;
  d.paged = paged;
  d.dtype = c.k.dtype;
  d.device = c.k.device;
  d.kv_heads = c.k.shape[2];
  d.head_dim = c.k.shape[3];
  d.capacity = c.k.shape[1];
  d.k = c.k.data;
  d.v = c.v.data;
  d.ks = checks::row_strides(c.k, "cache.k");
  d.vs = checks::row_strides(c.v, "cache.v");
  if (d.kv_heads < 1) fail("cache.k has " + to_string(d.kv_heads) + " kv heads; expected at least 1");
  if (d.head_dim < 1) fail("cache.k has head_dim " + to_string(d.head_dim) + "; expected at least 1");
  const bool on_cuda = d.device.type == DeviceType::cuda;
  const Device cpu = Device::cpu();
  if (!paged) {
    d.batch = c.host.seq_lens.rank == 1 ? c.host.seq_lens.shape[0] : -1;
    if (d.batch != c.k.shape[0]) {
      check_present(c.host.seq_lens, "cache.host.seq_lens");
      fail("cache.host.seq_lens has shape " + c.host.seq_lens.shape_string() + "; expected [" + to_string(c.k.shape[0]) +
           "] (one length per sequence of cache.k)");
    }
    d.seq_lens = check_index(c.host.seq_lens, "cache.host.seq_lens", d.batch, false, cpu, "CPU memory");
    for (int64_t b = 0; b < d.batch; ++b) {
      if (d.seq_lens[b] < 0 || d.seq_lens[b] > d.capacity) {
        fail("cache.host.seq_lens[" + to_string(b) + "] = " + to_string(d.seq_lens[b]) +
             " overflows the cache: expected 0..max_len = " + to_string(d.capacity) + " (cache.k.shape[1])");
      }
    }
    d.k_seq_lens = d.seq_lens;
    if (on_cuda) {
      d.k_seq_lens = check_index(c.device.seq_lens, "cache.device.seq_lens", d.batch, false, d.device, "on the cache's device");
    }
  } else {
    d.num_pages = c.k.shape[0];
    if (d.capacity < 16 || d.capacity > 256) {
      fail("cache.k has page_size " + to_string(d.capacity) + " (shape " + c.k.shape_string() + "); expected 16..256");
    }
    if (c.host.page_indptr.rank != 1 || c.host.page_indptr.shape[0] < 1) {
      check_present(c.host.page_indptr, "cache.host.page_indptr");
      fail("cache.host.page_indptr has shape " + c.host.page_indptr.shape_string() + "; expected [batch + 1]");
    }
    d.batch = c.host.page_indptr.shape[0] - 1;
    d.indptr = check_index(c.host.page_indptr, "cache.host.page_indptr", d.batch + 1, false, cpu, "CPU memory");
    d.last_page_len = check_index(c.host.last_page_len, "cache.host.last_page_len", d.batch, false, cpu, "CPU memory");
    check_present(c.host.page_indices, "cache.host.page_indices");
    const int64_t n_idx = c.host.page_indices.rank == 1 ? c.host.page_indices.shape[0] : 0;
    d.indices = check_index(c.host.page_indices, "cache.host.page_indices", 0, true, cpu, "CPU memory");
    if (d.indptr[0] < 0) fail("cache.host.page_indptr[0] = " + to_string(d.indptr[0]) + "; expected >= 0");
    for (int64_t b = 0; b < d.batch; ++b) {
      if (d.indptr[b + 1] < d.indptr[b]) {
        fail("cache.host.page_indptr is not non-decreasing: entry " + to_string(b + 1) + " = " + to_string(d.indptr[b + 1]) +
             " after " + to_string(d.indptr[b]));
      }
    }
    if (d.indptr[d.batch] > n_idx) {
      fail("cache.host.page_indptr[" + to_string(d.batch) + "] = " + to_string(d.indptr[d.batch]) +
           " points past cache.host.page_indices (" + to_string(n_idx) + " entries)");
    }
    // Every page id in range: a branch-free min / max pass (vectorised; this walk is the host cost of a paged call
    // that grows with the cache), and only when it fails the search for the first bad entry, for the message.
    int32_t lo = 0, hi = 0;
    if (d.indptr[d.batch] > d.indptr[0]) lo = hi = d.indices[d.indptr[0]];
    for (int64_t i = d.indptr[0]; i < d.indptr[d.batch]; ++i) {
      lo = std::min(lo, d.indices[i]);
      hi = std::max(hi, d.indices[i]);
    }
    if (lo < 0 || hi >= d.num_pages) {
      for (int64_t i = d.indptr[0]; i < d.indptr[d.batch]; ++i) {
        if (d.indices[i] < 0 || d.indices[i] >= d.num_pages) {
          fail("cache.host.page_indices[" + to_string(i) + "] = " + to_string(d.indices[i]) + " is a bad page id; expected 0.." +
               to_string(d.num_pages - 1) + " (cache.k has " + to_string(d.num_pages) + " pages)");
        }
      }
    }
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t pages = int64_t(d.indptr[b + 1]) - d.indptr[b];
      const int32_t last = d.last_page_len[b];
      if (pages == 0 ? last != 0 : (last < 1 || last > d.capacity)) {
        fail("cache.host.last_page_len[" + to_string(b) + "] = " + to_string(last) + "; expected " +
             (pages == 0 ? std::string("0 (the sequence has no pages)") : "1..page_size = " + to_string(d.capacity)));
      }
    }
    d.k_indptr = d.indptr;
    d.k_indices = d.indices;
    d.k_last_page_len = d.last_page_len;
    if (on_cuda) {
      d.k_indptr = check_index(c.device.page_indptr, "cache.device.page_indptr", d.batch + 1, false, d.device, "on the cache's device");
      d.k_indices = check_index(c.device.page_indices, "cache.device.page_indices", d.indptr[d.batch], true, d.device,
                                "on the cache's device");
      d.k_last_page_len = check_index(c.device.last_page_len, "cache.device.last_page_len", d.batch, false, d.device,
                                      "on the cache's device");
    }
  }
  for (int64_t b = 0; b < d.batch; ++b) d.max_length = std::max(d.max_length, d.length(b));
  if (d.max_length > (int64_t(1) << 30)) fail("a sequence holds " + to_string(d.max_length) + " tokens; expected at most 2^30");
  return d;
}

// The index arrays of a cache (the kernels read them while writing the cache / outputs).
std::array<std::pair<const TensorView*, const char*>, 8> index_views(const KvCacheView& c) {
  return {{{&c.host.seq_lens, "cache.host.seq_lens"},     {&c.host.page_indptr, "cache.host.page_indptr"},
          {&c.host.page_indices, "cache.host.page_indices"}, {&c.host.last_page_len, "cache.host.last_page_len"},
          {&c.device.seq_lens, "cache.device.seq_lens"}, {&c.device.page_indptr, "cache.device.page_indptr"},
          {&c.device.page_indices, "cache.device.page_indices"}, {&c.device.last_page_len, "cache.device.last_page_len"}}};
}

void check_rope(const RopeOptions& r, int64_t head_dim) {
  if (!r.enabled) return;
  if (!(std::isfinite(r.theta) && r.theta > 0)) fail("rope.theta is " + to_string(r.theta) + "; expected a finite number > 0");
  if (head_dim % 2 != 0) fail("head_dim " + to_string(head_dim) + " is odd; rotary embedding needs an even head_dim");
  if (!(std::isfinite(r.linear_factor) && r.linear_factor > 0)) {
    fail("rope.linear_factor is " + to_string(r.linear_factor) + "; expected a finite number > 0");
  }
  if (r.llama3) {
    if (!(std::isfinite(r.llama3_factor) && r.llama3_factor > 0)) {
      fail("rope.llama3_factor is " + to_string(r.llama3_factor) + "; expected a finite number > 0");
    }
    if (!(r.llama3_low_freq_factor > 0 && r.llama3_high_freq_factor > r.llama3_low_freq_factor &&
          std::isfinite(r.llama3_high_freq_factor))) {
      fail("rope.llama3_low_freq_factor / high_freq_factor are " + to_string(r.llama3_low_freq_factor) + " / " +
           to_string(r.llama3_high_freq_factor) + "; expected 0 < low < high");
    }
    if (!(std::isfinite(r.llama3_original_max_position) && r.llama3_original_max_position > 0)) {
      fail("rope.llama3_original_max_position is " + to_string(r.llama3_original_max_position) + "; expected > 0");
    }
  }
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.rank != b.rank || a.dtype != b.dtype || !(a.device == b.device)) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i] || a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

}  // namespace

AppendProblem validate_append(const AppendArgs& a) {
  AppendProblem p;
  p.cache = validate_cache(a.cache);
  check_not_broadcast(a.cache.k, "cache.k");  // written here
  check_not_broadcast(a.cache.v, "cache.v");
  if (!a.q_out.empty()) check_not_broadcast(a.q_out, "q_out");
  const KvCacheDesc& c = p.cache;
  const char* layout = "[batch, n, kv_heads, head_dim]";
  check_present(a.k, "k");
  check_present(a.v, "v");
  check_rank(a.k, "k", 4, layout);
  check_rank(a.v, "v", 4, layout);
  for (auto [t, name] : {std::pair{&a.k, "k"}, {&a.v, "v"}}) {
    check_dtype(*t, name, c.dtype);
    check_device(*t, name, c.device, "the cache");
    check_dim(*t, name, 0, c.batch, "batch");
    check_dim(*t, name, 2, c.kv_heads, "kv_heads");
    check_dim(*t, name, 3, c.head_dim, "head_dim");
  }
  check_dim(a.v, "v", 1, a.k.shape[1], "n (new tokens; k has a different n)");
  p.n_new = a.k.shape[1];
  p.k = a.k.data;
  p.v = a.v.data;
  p.k_st = checks::row_strides(a.k, "k");
  p.v_st = checks::row_strides(a.v, "v");
  check_rope(a.rope, c.head_dim);
  p.rope.enabled = a.rope.enabled;
  p.rope.interleaved = a.rope.layout == RopeLayout::interleaved;
  p.rope.options = a.rope;

  if (!a.q.empty()) {
    if (!a.rope.enabled) fail("q is given but rope.enabled is false; q is only passed to be rotated");
    check_present(a.q, "q");
    check_rank(a.q, "q", 4, "[batch, n, q_heads, head_dim]");
    check_dtype(a.q, "q", c.dtype);
    check_device(a.q, "q", c.device, "the cache");
    check_dim(a.q, "q", 0, c.batch, "batch");
    check_dim(a.q, "q", 1, p.n_new, "n (new tokens, as k)");
    check_dim(a.q, "q", 3, c.head_dim, "head_dim");
    if (a.q.shape[2] < 1) fail("q has " + to_string(a.q.shape[2]) + " heads; expected at least 1");
    if (a.q_out.empty()) fail("q_out is missing; expected where the rotated q goes (q itself for in place)");
    check_present(a.q_out, "q_out");
    check_rank(a.q_out, "q_out", 4, "[batch, n, q_heads, head_dim]");
    check_dtype(a.q_out, "q_out", c.dtype);
    check_device(a.q_out, "q_out", c.device, "the cache");
    for (int i = 0; i < 4; ++i) check_dim(a.q_out, "q_out", i, a.q.shape[i], "a dimension different from q:");
    if (!same_view(a.q, a.q_out)) check_no_overlap(a.q_out, "q_out", a.q, "q (pass q itself as q_out for in place)");
    p.q = a.q.data;
    p.q_out = a.q_out.data;
    p.q_st = checks::row_strides(a.q, "q");
    p.qo_st = checks::row_strides(a.q_out, "q_out");
    p.q_heads = a.q.shape[2];
  } else if (!a.q_out.empty()) {
    fail("q_out is given without q");
  }

  // Written buffers must not meet anything read or written.
  // (cache.k and cache.v may interleave, e.g. one [pages, 2, page_size, heads, D] buffer, but one address for both
  // means the V rows overwrite the K rows.)
  if (a.cache.k.data == a.cache.v.data && a.cache.k.numel() > 0) {
    fail("cache.v has the same data pointer as cache.k; append_kv writes both, expected separate K and V memory");
  }
  for (auto [w, wn] : {std::pair{&a.cache.k, "cache.k"}, {&a.cache.v, "cache.v"}, {&a.q_out, "q_out"}}) {
    check_no_overlap(*w, wn, a.k, "k");
    check_no_overlap(*w, wn, a.v, "v");
    for (const auto& [t, tn] : index_views(a.cache)) check_no_overlap(*w, wn, *t, tn);
  }
  check_no_overlap(a.q_out, "q_out", a.cache.k, "cache.k");
  check_no_overlap(a.q_out, "q_out", a.cache.v, "cache.v");
  check_no_overlap(a.cache.k, "cache.k", a.q, "q");
  check_no_overlap(a.cache.v, "cache.v", a.q, "q");

  // Lengths already include the new tokens: each sequence must hold at least n, inside max_len / the pages given.
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t len = c.length(b);
    if (len < p.n_new) {
      if (!c.paged) {
        fail("appending " + to_string(p.n_new) + " tokens to sequence " + to_string(b) + " but cache.host.seq_lens[" +
             to_string(b) + "] = " + to_string(len) + "; expected lengths that include the new tokens (>= " +
             to_string(p.n_new) + ")");
      }
      fail("appending " + to_string(p.n_new) + " tokens to sequence " + to_string(b) + " past the pages given: its " +
           to_string(int64_t(c.indptr[b + 1]) - c.indptr[b]) + " pages with last_page_len " + to_string(c.last_page_len[b]) +
           " hold " + to_string(len) + " tokens; expected a page table that already covers the new tokens");
    }
  }
  if (c.paged && p.n_new > 0) {
    // A cache position written through two page-table entries would race (and corrupt). A page may appear in several
    // sequences (a shared prefix, or the engine's one row per position) as long as they write different positions
    // of it: the written ranges of each page, sorted, must not overlap. Within one sequence a written page must
    // appear once, or the append overwrites the sequence's own earlier tokens.
    struct Written {
      int64_t page, lo, hi, seq, entry;  // positions lo..hi of the page, through page_indices[entry]
    };
    std::vector<Written> w;
    std::vector<std::pair<int64_t, int64_t>> mine;  // (page, entry) that sequence b writes, sorted: one walk of its
                                                    // entries finds a written page listed twice
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t len = c.length(b), from = len - p.n_new;
      mine.clear();
      for (int64_t pg = from / c.capacity; pg <= (len - 1) / c.capacity; ++pg) {
        const int64_t entry = c.indptr[b] + pg, id = c.indices[entry];
        const int64_t lo = std::max(from, pg * c.capacity) - pg * c.capacity;
        mine.push_back({id, entry});
        w.push_back({id, lo, std::min(len - 1, pg * c.capacity + c.capacity - 1) - pg * c.capacity, b, entry});
      }
      std::sort(mine.begin(), mine.end());
      for (int64_t e = c.indptr[b]; e < c.indptr[b + 1]; ++e) {
        const int64_t id = c.indices[e];
        for (auto it = std::lower_bound(mine.begin(), mine.end(), std::pair<int64_t, int64_t>{id, INT64_MIN});
             it != mine.end() && it->first == id; ++it) {
          if (it->second != e) {
            fail("page_indices[" + to_string(std::min(e, it->second)) + "] and [" + to_string(std::max(e, it->second)) +
                 "] of sequence " + to_string(b) + " are both page " + to_string(id) + ", which it appends to; "
                 "expected the pages of a sequence to be distinct (the append would overwrite its own tokens)");
          }
        }
      }
    }
    std::sort(w.begin(), w.end(), [](const Written& x, const Written& y) {
      return std::tie(x.page, x.lo, x.seq) < std::tie(y.page, y.lo, y.seq);
    });
    for (size_t i = 1, reach = 0; i < w.size(); ++i) {  // reach: the entry of this page reaching furthest so far
      if (w[i].page != w[i - 1].page) {
        reach = i;
        continue;
      }
      if (w[i].lo <= w[reach].hi) {
        fail("positions " + to_string(w[i].lo) + ".." + to_string(std::min(w[i].hi, w[reach].hi)) + " of page " +
             to_string(w[i].page) + " are written by sequences " + to_string(w[reach].seq) + " and " +
             to_string(w[i].seq) + " in one append (page_indices[" + to_string(w[reach].entry) + "] and [" +
             to_string(w[i].entry) + "]); expected each cache position written once");
      }
      if (w[i].hi > w[reach].hi) reach = i;
    }
  }
  return p;
}

DecodeProblem validate_decode(const DecodeArgs& a, bool stand_ins) {
  DecodeProblem p;
  p.cache = validate_cache(a.cache);
  const KvCacheDesc& c = p.cache;
  check_present(a.q, "q");
  check_present(a.out, "out");
  check_rank(a.q, "q", 4, "[batch, q_len, q_heads, head_dim]");
  check_rank(a.out, "out", 4, "[batch, q_len, q_heads, head_dim]");
  if (!stand_ins) check_not_broadcast(a.out, "out");
  check_dtype(a.q, "q", c.dtype);
  check_dtype(a.out, "out", c.dtype);
  check_device(a.q, "q", c.device, "the cache");
  check_device(a.out, "out", c.device, "the cache");
  check_dim(a.q, "q", 0, c.batch, "batch");
  check_dim(a.q, "q", 3, c.head_dim, "head_dim");
  for (int i = 0; i < 4; ++i) check_dim(a.out, "out", i, a.q.shape[i], i == 1 ? "q_len" : i == 2 ? "q_heads" : "a dimension different from q:");
  p.q_len = a.q.shape[1];
  p.q_heads = a.q.shape[2];
  if (p.q_len < 1) fail("q has q_len " + to_string(p.q_len) + "; expected at least 1");
  if (p.q_heads < 1) fail("q has " + to_string(p.q_heads) + " heads; expected at least 1");
  if (p.q_heads % c.kv_heads != 0) {
    fail("q_heads " + to_string(p.q_heads) + " is not divisible by the cache's kv_heads " + to_string(c.kv_heads) +
         "; GQA needs q_heads to be a multiple of kv_heads");
  }
  p.q = a.q.data;
  p.out = a.out.data;
  p.q_st = checks::row_strides(a.q, "q");
  p.o_st = checks::row_strides(a.out, "out");

  const AttentionOptions& o = a.options;
  if (!o.cu_seqlens_q.empty() || !o.cu_seqlens_k.empty()) {
    fail("options.cu_seqlens_q / cu_seqlens_k are given; decode takes the lengths from the cache, expected them empty");
  }
  if (o.window_left < -1) fail("window_left is " + to_string(o.window_left) + "; expected -1 (unlimited) or >= 0");
  if (o.window_right < -1) fail("window_right is " + to_string(o.window_right) + "; expected -1 (unlimited) or >= 0");
  if (o.sink_tokens < 0) fail("sink_tokens is " + to_string(o.sink_tokens) + "; expected >= 0");
  if (o.scale && !std::isfinite(*o.scale)) fail("scale is " + to_string(*o.scale) + "; expected a finite number");
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    fail("softcap is " + to_string(o.softcap) + "; expected a finite number >= 0 (0 = off)");
  }
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(c.head_dim));
  p.softcap = o.softcap;
  p.mask = {o.causal, o.window_left, o.window_right, o.sink_tokens};
  if (!o.sink_logits.empty()) {
    check_present(o.sink_logits, "sink_logits");
    if (o.sink_logits.dtype != DType::f32) {
      fail_type(std::string("sink_logits has dtype ") + dtype_name(o.sink_logits.dtype) + "; expected float32");
    }
    check_device(o.sink_logits, "sink_logits", c.device, "the cache");
    if (o.sink_logits.rank != 1 || o.sink_logits.shape[0] != p.q_heads) {
      fail("sink_logits has shape " + o.sink_logits.shape_string() + "; expected [" + to_string(p.q_heads) + "] (one per q head)");
    }
    if (p.q_heads > 1 && o.sink_logits.strides[0] != 1) fail("sink_logits must be contiguous (stride 1)");
    p.sink_logits = static_cast<const float*>(o.sink_logits.data);
  }
  if (!a.lse.empty()) {
    check_present(a.lse, "lse");
    if (a.lse.dtype != DType::f32) fail_type(std::string("lse has dtype ") + dtype_name(a.lse.dtype) + "; expected float32");
    check_device(a.lse, "lse", c.device, "the cache");
    check_rank(a.lse, "lse", 3, "[batch, q_heads, q_len]");
    check_not_broadcast(a.lse, "lse");
    check_dim(a.lse, "lse", 0, c.batch, "batch");
    check_dim(a.lse, "lse", 1, p.q_heads, "q_heads");
    check_dim(a.lse, "lse", 2, p.q_len, "q_len");
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_st = checks::lse_strides(a.lse);
  }
  // Outputs must not meet the inputs (or each other).
  if (stand_ins) return p;
  for (auto [w, wn] : {std::pair{&a.out, "out"}, {&a.lse, "lse"}}) {
    check_no_overlap(*w, wn, a.q, "q");
    check_no_overlap(*w, wn, a.cache.k, "cache.k");
    check_no_overlap(*w, wn, a.cache.v, "cache.v");
    check_no_overlap(*w, wn, o.sink_logits, "sink_logits");
    for (const auto& [t, tn] : index_views(a.cache)) check_no_overlap(*w, wn, *t, tn);
  }
  check_no_overlap(a.out, "out", a.lse, "lse");
  return p;
}

}  // namespace flashlite
