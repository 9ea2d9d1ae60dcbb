#pragma once
// Device code of the engine's GEMV (gemv.cu): the block shape, loads, the RMSNorm prologue, the dot products and the
// tile epilogue (split-K, fused RoPE + cache append, stores, argmax).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/select_keys.cuh"
#include "engine/parallel/peer_sum.cuh"
#include "flashlite/cuda/rope.cuh"

namespace flashlite::engine::cuda_ops::gemv_device {

// A bf16 pair in a 32-bit word: element 2i in the low half. A bf16 is the top half of the fp32 with the same value.
__device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc + w . x over 8 bf16 pairs packed in a uint4, one fp32 fma each.
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

constexpr int kWarps = 8, kThreads = kWarps * 32;
// Weight rows a warp streams together: one (more warps for the short O / down / QKV matrices), two for SwiGLU (a
// gate row and its up row). Loads in flight per lane: 8 x 16 bytes either way (4 KB per warp).
template <GemvOut OUT>
__host__ __device__ constexpr int rows_per_warp() { return OUT == GemvOut::swiglu_bf16 ? 2 : 1; }
template <GemvOut OUT>
__host__ __device__ constexpr int unroll() { return 8 / rows_per_warp<OUT>(); }

// The L2 policy of the weight stream: evict-first keeps the step's 2.5 GB of weights, read once per step, from
// evicting what is read again (KV cache, activations, norm weights, kernel code).
__device__ __forceinline__ uint64_t weight_policy() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// Weights are read once: skip L1; L2 as `pol` says.
__device__ __forceinline__ uint4 load_stream(const uint4* p, uint64_t pol) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
}

// Chunk c (8 elements) of the norm weight, as 16 bytes where it is 16-byte aligned.
__device__ __forceinline__ uint4 norm_chunk(const GemvParams& p, int c) {
  if ((reinterpret_cast<uintptr_t>(p.norm_w) & 15) == 0) return static_cast<const uint4*>(p.norm_w)[c];
  union {
    uint4 v;
    __nv_bfloat16 h[8];
  } g;
#pragma unroll
  for (int e = 0; e < 8; ++e) g.h[e] = static_cast<const __nv_bfloat16*>(p.norm_w)[8 * c + e];
  return g.v;
}

// The norm weight's chunk of this thread for the one-round-trip RMSNorm prologue below (up to 2 rows,
// k <= 8 x kThreads), loaded before griddepcontrol.wait: it is a weight (no predecessor writes it), and after the wait
// it is likely a DRAM miss (the step's weight stream evicts it from L2; loading it early measured -22 us per step on
// the H100).
struct NormPre {
  uint4 g;
};
template <int R, GemvIn IN>
__device__ __forceinline__ NormPre norm_preload(const GemvParams& p, int kc) {
  NormPre pre{};
  if constexpr (IN == GemvIn::rmsnorm && R <= 2) {
    if (kc <= kThreads && int(threadIdx.x) < kc) pre.g = norm_chunk(p, threadIdx.x);
  }
  return pre;
}

