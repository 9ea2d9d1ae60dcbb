#pragma once
// Combine step of split-KV decode: merges the splits' normalised partial outputs through their LSEs,
//   lse = log(sum_s exp(lse_s) + exp(sink)),  out = sum_s exp(lse_s - lse) * O_s,
// one warp per (sequence, kv head, row); each lane owns D / 32 columns. Launched as a programmatic dependent of the
// split kernel (sm_90): it starts while the split kernel drains and waits for its results. Its time is one chain of
// dependent L2 round trips after the split kernel ends, so it is built to have one: up to 32 splits' rows and LSEs
// are all requested before any of them is used. (Merging in the split kernel's last block instead, found through a
// device counter, was measured slower in a graph: perf-notes "Decode", round 4.)
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_ptx.cuh"

namespace flashlite::cuda_decode {

inline constexpr int kCombineThreads = 128;

// Row `item` = (b * kv_heads + kvh) * rows + gr. Loads go through L2 (.cg): the split kernel wrote them.
template <class T, int D>
__device__ __forceinline__ void merge_row(const DecodeParams& p, int64_t item, int lane) {
  constexpr int VEC = D / 32;
  static_assert(VEC == 2 || VEC == 4, "head_dim 64 or 128");
  using V = std::conditional_t<VEC == 4, float4, float2>;
  constexpr int kPre = 32;  // partial rows loaded before the LSEs are known: up to 32 splits, one round trip in all
  const int S = p.num_splits;
  const int gr = int(item % p.rows);
  const int kvh = int(item / p.rows % p.kv_heads);
  const int b = int(item / (int64_t(p.rows) * p.kv_heads));
  const int i = gr / p.group, head = kvh * p.group + gr % p.group;
  const float* lse_s = p.part_lse + item * S;
  const V* src = reinterpret_cast<const V*>(p.part_o + item * S * D + lane * VEC);  // split j at src[j * D / VEC]

  V pre[kPre];
#pragma unroll
  for (int j = 0; j < kPre; ++j) {
    if (j < S) pre[j] = __ldcg(src + j * (D / VEC));
  }
  // LSEs in one pass: lane-local online (max, sum), then across the warp. Lane s keeps split s's LSE for the
  // weights, so up to 32 splits read them once (3 dependent L2 round trips -> 1).
  const float ls0 = lane < S ? __ldcg(lse_s + lane) : -INFINITY;
  float m_l = ls0, sum_l = ls0 == -INFINITY ? 0.f : 1.f;
  bool poisoned = isnan(ls0);  // a split saw a NaN / +inf score: the row is NaN (docs/numerics.md)
  for (int s = lane + 32; s < S; s += 32) {
    const float l = __ldcg(lse_s + s);
    poisoned |= isnan(l);
    if (l > m_l) {
      sum_l = sum_l * __expf(m_l - l) + 1.f;
      m_l = l;
    } else if (l != -INFINITY) {
      sum_l += __expf(l - m_l);
    }
  }
  const float mx = warp_max(m_l);
  const float sum = warp_sum(m_l == -INFINITY ? 0.f : sum_l * __expf(m_l - mx));
  const float sink = p.sink_logits ? p.sink_logits[head] : -INFINITY;
  poisoned = __any_sync(0xffffffffu, poisoned) || isnan(sink) || sink == INFINITY;
  const float m = fmaxf(mx, sink);
  float lse = -INFINITY;
  if (m != -INFINITY) {
    const float total = (mx == -INFINITY ? 0.f : sum * __expf(mx - m)) + (sink == -INFINITY ? 0.f : __expf(sink - m));
    lse = m + __logf(total);
  }
  if (poisoned) lse = NAN;
  // Accumulate: split s's weight comes from lane s % 32 by a shuffle; loads are unconditional (a split without
  // keys wrote zeros and gets weight 0) and unrolled, so rows arrive back to back, not one round trip per split.
  float acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
  auto add = [&](float w, const V& x) {
    if constexpr (VEC == 4) {
      acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
    } else {
      acc[0] += w * x.x, acc[1] += w * x.y;
    }
  };
  if (mx != -INFINITY) {
    const float w0 = ls0 == -INFINITY ? 0.f : __expf(ls0 - lse);
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      if (j < S) add(__shfl_sync(0xffffffffu, w0, j), pre[j]);
    }
    for (int s0 = 0; s0 < S; s0 += 32) {
      float w_lane = w0;
      if (s0 > 0) {
        const float ls = s0 + lane < S ? __ldcg(lse_s + s0 + lane) : -INFINITY;
        w_lane = ls == -INFINITY ? 0.f : __expf(ls - lse);
      }
      const int count = min(32, S - s0);
#pragma unroll 8
      for (int j = s0 == 0 ? kPre : 0; j < count; ++j) {
        add(__shfl_sync(0xffffffffu, w_lane, j), __ldcg(src + (s0 + j) * (D / VEC)));
      }
    }
  }
  T* out = static_cast<T*>(p.out) + p.out_stride.offset(b, i, head) + lane * VEC;
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = from_float<T>(poisoned ? NAN : acc[e]);
  if (p.lse && lane == 0) p.lse[p.lse_stride.offset(b, head, i)] = lse;
}

template <class T, int D>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  pdl_launch_dependents();  // the next decode's split kernel may start launching; it waits for this grid
  pdl_wait();
  const int64_t item = int64_t(blockIdx.x) * (kCombineThreads / 32) + int(threadIdx.x) / 32;
  if (item >= int64_t(p.batch) * p.kv_heads * p.rows) return;
  merge_row<T, D>(p, item, int(threadIdx.x) % 32);
}

}  // namespace flashlite::cuda_decode
