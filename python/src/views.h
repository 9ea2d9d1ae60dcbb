#pragma once
// Shared by the nanobind bridge's files: Python arrays (DLPack / buffer protocol) viewed as flashlite TensorViews.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <string>

#include "flashlite/attention.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"
#include "bridge_common.h"

namespace flashlite::py {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;  // read-only views are fine for inputs
using OutArray = nb::ndarray<>;

inline DType to_dtype(nb::dlpack::dtype dt, const char* name) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == uint8_t(Code::Float) && dt.bits == 32) return DType::f32;
    if (dt.code == uint8_t(Code::Float) && dt.bits == 16) return DType::f16;
    if (dt.code == uint8_t(Code::Bfloat) && dt.bits == 16) return DType::bf16;
    if (dt.code == uint8_t(Code::Int) && dt.bits == 32) return DType::i32;
  }
  const char* kind = dt.code == uint8_t(Code::Int)      ? "int"
                     : dt.code == uint8_t(Code::UInt)   ? "uint"
                     : dt.code == uint8_t(Code::Float)  ? "float"
                     : dt.code == uint8_t(Code::Bfloat) ? "bfloat"
                     : dt.code == uint8_t(Code::Bool)   ? "bool"
                                                        : "complex";
  throw dtype_error(name, kind + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : ""));
}

template <class... Ts>
inline TensorView to_view(const nb::ndarray<Ts...>& a, const char* name) {
  TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value) {
    t.device = Device::cpu();
  } else if (dev == nb::device::cuda::value) {
    t.device = Device::cuda(a.device_id());
  } else {
    throw device_error(name, "DLPack device type " + std::to_string(dev));
  }
  check_rank(int64_t(a.ndim()), name);
  t.rank = int(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[size_t(i)] = int64_t(a.shape(size_t(i)));
    t.strides[size_t(i)] = int64_t(a.stride(size_t(i)));
  }
  return t;
}

template <class A>
inline TensorView opt_view(const std::optional<A>& a, const char* name) {
  return a ? to_view(*a, name) : TensorView{};
}

}  // namespace flashlite::py
