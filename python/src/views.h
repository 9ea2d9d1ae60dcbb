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
  throw Error(ErrorKind::invalid_type, std::string(name) + " has dtype " + kind + std::to_string(dt.bits) +
                                           (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : std::string()) +
                                           "; expected float32, float16 or bfloat16 (int32 for cu_seqlens)");
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
    throw Error(ErrorKind::invalid_value, std::string(name) + " is on DLPack device type " + std::to_string(dev) +
                                              "; expected CPU or CUDA memory");
  }
  if (a.ndim() > size_t(kMaxRank)) {
    throw Error(ErrorKind::invalid_value, std::string(name) + " has rank " + std::to_string(a.ndim()) +
                                              "; expected at most " + std::to_string(kMaxRank));
  }
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

// The scale and mask arguments every attention entry point takes from Python (tensor options are set by the caller).
inline AttentionOptions mask_options(bool causal, std::optional<double> scale, int window_left, int window_right,
                                     int sink_tokens, double softcap) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale;
  o.window_left = window_left;
  o.window_right = window_right;
  o.sink_tokens = sink_tokens;
  o.softcap = softcap;
  return o;
}

}  // namespace flashlite::py
