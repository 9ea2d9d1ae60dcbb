#pragma once
// Device load/store of the storage dtypes (fp32, fp16, bf16) as fp32, and the host switch that maps a runtime DType
// to the C++ element type of a templated launcher. Only these three types are ever instantiated.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "flashlite/errors.h"
#include "flashlite/tensor.h"

namespace flashlite::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Element i of a typed buffer as fp32 / stored from fp32 (round to nearest even).
template <class T>
__device__ __forceinline__ float load_f32(const T* p, int64_t i) { return to_float(p[i]); }
template <class T>
__device__ __forceinline__ void store_f32(T* p, int64_t i, float x) { p[i] = from_float<T>(x); }

// Calls f(T{}) with T the element type of `dtype` (float, __half, __nv_bfloat16). Host side.
template <class F>
decltype(auto) dispatch_float_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    default: break;
  }
  throw Error(ErrorKind::invalid_type, std::string("dtype ") + dtype_name(dtype) +
                                          " is not a floating-point storage type; expected float32, float16 or bfloat16");
}

}  // namespace flashlite::cuda
