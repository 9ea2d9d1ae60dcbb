#pragma once
// Combine step of split-KV decode: merges the splits' normalised partial outputs through their LSEs,
//   lse = log(sum_s exp(lse_s) + exp(sink)),  out = sum_s exp(lse_s - lse) * O_s,
// one warp per (sequence, kv head, row); each lane owns D / 32 columns. Launched as a programmatic dependent of the
// split kernel (sm_90): it starts while the split kernel drains and waits for its results.
#include <cuda_runtime.h>

#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_ptx.cuh"

namespace flashlite::cuda_decode {

inline constexpr int kCombineThreads = 128;

template <class T, int D>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int VEC = D / 32;
  pdl_wait_primary();
  const int lane = int(threadIdx.x) % 32;
  const int64_t item = int64_t(blockIdx.x) * (kCombineThreads / 32) + int(threadIdx.x) / 32;
  if (item >= int64_t(p.batch) * p.kv_heads * p.rows) return;
  const int gr = int(item % p.rows);
  const int kvh = int(item / p.rows % p.kv_heads);
  const int b = int(item / (int64_t(p.rows) * p.kv_heads));
  const int i = gr / p.group, head = kvh * p.group + gr % p.group;
  const float* lse_s = p.part_lse + item * p.num_splits;
  const float* o_s = p.part_o + item * p.num_splits * D;

  float mx = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) mx = fmaxf(mx, lse_s[s]);
  mx = warp_max(mx);
  const float sink = p.sink_logits ? p.sink_logits[head] : -INFINITY;
  const float m = fmaxf(mx, sink);
  float lse = -INFINITY;
  if (m != -INFINITY) {
    float sum = 0.f;
    for (int s = lane; s < p.num_splits; s += 32) sum += lse_s[s] == -INFINITY ? 0.f : __expf(lse_s[s] - m);
    sum = warp_sum(sum);
    if (sink != -INFINITY) sum += __expf(sink - m);
    lse = m + __logf(sum);
  }
  float acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
  if (mx != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float ls = lse_s[s];
      if (ls == -INFINITY) continue;
      const float w = __expf(ls - lse);
      const float* src = o_s + int64_t(s) * D + lane * VEC;
      if constexpr (VEC == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] += w * src[e];
      }
    }
  }
  T* out = static_cast<T*>(p.out) + b * p.o_sb + i * p.o_ss + head * p.o_sh + lane * VEC;
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = from_f32<T>(acc[e]);
  if (p.lse && lane == 0) p.lse[b * p.lse_sb + head * p.lse_sh + i * p.lse_ss] = lse;
}

}  // namespace flashlite::cuda_decode
