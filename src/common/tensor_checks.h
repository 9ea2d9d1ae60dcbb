#pragma once
// Checks on tensor views shared by the forward and the KV-cache validators.
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

}  // namespace flashlite
