#pragma once
// bf16 dot products of the engine's GEMVs (gemv.cu, gemv_stream.cu): 8 bf16 pairs packed in a uint4, fp32 math.
#include <cstdint>

namespace flashlite::engine::cuda_ops {

// A bf16 pair in a 32-bit word: element 2i in the low half. A bf16 is the top half of the fp32 with the same value.
__device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc + w . x over the 8 pairs, one fma each.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(lo(w.x), lo(x.x), acc);
  acc = fmaf(hi(w.x), hi(x.x), acc);
  acc = fmaf(lo(w.y), lo(x.y), acc);
  acc = fmaf(hi(w.y), hi(x.y), acc);
  acc = fmaf(lo(w.z), lo(x.z), acc);
  acc = fmaf(hi(w.z), hi(x.z), acc);
  acc = fmaf(lo(w.w), lo(x.w), acc);
  acc = fmaf(hi(w.w), hi(x.w), acc);
  return acc;
}
// w . x from the first product (the streamed GEMV adds each 8-pair dot into its lane sum).
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  return dot8(w, x, 0.f);
}

}  // namespace flashlite::engine::cuda_ops