// The activation rows a GEMV multiplies (after pdl_wait: x is the previous kernel's output): RMSNorm'd rows staged in
// shared memory as bf16 (fp32 math), or the bf16 input itself; rows past p.rows repeat the last one (never stored).
// The RMSNorm prologue sits on the step's critical path twice per layer (per-block timer stamps measured ~4 us from
// the previous GEMV's end when one warp summed a row with a dependent load per iteration), so the whole block loads:
// thread t takes the 8-element chunks t, t + kThreads, ... of every row with all rows' loads issued before any math,
// then one block reduction. Up to 2 rows and k <= 8 x kThreads (one chunk a thread) x and the norm weight (loaded
// before the wait: norm_preload) come in one round trip and x stays in registers; otherwise a second pass re-reads
// the thread's own chunks (L1) and loads the norm weight.
template <int R, GemvIn IN>
__device__ __forceinline__ void activation_rows(const GemvParams& p, uint4* staged, const uint4* (&xrow)[R], int lane,
                                                int warp, int kc, const NormPre& pre) {
  if constexpr (IN == GemvIn::rmsnorm) {
    __shared__ float red[kWarps][R];
    __shared__ float inv[R];
    const float4* xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int rr = min(r, p.rows - 1);
      xr[r] = reinterpret_cast<const float4*>(p.xf + size_t(p.row_index ? p.row_index[rr] : rr) * p.k);
    }
    union Chunk {
      uint4 v;
      __nv_bfloat16 h[8];
    };
    if constexpr (R <= 2) {
      if (kc <= kThreads) {
        // At most one chunk per thread (k <= 2048): x and the norm weight in one round trip, x kept in registers,
        // one barrier for the reduction (every thread adds the warps' sums in the same order) and one for staged.
        const int c = threadIdx.x;
        const bool mine = c < kc;
        float4 a[R], b[R];
        Chunk g;
        g.v = pre.g;  // norm_preload: before the wait
        if (mine) {
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < p.rows) a[r] = xr[r][2 * c], b[r] = xr[r][2 * c + 1];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float ss = 0.f;
          if (mine && r < p.rows) {
            ss += a[r].x * a[r].x + a[r].y * a[r].y + a[r].z * a[r].z + a[r].w * a[r].w;
            ss += b[r].x * b[r].x + b[r].y * b[r].y + b[r].z * b[r].z + b[r].w * b[r].w;
          }
          for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          if (lane == 0) red[warp][r] = ss;
        }
        __syncthreads();
        if (mine) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r >= p.rows) break;
            float s = 0.f;
            for (int w = 0; w < kWarps; ++w) s += red[w][r];
            const float iv = rsqrtf(s / p.k + p.eps);
            const float x[8] = {a[r].x, a[r].y, a[r].z, a[r].w, b[r].x, b[r].y, b[r].z, b[r].w};
            Chunk y;
#pragma unroll
            for (int e = 0; e < 8; ++e) y.h[e] = __float2bfloat16(x[e] * iv * __bfloat162float(g.h[e]));
            staged[size_t(r) * kc + c] = y.v;
          }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; ++r) xrow[r] = staged + size_t(min(r, p.rows - 1)) * kc;
        return;
      }
    }
    float ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) ss[r] = 0.f;
    for (int c = threadIdx.x; c < kc; c += kThreads) {
      float4 a[R], b[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < p.rows) a[r] = xr[r][2 * c], b[r] = xr[r][2 * c + 1];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < p.rows) {
          ss[r] += a[r].x * a[r].x + a[r].y * a[r].y + a[r].z * a[r].z + a[r].w * a[r].w;
          ss[r] += b[r].x * b[r].x + b[r].y * b[r].y + b[r].z * b[r].z + b[r].w * b[r].w;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
      if (lane == 0) red[warp][r] = ss[r];
    }
    __syncthreads();
    if (int(threadIdx.x) < R) {
      float s = 0.f;
      for (int w = 0; w < kWarps; ++w) s += red[w][threadIdx.x];
      inv[threadIdx.x] = rsqrtf(s / p.k + p.eps);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < kc; c += kThreads) {
      Chunk g;
      g.v = norm_chunk(p, c);
      Chunk y;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= p.rows) break;
        const float4 a = xr[r][2 * c], b = xr[r][2 * c + 1];
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) y.h[e] = __float2bfloat16(x[e] * inv[r] * __bfloat162float(g.h[e]));
        staged[size_t(r) * kc + c] = y.v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) xrow[r] = staged + size_t(min(r, p.rows - 1)) * kc;
  } else {
    (void)lane, (void)warp;
#pragma unroll
    for (int r = 0; r < R; ++r) xrow[r] = static_cast<const uint4*>(p.x) + size_t(min(r, p.rows - 1)) * kc;
  }
}

// acc[j][r] += weight row j . activation row r over one batch of loads (wv: kUnroll chunks 32 apart from c0; chunks
// at or past c_end are not there).
template <int R, int NW, int kUnroll>
__device__ __forceinline__ void dot_batch(float (&acc)[NW][R], const uint4 (&wv)[kUnroll][NW], const uint4* const (&xrow)[R],
                                          int c0, int c_end) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    if (c < c_end) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 xv = xrow[r][c];
