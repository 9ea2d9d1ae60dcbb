#pragma once
// Split-KV merge inside a thread-block cluster (sm_90). When the splits of one (sequence, kv head, row chunk) are the
// CTAs of one cluster (launch.cu: cluster dims (num_splits, 1, 1), at most kClusterMaxSplits), each CTA leaves its
// normalised partial O and its LSE in its own shared memory; after a cluster barrier the CTAs merge them through
// distributed shared memory, CTA c taking the (row, 4-column) items c, c + S, ... A second barrier keeps every CTA's
// shared memory alive until the last remote read. This replaces the partials' trip through global memory and the
// combine kernel (its launch, the split grid's drain and flush, and its L2 round trips) with two barriers and one
// round of DSMEM loads. Same arithmetic as the combine kernel (combine.cuh): natural-log LSEs, the sink logit in
// the denominator only.
#include <cuda_runtime.h>

#include "cuda/decode/decode_params.h"
#include "cuda/decode/decode_ptx.cuh"

namespace flashlite::cuda_decode {

inline constexpr int kClusterMaxSplits = 16;  // the largest cluster sm_90 launches (non-portable size)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrive without ordering earlier memory operations (the global stores of the merged rows stay in flight), then wait.
__device__ __forceinline__ void cluster_sync_relaxed_arrive() {
  asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared-memory address `addr` of this CTA, as the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
#endif

// Called by every thread of every CTA of the cluster, after the partial of this CTA's rows (r_base .. r_base + r_blk)
// is in shared memory: o_s = (kRowsPerBlock, D) fp32 normalised rows, lse_s = (kRowsPerBlock) natural-log LSEs.
// stamp(k): the diagnostic timeline's stamps 9 (after the first barrier) and 10 (merged, before the second).
template <class T, int D, int kThreads, class Stamp>
__device__ __forceinline__ void cluster_merge(const DecodeParams& p, uint32_t o_s, uint32_t lse_s, int b, int kvh,
                                              int r_base, int r_blk, Stamp&& stamp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int C4 = D / 4;  // 4-column items per row
  const int S = p.num_splits;
  const int rank = int(cluster_ctarank());
  const int tid = int(threadIdx.x);
  cluster_sync_all();  // every CTA's partial is written (release / acquire: visible to the whole cluster)
  stamp(9);
  for (int it = rank + S * tid; it < r_blk * C4; it += S * kThreads) {
    const int lr = it / C4, c4 = it % C4;
    float ls[kClusterMaxSplits];
    float4 po[kClusterMaxSplits];
    // All loads first: one DSMEM round trip for the item.
#pragma unroll
    for (int s = 0; s < kClusterMaxSplits; ++s) {
      if (s < S) {
        ls[s] = ld_cluster_f32(map_to_rank(lse_s + uint32_t(lr * 4), uint32_t(s)));
        po[s] = ld_cluster_f32x4(map_to_rank(o_s + uint32_t((lr * D + c4 * 4) * 4), uint32_t(s)));
      }
    }
    const int gr = r_base + lr;
    const int i = gr / p.group, head = kvh * p.group + gr % p.group;
    float mx = -INFINITY;
    const float sink = p.sink_logits ? p.sink_logits[head] : -INFINITY;
    bool poisoned = isnan(sink) || sink == INFINITY;  // or a split saw a NaN / +inf score: row NaN (docs/numerics.md)
#pragma unroll
    for (int s = 0; s < kClusterMaxSplits; ++s) {
      if (s < S) mx = fmaxf(mx, ls[s]), poisoned |= isnan(ls[s]);
    }
    const float m = fmaxf(mx, sink);
    float lse = -INFINITY;
    if (m != -INFINITY) {
      float total = sink == -INFINITY ? 0.f : __expf(sink - m);
#pragma unroll
      for (int s = 0; s < kClusterMaxSplits; ++s) {
        if (s < S && ls[s] != -INFINITY) total += __expf(ls[s] - m);
      }
      lse = m + __logf(total);
    }
    // Every split's partial is consumed, also a split without keys (masked to +0, so that a NaN it may hold stays
    // out): the exit barrier's relaxed arrive does not wait for loads in flight, and a remote load left unconsumed (a
    // row that no split saw a key of) could still be reading a CTA that has already left the cluster: an unspecified
    // launch failure, seen on one H100 in the empty-sequences case.
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kClusterMaxSplits; ++s) {
      if (s < S) {
        const bool take = mx != -INFINITY && ls[s] != -INFINITY;
        const float w = take ? __expf(ls[s] - lse) : 0.f;
        const unsigned keep = take ? 0xffffffffu : 0u;
        acc.x += __uint_as_float(__float_as_uint(w * po[s].x) & keep);
        acc.y += __uint_as_float(__float_as_uint(w * po[s].y) & keep);
        acc.z += __uint_as_float(__float_as_uint(w * po[s].z) & keep);
        acc.w += __uint_as_float(__float_as_uint(w * po[s].w) & keep);
      }
    }
    if (poisoned) lse = NAN, acc = make_float4(NAN, NAN, NAN, NAN);
    T* out = static_cast<T*>(p.out) + p.out_stride.offset(b, i, head) + c4 * 4;
    out[0] = from_float<T>(acc.x);
    out[1] = from_float<T>(acc.y);
    out[2] = from_float<T>(acc.z);
    out[3] = from_float<T>(acc.w);
    if (p.lse && c4 == 0) p.lse[p.lse_stride.offset(b, head, i)] = lse;
  }
  stamp(10);
  // No CTA leaves (freeing its shared memory) while another may still read it. The remote loads are complete here
  // (every value went into the stores above), so a relaxed arrive suffices; a release arrive would first wait for
  // those global stores to be acknowledged.
  // (Measured on the H100, perf-notes "Decode, round 14": -0.4 us per call at b1 kv1024, +0.7% engine tok/s.)
  cluster_sync_relaxed_arrive();
#else
  (void)p, (void)o_s, (void)lse_s, (void)b, (void)kvh, (void)r_base, (void)r_blk, (void)stamp;
  __trap();  // the plan (kv_plan.cpp) merges in a cluster only on sm_90+
#endif
}

}  // namespace flashlite::cuda_decode
