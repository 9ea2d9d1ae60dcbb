// flashlite._C's KV-cache functions: append_kv, decode, prefill, decode_kernel_name (include/flashlite/kv_cache.h). The cache
// arrives as one tuple (layout, k, v, then the host and the device index arrays, each None or an array), built by
// flashlite/kv.py from a KVCache; the other arguments mirror the C++ structs field by field.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashlite/attention.h"
#include "flashlite/errors.h"
#include "flashlite/kv_cache.h"
#include "views.h"

namespace flashlite::py {

namespace {

// Entry i of the cache tuple (None: absent). Only append_kv writes the cache (`written`: its k and v); everything
// else is read, so read-only arrays are fine there. (A failed nb::cast gave Python nothing but "std::bad_cast".)
TensorView item_view(const nb::tuple& t, size_t i, const char* name, bool written = false) {
  nb::handle h = t[i];
  if (h.is_none()) return TensorView{};
  // One successful import per entry: a DLPack capsule (torch) is consumed by it.
  if (OutArray w; written && nb::try_cast(h, w)) return to_view(w, name);
  InArray a;
  if (!nb::try_cast(h, a)) {
    throw Error(ErrorKind::invalid_type, std::string(name) + " is a " + nb::inst_name(h).c_str() +
                                             "; expected an array (torch tensor or numpy array)");
  }
  if (written) {
    throw Error(ErrorKind::invalid_value, std::string(name) + " is read-only; append_kv writes the cache, expected a writable array");
  }
  return to_view(a, name);
}

KvCacheView make_cache(const nb::tuple& c, bool written = false) {
  if (c.size() != 11) throw Error(ErrorKind::invalid_value, "internal: the cache tuple must have 11 entries");
  KvCacheView v;
  const std::string layout = nb::cast<std::string>(c[0]);
  if (layout == "contiguous") v.layout = KvLayout::contiguous;
  else if (layout == "paged") v.layout = KvLayout::paged;
  else throw Error(ErrorKind::invalid_value, "cache layout '" + layout + "'; expected contiguous or paged");
  v.k = item_view(c, 1, "cache k", written);
  v.v = item_view(c, 2, "cache v", written);
  v.host.seq_lens = item_view(c, 3, "seq_lens");
  v.host.page_indptr = item_view(c, 4, "page_indptr");
  v.host.page_indices = item_view(c, 5, "page_indices");
  v.host.last_page_len = item_view(c, 6, "last_page_len");
  v.device.seq_lens = item_view(c, 7, "seq_lens (device copy)");
  v.device.page_indptr = item_view(c, 8, "page_indptr (device copy)");
  v.device.page_indices = item_view(c, 9, "page_indices (device copy)");
  v.device.last_page_len = item_view(c, 10, "last_page_len (device copy)");
  return v;
}

void py_append_kv(const nb::tuple& cache, const InArray& k, const InArray& v, const std::optional<InArray>& q,
                  const std::optional<OutArray>& q_out, bool rope, double theta, const std::string& rope_layout,
                  bool llama3, double factor, double low_freq_factor, double high_freq_factor,
                  double original_max_position, const std::string& backend, uintptr_t stream) {
  AppendArgs a;
  a.cache = make_cache(cache, true);
  a.k = to_view(k, "k");
  a.v = to_view(v, "v");
  a.q = opt_view(q, "q");
  a.q_out = opt_view(q_out, "q_out");
  a.rope.enabled = rope;
  a.rope.theta = theta;
  if (rope_layout == "half_split") a.rope.layout = RopeLayout::half_split;
  else if (rope_layout == "interleaved") a.rope.layout = RopeLayout::interleaved;
  else throw Error(ErrorKind::invalid_value, "rope layout '" + rope_layout + "'; expected half_split or interleaved");
  a.rope.llama3 = llama3;
  a.rope.llama3_factor = factor;
  a.rope.llama3_low_freq_factor = low_freq_factor;
  a.rope.llama3_high_freq_factor = high_freq_factor;
  a.rope.llama3_original_max_position = original_max_position;
  a.backend = parse_backend(backend);
  a.stream = reinterpret_cast<void*>(stream);
  nb::gil_scoped_release release;
  append_kv(a);
}

DecodeArgs make_decode(const InArray& q, const nb::tuple& cache, const OutArray& out, const std::optional<OutArray>& lse,
                       const std::optional<InArray>& sink_logits, bool causal, std::optional<double> scale,
                       int window_left, int window_right, int sink_tokens, double softcap, const std::string& backend,
                       uintptr_t stream) {
  DecodeArgs a;
  a.q = to_view(q, "q");
  a.cache = make_cache(cache);
  a.out = to_view(out, "out");
  a.lse = opt_view(lse, "lse");
  a.options = mask_options(causal, scale, window_left, window_right, sink_tokens, softcap);
  a.options.sink_logits = opt_view(sink_logits, "sink_logits");
  a.backend = parse_backend(backend);
  a.stream = reinterpret_cast<void*>(stream);
  return a;
}

#define FL_KV_DECODE_PARAMS                                                                                       \
  const InArray &q, const nb::tuple &cache, const OutArray &out, const std::optional<OutArray> &lse,             \
      const std::optional<InArray> &sink_logits, bool causal, std::optional<double> scale, int window_left,       \
      int window_right, int sink_tokens, double softcap, const std::string &backend, uintptr_t stream
#define FL_KV_DECODE_ARGS \
  q, cache, out, lse, sink_logits, causal, scale, window_left, window_right, sink_tokens, softcap, backend, stream
#define FL_KV_DECODE_NAMES                                                                                      \
  nb::arg("q"), nb::arg("cache"), nb::arg("out"), nb::arg("lse").none(), nb::arg("sink_logits").none(),          \
      nb::arg("causal"), nb::arg("scale").none(), nb::arg("window_left"), nb::arg("window_right"),             \
      nb::arg("sink_tokens"), nb::arg("softcap"), nb::arg("backend"), nb::arg("stream")

// Plans (max_kv_len: the bound the plan serves, -1 = the longest sequence now), takes the split workspace from
// `allocate(nbytes)` when the plan needs one (torch's caching allocator: graph-capturable), then runs.
void py_decode(FL_KV_DECODE_PARAMS, int64_t max_kv_len, int num_splits, nb::object allocate) {
  DecodeArgs a = make_decode(FL_KV_DECODE_ARGS);
  const DecodePlan plan = plan_decode(a, max_kv_len, {num_splits});
  std::optional<OutArray> ws;  // keeps the workspace alive until the launches are queued
  if (plan.workspace_bytes > 0 && !allocate.is_none()) {
    ws = nb::cast<OutArray>(allocate(plan.workspace_bytes));
    if (ws->device_type() != nb::device::cuda::value || ws->device_id() != a.q.device.index)
      throw Error(ErrorKind::invalid_value, "the allocated decode workspace is not on " + device_name(a.q.device));
    a.workspace = ws->data();
    a.workspace_bytes = ws->nbytes();
  }
  a.plan = &plan;
  nb::gil_scoped_release release;
  decode(a);
}

void py_prefill(FL_KV_DECODE_PARAMS, const std::optional<InArray>& cu_seqlens_q) {
  const DecodeArgs d = make_decode(FL_KV_DECODE_ARGS);
  PrefillArgs a;
  a.q = d.q;
  a.cache = d.cache;
  a.out = d.out;
  a.lse = d.lse;
  a.options = d.options;
  a.options.cu_seqlens_q = opt_view(cu_seqlens_q, "cu_seqlens_q");
  a.backend = d.backend;
  a.stream = d.stream;
  nb::gil_scoped_release release;
  prefill(a);
}

}  // namespace

void bind_kv(nb::module_& m) {
  m.def("append_kv", &py_append_kv, nb::arg("cache"), nb::arg("k"), nb::arg("v"), nb::arg("q").none(),
        nb::arg("q_out").none(), nb::arg("rope"), nb::arg("theta"), nb::arg("rope_layout"), nb::arg("llama3"),
        nb::arg("factor"), nb::arg("low_freq_factor"), nb::arg("high_freq_factor"), nb::arg("original_max_position"),
        nb::arg("backend"), nb::arg("stream"),
        "Validates and runs flashlite::append_kv (writes the cache in place; nothing on error).");
  m.def("decode", &py_decode, FL_KV_DECODE_NAMES, nb::arg("max_kv_len") = -1, nb::arg("num_splits") = 0,
        nb::arg("allocate").none() = nb::none(), "Validates, plans and runs flashlite::decode in place.");
  m.def("prefill", &py_prefill, FL_KV_DECODE_NAMES, nb::arg("cu_seqlens_q").none() = nb::none(),
        "Validates and runs flashlite::prefill in place (a chunk of queries per sequence over the cache).");
  m.def(
      "decode_kernel_name",
      [](FL_KV_DECODE_PARAMS) { return decode_kernel_name(make_decode(FL_KV_DECODE_ARGS)); }, FL_KV_DECODE_NAMES,
      "Which kernel decode() would run for these arguments. Validates the arguments.");
  m.def(
      "rope_inv_freq",
      [](double theta, bool llama3, double factor, double low, double high, double orig, int64_t head_dim, int64_t c) {
        RopeOptions r;
        r.enabled = true;
        r.theta = theta;
        r.llama3 = llama3;
        r.llama3_factor = factor;
        r.llama3_low_freq_factor = low;
        r.llama3_high_freq_factor = high;
        r.llama3_original_max_position = orig;
        return rope_inv_freq(r, head_dim, c);
      },
      nb::arg("theta"), nb::arg("llama3"), nb::arg("factor"), nb::arg("low_freq_factor"), nb::arg("high_freq_factor"),
      nb::arg("original_max_position"), nb::arg("head_dim"), nb::arg("c"),
      "inv_freq(c) of flashlite's RoPE rule (float64).");
}

}  // namespace flashlite::py