#pragma unroll
        for (int j = 0; j < NW; ++j) acc[j][r] = dot8(wv[t][j], xv, acc[j][r]);
      }
    }
  }
}

// Each lane's partial sums added across the warp.
template <int R, int NW>
__device__ __forceinline__ void warp_sum(float (&acc)[NW][R]) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[j][r] += __shfl_xor_sync(0xffffffffu, acc[j][r], o);
}

// Output column j of the warp (element `at` of y) for activation row r: stored (bf16 / fp32), added to the fp32
// residual stream, or SwiGLU of the gate (column j) and its up row (column j + NW / 2).
template <GemvOut OUT, int NW, int R>
__device__ __forceinline__ void store_column(const GemvParams& p, const float (&acc)[NW][R], int j, int r, size_t at) {
  const float v = acc[j][r];
  if constexpr (OUT == GemvOut::bf16) {
    static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16(v);
  } else if constexpr (OUT == GemvOut::f32 || OUT == GemvOut::f32_argmax) {
    static_cast<float*>(p.y)[at] = v;
  } else if constexpr (OUT == GemvOut::add_f32) {
    static_cast<float*>(p.y)[at] += v;
  } else {
    const float up = acc[j + NW / 2][r];
    static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16(v / (1.f + __expf(-v)) * up);
  }
}

// The warp's U output columns from u0 for every activation row, stored (lane 0 of the warp); each(j, r, u) runs
// after column j of row r is stored (the argmax epilogue keeps its best key there). sum_f32 sends every value to the
// peers first and then waits for theirs, so a step's rows cost one NVLink crossing, not one each.
template <GemvOut OUT, int U, int NW, int R, class Each>
__device__ __forceinline__ void store_group(const GemvParams& p, const float (&acc)[NW][R], int u0, Each each) {
  if constexpr (OUT == GemvOut::sum_f32) {
    unsigned round[R][U];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < U; ++j)
        if (r < p.rows && u0 + j < p.out) {
          round[r][j] = peer_sum::send_to_peers(p.sum, size_t(r) * p.out + u0 + j, acc[j][r]);
        }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int u = u0 + j;
        if (r >= p.rows || u >= p.out) continue;
        const size_t at = size_t(r) * p.out + u;
        static_cast<float*>(p.y)[at] += peer_sum::sum_from_peers(p.sum, at, acc[j][r], round[r][j]);
        each(j, r, u);
      }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= p.rows) break;
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int u = u0 + j;
        if (u >= p.out) break;
        store_column<OUT>(p, acc, j, r, size_t(r) * p.out + u);
        each(j, r, u);
      }
    }
  }
}

// Which weight row warp `w` of tile `t` owns in the fused-RoPE layout: a tile is 8 rows of one head forming 4 rotation
// pairs (flashlite/rope.h's rope_pair); the warp's partner (the other element of its pair) is warp w ^ 4 (half-split)
// or w ^ 1 (interleaved).
struct RopeSlot {
  int row, head, d, pair;  // weight row, head, element within the head, pair index i (cos/sin column)
  bool second;             // the pair's second element (i + D/2, or 2i + 1)
};
__device__ __forceinline__ RopeSlot rope_slot(const GemvRope& rp, int tile, int w) {
  const int D = rp.head_dim, per_head = D / 8, h = tile / per_head, part = tile % per_head;
  RopeSlot s;
  s.head = h;
  s.pair = part * 4 + (rp.interleaved ? w >> 1 : w & 3);
  s.second = rp.interleaved ? w & 1 : w >> 2;
  const RopePairIndex e = rope_pair(s.pair, D, rp.interleaved);
  s.d = s.second ? e.b : e.a;
  s.row = h * D + s.d;
  return s;
}

