#pragma once
// Checks on tensor views shared by the forward and the KV-cache validators (src/dispatch.cpp, src/kv/*_validate.cpp).
#include <cstdint>
#include <string>

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

}  // namespace flashlite
