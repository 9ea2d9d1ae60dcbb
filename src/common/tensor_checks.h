#pragma once
// Checks on tensor views shared by the forward and the KV-cache validators (src/dispatch.cpp, src/kv/*_validate.cpp).
#include <cstdint>
#include <string>

#include "common/problem.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"

namespace flashlite {

// A data pointer off its element size is a fault on the GPU (one that ends the CUDA context) and undefined behaviour
// on the CPU: an error naming the tensor instead.
inline void check_element_aligned(const TensorView& t, const std::string& name) {
  const size_t es = dtype_size(t.dtype);
  if (t.data != nullptr && es > 1 && reinterpret_cast<uintptr_t>(t.data) % es != 0) {
    throw Error(ErrorKind::invalid_value, name + "'s data pointer is not aligned to its " + std::to_string(es) +
                                              "-byte " + dtype_name(t.dtype) + " elements");
  }
}

// A tensor argument that is there: not a null view, no negative size, data behind any element, aligned.
inline void check_present(const TensorView& t, const std::string& name) {
  const auto fail = [](const std::string& msg) { throw Error(ErrorKind::invalid_value, msg); };
  if (t.rank == 0 && t.data == nullptr) fail(name + " is missing (null tensor)");
  if (t.data == nullptr && t.numel() > 0) fail(name + " has a null data pointer");
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) {
      fail(name + " has negative size " + std::to_string(t.shape[i]) + " in dimension " + std::to_string(i) +
           " (shape " + t.shape_string() + ")");
    }
  }
  check_element_aligned(t, name);
}

// An output whose elements share memory (stride 0 in a dimension of size > 1, e.g. an expanded or broadcast view)
// would be written by several threads at once and hold no defined result: an error naming the tensor.
inline void check_not_broadcast(const TensorView& t, const std::string& name) {
  if (t.numel() == 0) return;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1 && t.strides[i] == 0) {
      throw Error(ErrorKind::invalid_value, name + " has stride 0 in dimension " + std::to_string(i) + " (shape " +
                                                t.shape_string() + "): an output must not broadcast; expected a " +
                                                "writable view with distinct elements");
    }
  }
}

// Checks of the forward, backward and KV-cache validators (src/dispatch.cpp, src/backward/api.cpp,
// src/kv/kv_validate.cpp, src/kv/kv_prefill_validate.cpp); a namespace of their own so that a file's local helpers
// never meet them by accident (the KV validators take them in by using-declarations).
namespace checks {

[[noreturn]] inline void fail(const std::string& msg) { throw Error(ErrorKind::invalid_value, msg); }
[[noreturn]] inline void fail_type(const std::string& msg) { throw Error(ErrorKind::invalid_type, msg); }

inline bool is_float_dtype(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

inline void check_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.rank != rank) {
    fail(std::string(name) + " has rank " + std::to_string(t.rank) + " (shape " + t.shape_string() +
         "); expected rank " + std::to_string(rank) + " " + layout);
  }
}

inline void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what) {
  if (t.shape[dim] != expected) {
    fail(std::string(name) + " has " + what + " " + std::to_string(t.shape[dim]) + " (shape " + t.shape_string() +
         "); expected " + std::to_string(expected));
  }
}

inline RowStrides row_strides(const TensorView& t, const char* name) {
  // A tensor without elements is never read or written: any strides (numpy reports all-zero strides for them).
  if (t.shape[3] > 1 && t.strides[3] != 1 && t.numel() > 0) {
    fail(std::string(name) + " has head_dim stride " + std::to_string(t.strides[3]) + "; expected 1 (head_dim contiguous)");
  }
  return {t.strides[0], t.strides[1], t.strides[2]};
}

// The strides of a validated [batch, heads, seq] LSE view.
inline LseStrides lse_strides(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }

struct ByteRange {
  uintptr_t lo, hi;
};