// The end of one block-uniform tile of the kernel, after each active warp's sums (acc) are
// warp-reduced: the fused RoPE rotation and cache append, or split-K's fixed-order sum of the row's slices, then the
// stores (lane 0) and, for f32_argmax, the warp's best key per row. Every warp of the block calls it for every tile
// (its barriers); `part` is the block's shared scratch.
template <int R, GemvOut OUT, int NW>
__device__ __forceinline__ void finish_tile(const GemvParams& p, float (&acc)[NW][R], float (&part)[kWarps][NW][R],
                                            uint64_t (&best)[R], int tile, int warp, int lane, bool active, int S,
                                            int sub, int u0) {
  constexpr bool kRope = OUT == GemvOut::rope_bf16, kArgmax = OUT == GemvOut::f32_argmax;
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? NW / 2 : NW;  // output columns per warp
  if constexpr (kRope) {
    // Round as the unfused path stores q/k/v in bf16, rotate pairs across warps (the library's rotation and, from the
    // table, its cos / sin: flashlite/cuda/rope.cuh), route q / k / v.
    if (lane == 0 && active) {
#pragma unroll
      for (int r = 0; r < R; ++r) part[warp][0][r] = __bfloat162float(__float2bfloat16(acc[0][r]));
    }
    __syncthreads();
    if (lane == 0 && active) {
      const GemvRope& rp = p.rope;
      const RopeSlot sl = rope_slot(rp, tile, warp);
      const int partner = rp.interleaved ? warp ^ 1 : warp ^ 4, D = rp.head_dim, half = D / 2;
      const int kvd = rp.kv_heads * D;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= p.rows) break;
        const float self = part[warp][0][r], other = part[partner][0][r];
        if (sl.head >= rp.heads + rp.kv_heads) {  // v: copied as is
          static_cast<__nv_bfloat16*>(rp.v_cache)[size_t(rp.cache_row[r]) * kvd + (sl.head - rp.heads - rp.kv_heads) * D + sl.d] =
              __float2bfloat16(self);
          continue;
        }
        const size_t at = size_t(rp.pos[r]) * half + sl.pair;
        const float2 cs = make_float2(rp.cos[at], rp.sin[at]);
        const float xa = sl.second ? other : self, xb = sl.second ? self : other;
        const __nv_bfloat16 y = __float2bfloat16(::flashlite::cuda::rope_rotate_element(xa, xb, cs, sl.second));
        if (sl.head < rp.heads) static_cast<__nv_bfloat16*>(p.y)[size_t(r) * p.out + sl.row] = y;
        else static_cast<__nv_bfloat16*>(rp.k_cache)[size_t(rp.cache_row[r]) * kvd + (sl.head - rp.heads) * D + sl.d] = y;
      }
    }
    __syncthreads();  // part is rewritten by the next tile
  } else {
    if (S > 1) {  // uniform across the block
      if (lane == 0 && active) {
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int r = 0; r < R; ++r) part[warp][j][r] = acc[j][r];
      }
      __syncthreads();
      if (sub == 0 && active) {  // fixed order: slice 0, 1, ...
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float v = part[warp][j][r];
            for (int q = 1; q < S; ++q) v += part[warp + q][j][r];
            acc[j][r] = v;
          }
      }
      __syncthreads();
    }
    if (lane == 0 && active && sub == 0) {
      store_group<OUT, U>(p, acc, u0, [&](int j, int r, int u) {
        if constexpr (kArgmax) best[r] = max(best[r], argmax_key(acc[j][r], u));
      });
    }
  }
}

// f32_argmax: one atomicMax per block and row of the warps' best keys (keys are unique, max is order-independent:
// the result is deterministic). Every thread of the block calls it once, after the last tile.
template <int R>
__device__ __forceinline__ void fold_argmax(const GemvParams& p, const uint64_t (&best)[R], int warp, int lane) {
  __shared__ unsigned long long block_best[kWarps][R];
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) block_best[warp][r] = best[r];
  }
  __syncthreads();
  if (threadIdx.x < R && int(threadIdx.x) < p.rows) {
    unsigned long long m = 0;
    for (int w = 0; w < kWarps; ++w) m = max(m, block_best[w][threadIdx.x]);
    if (m) atomicMax(reinterpret_cast<unsigned long long*>(p.argmax_keys) + threadIdx.x, m);
  }
}

}  // namespace flashlite::engine::cuda_ops::gemv_device
