#pragma once
// The rotary embedding on the device (flashlite/rope.h has the rule, the pairs and the rotation): the cos / sin of a
// position's angle, computed in float64 (so position 65536 is as exact as 0) and rounded once to float, and the
// rotation of one element of a pair in fp32. The library's append kernel (src/cuda/kv/append.cu) computes a token's
// angles with rope_cos_sin and rotates with rope_rotate_element; kernels built on flashlite that rotate in an
// epilogue (the engine's QKV GEMV) do the same, or read a table of rope_cos_sin values, and get the library's
// numbers.
#include <cuda_runtime.h>

#include <cstdint>

#include "flashlite/rope.h"

namespace flashlite::cuda {

// (cos, sin) of pos * inv_freq: float64 angle and sincos, each rounded once to float.
__device__ __forceinline__ float2 rope_cos_sin(int64_t pos, double inv_freq) {
  double sn, cs;
  sincos(double(pos) * inv_freq, &sn, &cs);
  return make_float2(float(cs), float(sn));
}

// Element `second` (false: a, true: b) of the pair (xa, xb) rotated by cs = (cos, sin), fp32.
__device__ __forceinline__ float rope_rotate_element(float xa, float xb, float2 cs, bool second) {
  return second ? rope_rotated_b(xa, xb, cs.x, cs.y) : rope_rotated_a(xa, xb, cs.x, cs.y);
}

}  // namespace flashlite::cuda
