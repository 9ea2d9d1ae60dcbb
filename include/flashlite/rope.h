#pragma once
// The rotary embedding (RoPE), once for the whole repository: the frequency rule, which elements of a head form a
// rotation pair, and the rotation. Host and device (plain C++ here; the device's cos / sin of a position are in
// flashlite/cuda/rope.cuh). append_kv() (CPU and CUDA), the engine's CPU model (through append_kv) and the engine's
// fused QKV-GEMV epilogue all rotate with these functions, so they cannot disagree on a pair, a sign or a frequency.
#include <cmath>
#include <cstdint>
#include <numbers>

#include "flashlite/kv_cache.h"

#if defined(__CUDACC__)
#define FLASHLITE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHLITE_HOST_DEVICE inline
#endif

namespace flashlite {

// inv_freq(c) of pair c (0 <= c < head_dim / 2) under RopeOptions' rule (kv_cache.h): theta^(-2c / head_dim), then
// Llama-3's 'llama3' band rule, then the 'linear' factor. float64, host only.
inline double rope_frequency(const RopeOptions& r, int64_t head_dim, int64_t c) {
  double inv = std::pow(r.theta, -2.0 * double(c) / double(head_dim));
  if (r.llama3) {
    const double wavelen = 2.0 * std::numbers::pi / inv;
    const double orig = r.llama3_original_max_position;
    if (wavelen < orig / r.llama3_high_freq_factor) {
      // high frequencies: kept
    } else if (wavelen > orig / r.llama3_low_freq_factor) {
      inv = inv / r.llama3_factor;  // low frequencies: slowed
    } else {
      const double smooth =
          (orig / wavelen - r.llama3_low_freq_factor) / (r.llama3_high_freq_factor - r.llama3_low_freq_factor);
      inv = (1.0 - smooth) * inv / r.llama3_factor + smooth * inv;
    }
  }
  if (r.linear_factor != 1.0) inv = inv / r.linear_factor;
  return inv;
}

// The two elements of a head that pair c rotates: (c, c + head_dim/2) half-split, (2c, 2c + 1) interleaved.
struct RopePairIndex {
  int a, b;
};
FLASHLITE_HOST_DEVICE RopePairIndex rope_pair(int c, int head_dim, bool interleaved) {
  return interleaved ? RopePairIndex{2 * c, 2 * c + 1} : RopePairIndex{c, c + head_dim / 2};
}

// The rotation of a pair (xa, xb) by the angle whose cosine and sine are (cs, sn): (xa cs - xb sn, xb cs + xa sn).
// Each half on its own for kernels where one thread owns one element of the pair.
template <class T>
FLASHLITE_HOST_DEVICE T rope_rotated_a(T xa, T xb, T cs, T sn) {
  return xa * cs - xb * sn;
}
template <class T>
FLASHLITE_HOST_DEVICE T rope_rotated_b(T xa, T xb, T cs, T sn) {
  return xb * cs + xa * sn;
}

}  // namespace flashlite