inline ByteRange byte_range(const TensorView& t) {
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return {0, 0};
    const int64_t ext = (t.shape[i] - 1) * t.strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return {base + uintptr_t(lo * int64_t(dtype_size(t.dtype))), base + uintptr_t((hi + 1) * int64_t(dtype_size(t.dtype)))};
}

// Whether the address ranges of two views meet: both with data, on one device, neither empty, byte ranges
// intersecting. (Interleaving views may meet and still share no element: disjoint_in_rows.)
inline bool ranges_meet(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || !(a.device == b.device)) return false;
  const ByteRange ra = byte_range(a), rb = byte_range(b);
  if (ra.lo == ra.hi || rb.lo == rb.hi) return false;
  return ra.lo < rb.hi && rb.lo < ra.hi;
}

// Whether two [d0, d1, heads, head_dim] views whose address ranges interleave still share no element: both on one
// lattice of rows (the same row pitch P = strides[1], strides[0] multiples of it), each view's (heads, head_dim) block
// inside a row, at offsets within the row that do not meet. The column blocks of one fused QKV buffer (q, k and v
// of each token side by side in a row) are such views.
inline bool disjoint_in_rows(const TensorView& a, const TensorView& b) {
  if (a.rank != 4 || b.rank != 4 || dtype_size(a.dtype) != dtype_size(b.dtype)) return false;
  const int64_t P = a.strides[1], es = int64_t(dtype_size(a.dtype));
  if (P <= 0 || b.strides[1] != P) return false;
  int64_t w[2];
  for (int v = 0; v < 2; ++v) {
    const TensorView& t = v ? b : a;
    if (t.strides[0] < 0 || t.strides[0] % P != 0 || t.strides[2] < 0 || t.strides[3] < 0) return false;
    w[v] = (t.shape[2] - 1) * t.strides[2] + (t.shape[3] - 1) * t.strides[3] + 1;  // elements of a row the view uses
    if (w[v] > P) return false;
  }
  const int64_t bytes = int64_t(reinterpret_cast<uintptr_t>(b.data) - reinterpret_cast<uintptr_t>(a.data));
  if (bytes % es != 0) return false;
  const int64_t d = ((bytes / es) % P + P) % P;  // b's block starts d elements into a's row
  return w[0] <= d && d + w[1] <= P;
}

// The forward / backward form: an output a must not alias an input b (any meeting of address ranges).
inline void check_no_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  if (ranges_meet(a, b)) {
    fail(std::string(a_name) + " overlaps " + b_name + " in memory; the output must not alias an input");
  }
}

// The KV-cache form (append_kv, decode, prefill): a written buffer a and a buffer b read (or written) must be separate.
// With rows_may_interleave (append_kv, decode), views whose ranges interleave but whose elements do not meet
// (disjoint_in_rows: the column blocks of one fused QKV buffer) are separate; prefill passes false.
// (Names are C strings: this runs a dozen times per call, and a message is only built on failure.)
inline void check_separate(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name,
                           bool rows_may_interleave) {
  if (ranges_meet(a, b) && !(rows_may_interleave && disjoint_in_rows(a, b))) {
    fail(std::string(a_name) + " overlaps " + b_name + " in memory; expected separate buffers");
  }
}

inline void check_device(const TensorView& t, const char* name, Device expected) {
  if (!(t.device == expected)) {
    fail(std::string(name) + " is on " + device_name(t.device) + " but q is on " + device_name(expected) +
         "; all tensors must be on the same device");
  }
}

// The KV-cache form: t must be on the device of `whose` (e.g. "the cache", "cache.k").
inline void check_device(const TensorView& t, const char* name, Device expected, const char* whose) {
  if (!(t.device == expected)) {
    fail(std::string(name) + " is on " + device_name(t.device) + " but " + whose + " is on " + device_name(expected) +
         "; expected the same device");
  }
}

}  // namespace checks
}  // namespace flashlite
