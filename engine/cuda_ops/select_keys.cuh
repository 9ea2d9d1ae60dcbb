#pragma once
// The 64-bit argmax keys shared by the device selection (select.cu) and the LM-head GEMV's fused argmax (gemv.cu):
// unique per element, larger for a larger logit and, among equal logits, for the lower index.
#include <cstdint>

namespace flashlite::engine::cuda_ops {

// Monotone map of floats to unsigned ints (larger float -> larger key); -0 is folded onto +0 first, as the host's
// `>` comparison treats them as equal. Every NaN gets the highest key (above +inf), so a row holding one selects it
// and the host refuses the row (argmax_key_problem in select.h), as the host sampler refuses NaN rows; the top-k
// candidates carry it to the sampler's own check.
__device__ __forceinline__ uint32_t ordered_key(float v) {
  if (v != v) return 0xffffffffu;
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Value first, then the lower index.
__device__ __forceinline__ uint64_t argmax_key(float v, int i) {
  return (uint64_t(ordered_key(v)) << 32) | uint32_t(~uint32_t(i));
}

}  // namespace flashlite::engine::cuda_ops
