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
  static_assert(VEC == 2 || VEC == 4, "head_dim 64 or 128");
  pdl_launch_dependents();  // the next decode's split kernel may start launching; it waits for this grid
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
  // Accumulate: split s's weight comes from lane s % 32 by a shuffle; the loop is unrolled so that eight splits' rows
  // are loaded back to back (unconditionally: a split without keys wrote zeros and gets weight 0) instead of one
  // dependent L2 round trip per split.
  float acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
  if (mx != -INFINITY) {
    for (int s0 = 0; s0 < p.num_splits; s0 += 32) {
      const int s_lane = s0 + lane;
      const float ls = s_lane < p.num_splits ? lse_s[s_lane] : -INFINITY;
      const float w_lane = ls == -INFINITY ? 0.f : __expf(ls - lse);
      const int count = min(32, p.num_splits - s0);
      const float* src = o_s + int64_t(s0) * D + lane * VEC;
#pragma unroll 8
      for (int j = 0; j < count; ++j) {
        const float w = __shfl_sync(0xffffffffu, w_lane, j);
        if constexpr (VEC == 4) {
          const float4 x = __ldg(reinterpret_cast<const float4*>(src + j * D));
          acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
        } else {
          const float2 x = __ldg(reinterpret_cast<const float2*>(src + j * D));
          acc[0] += w * x.x, acc[1] += w * x.y;
        }
      }
    }
  }
  T* out = static_cast<T*>(p.out) + b * p.o_sb + i * p.o_ss + head * p.o_sh + lane * VEC;
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = from_f32<T>(acc[e]);
  if (p.lse && lane == 0) p.lse[b * p.lse_sb + head * p.lse_sh + i * p.lse_ss] = lse;
}

}  // namespace flashlite::cuda_decode
