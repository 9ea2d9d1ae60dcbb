#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/cuda_ops/bf16_dot.cuh"
#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/pdl.cuh"
#include "engine/cuda_ops/select_keys.cuh"
#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
// Weight rows a warp streams together: one (more warps for the short O / down / QKV matrices), two for SwiGLU (a
// gate row and its up row). Loads in flight per lane: 8 x 16 bytes either way (4 KB per warp).
template <GemvOut OUT>
__host__ __device__ constexpr int rows_per_warp() { return OUT == GemvOut::swiglu_bf16 ? 2 : 1; }
template <GemvOut OUT>
__host__ __device__ constexpr int unroll() { return 8 / rows_per_warp<OUT>(); }
constexpr size_t kMaxStagedBytes = 160 * 1024;

// The staged rows' bytes this device takes: kMaxStagedBytes, less where its opt-in shared memory per block is smaller
// (sm_86 / sm_89: ~99 KB), with 1 KB left for the kernels' static shared memory. Without a device: kMaxStagedBytes
// (nothing launches then anyway).
size_t max_staged_bytes() {
  static const size_t bytes = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || optin <= 0) {
      cudaGetLastError();
      return kMaxStagedBytes;
    }
    return std::min(kMaxStagedBytes, size_t(std::max(0, optin - 1024)));
  }();
  return bytes;
}

// Weights are read once: skip L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The activation rows a GEMV multiplies (after pdl_wait: x is the previous kernel's output): RMSNorm'd rows staged in
// shared memory as bf16 (fp32 math), or the bf16 input itself; rows past p.rows repeat the last one (never stored).
template <int R, GemvIn IN>
__device__ __forceinline__ void activation_rows(const GemvParams& p, uint4* staged, const uint4* (&xrow)[R], int lane,
                                                int warp, int kc) {
  if constexpr (IN == GemvIn::rmsnorm) {
    __shared__ float inv[R];
    for (int r = warp; r < p.rows; r += kWarps) {
      const float4* xr = reinterpret_cast<const float4*>(p.xf + size_t(p.row_index ? p.row_index[r] : r) * p.k);
      float ss = 0.f;
      for (int i = lane; i < p.k / 4; i += 32) {
        const float4 v = xr[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) inv[r] = rsqrtf(ss / p.k + p.eps);
    }
    __syncthreads();
    __nv_bfloat16* st = reinterpret_cast<__nv_bfloat16*>(staged);
    const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(p.norm_w);
    for (int r = 0; r < p.rows; ++r) {
      const float* xr = p.xf + size_t(p.row_index ? p.row_index[r] : r) * p.k;
      for (int i = threadIdx.x; i < p.k; i += kThreads)
        st[size_t(r) * p.k + i] = __float2bfloat16(xr[i] * inv[r] * __bfloat162float(g[i]));
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) xrow[r] = staged + size_t(min(r, p.rows - 1)) * kc;
  } else {
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
// after column j of row r is stored (the variant kernel's argmax keeps its best key there).
template <GemvOut OUT, int U, int NW, int R, class Each>
__device__ __forceinline__ void store_group(const GemvParams& p, const float (&acc)[NW][R], int u0, Each each) {
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

// Which weight row warp `w` of tile `t` owns in the fused-RoPE layout: a tile is 8 rows of one head forming 4 rotation
// pairs; the warp's partner (the other element of its pair) is warp w ^ 4 (half-split) or w ^ 1 (interleaved).
struct RopeSlot {
  int row, head, d, pair;  // weight row, head, element within the head, pair index i (cos/sin column)
  bool second;             // the pair's second element (i + D/2, or 2i + 1)
};
__device__ __forceinline__ RopeSlot rope_slot(const GemvRope& rp, int tile, int w) {
  const int D = rp.head_dim, per_head = D / 8, h = tile / per_head, part = tile % per_head;
  RopeSlot s;
  s.head = h;
  if (rp.interleaved) {
    s.pair = part * 4 + (w >> 1);
    s.second = w & 1;
    s.d = 2 * s.pair + (w & 1);
  } else {
    s.pair = part * 4 + (w & 3);
    s.second = w >> 2;
    s.d = s.pair + (w >> 2) * (D / 2);
  }
  s.row = h * D + s.d;
  return s;
}

// R: activation rows the kernel is unrolled for (p.rows <= R; rows beyond p.rows repeat the last one, unstored).
template <int R, GemvIn IN, GemvOut OUT>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvParams p) {
  extern __shared__ uint4 staged[];  // rmsnorm: (rows, k) bf16
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kc = p.k >> 3;  // 16-byte chunks per row
  constexpr int NW = rows_per_warp<OUT>(), kUnroll = unroll<OUT>();
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? NW / 2 : NW;  // output columns per warp
  const uint4* W = static_cast<const uint4*>(p.w);
  const int groups = (p.out + U - 1) / U;
  // Weight rows of output group `grp`, row j of the warp (past the end: the last row again, never stored).
  auto weight_row = [&](int grp, int j) {
    const int u = min(grp * U + j % U, p.out - 1);
    return W + size_t(j < U ? u : p.out + u) * kc;
  };
  // Before waiting for the previous kernel: let the next one launch, and start the head of this warp's first weight
  // rows towards L2 (a bounded amount: prefetching whole rows while the previous GEMV streams evicts them again).
  pdl_launch_dependents();
  if (blockIdx.x * kWarps + warp < groups && lane < p.prefetch_lines) {
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const uint4* wr = weight_row(blockIdx.x * kWarps + warp, j);
      for (int line = lane; line < min(p.prefetch_lines, (kc + 7) / 8); line += 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + line * 8));
    }
  }
  pdl_wait();
  const uint4* xrow[R];
  activation_rows<R, IN>(p, staged, xrow, lane, warp, kc);

  for (int grp = blockIdx.x * kWarps + warp; grp < groups; grp += gridDim.x * kWarps) {
    const int u0 = grp * U;
    const uint4* wr[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) wr[j] = weight_row(grp, j);
    float acc[NW][R];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[j][r] = 0.f;
    for (int c0 = lane; c0 < kc; c0 += 32 * kUnroll) {
      uint4 wv[kUnroll][NW];  // all loads of the batch issued before any math
#pragma unroll
      for (int t = 0; t < kUnroll; ++t)
#pragma unroll
        for (int j = 0; j < NW; ++j) wv[t][j] = c0 + 32 * t < kc ? load_stream(wr[j] + c0 + 32 * t) : make_uint4(0, 0, 0, 0);
      dot_batch(acc, wv, xrow, c0, kc);
    }
    warp_sum(acc);
    if (lane == 0) store_group<OUT, U>(p, acc, u0, [](int, int, int) {});
  }
}

// The opt-in variants (gemv.h): gemv_kernel's loop in block-uniform tiles, so that split-K and the fused RoPE
// epilogue can meet in shared memory, with the preload, the late trigger and the argmax epilogue. A separate kernel so
// that the default one (above) stays exactly as measured.
// Registers: a fixed budget, spill-free: 64 (4 blocks per SM, as the default kernel) at 1-2 rows, except 80 (3 blocks)
// where a preloaded batch lives through the RMSNorm prologue (64 spilled up to 52 bytes there); 128 for 4-8 rows. The
// launch sizes the grid from the occupancy this gives.
// P: the preload compiled in (p.preload is then honoured); without it the RMSNorm variants fit 64 registers too.
template <int R, GemvIn IN, GemvOut OUT, bool P>
__global__ void __maxnreg__(R > 2 ? 255 : R == 2 ? 80 : (IN == GemvIn::bf16 || !P) ? 64 : 80) gemv_variant_kernel(const GemvParams p) {
  extern __shared__ uint4 staged[];  // rmsnorm: (rows, k) bf16
  constexpr bool kRope = OUT == GemvOut::rope_bf16, kArgmax = OUT == GemvOut::f32_argmax;
  constexpr int NW = rows_per_warp<OUT>(), kUnroll = unroll<OUT>();
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? NW / 2 : NW;  // output columns per warp
  __shared__ float part[kWarps][NW][R];  // split-K partial sums; fused RoPE: the tile's bf16-rounded values
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kc = p.k >> 3;  // 16-byte chunks per row
  // Split-K: `S` warps share a row group, warp `sub` of them reducing chunks [c_begin, c_end).
  const int S = (OUT == GemvOut::swiglu_bf16 || kRope) ? 1 : p.split;
  const bool preload = P && p.preload, late_trigger = p.late_trigger;
  const int per_tile = kWarps / S, sub = warp % S, slot = warp / S;
  const int slice = (kc + S - 1) / S, c_begin = min(kc, sub * slice), c_end = min(kc, c_begin + slice);
  const uint4* W = static_cast<const uint4*>(p.w);
  const int groups = (p.out + U - 1) / U;
  const int tiles = kRope ? p.out / 8 : (groups + per_tile - 1) / per_tile;
  // The output group (fused RoPE: the weight row) this warp owns in tile `t`; >= groups: none.
  auto group_of = [&](int t) { return kRope ? rope_slot(p.rope, t, warp).row : t * per_tile + slot; };
  // Weight rows of output group `grp`, row j of the warp (past the end: the last row again, never stored).
  auto weight_row = [&](int grp, int j) {
    const int u = min(grp * U + j % U, p.out - 1);
    return W + size_t(j < U ? u : p.out + u) * kc;
  };
  uint4 wv[kUnroll][NW];  // one batch of loads: all issued before any math
  auto load_batch = [&](const uint4* const* wr, int c0) {
#pragma unroll
    for (int t = 0; t < kUnroll; ++t)
#pragma unroll
      for (int j = 0; j < NW; ++j) wv[t][j] = c0 + 32 * t < c_end ? load_stream(wr[j] + c0 + 32 * t) : make_uint4(0, 0, 0, 0);
  };
  // Before waiting for the previous kernel: let the next one launch, and start this warp's first weights on their
  // way: the head of its first rows towards L2 (a bounded amount: prefetching whole rows while the previous GEMV
  // streams evicts them again) and/or (preload) its first batch into registers. Weights are never written by a
  // predecessor, so neither needs the wait.
  if (!late_trigger) pdl_launch_dependents();
  bool preloaded = false;
  if (blockIdx.x < tiles) {
    const int first = group_of(blockIdx.x);
    if (first < groups) {
      const uint4* wr[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) wr[j] = weight_row(first, j);
      if (lane < p.prefetch_lines) {
#pragma unroll
        for (int j = 0; j < NW; ++j)
          for (int line = lane; line < min(p.prefetch_lines, (c_end - c_begin + 7) / 8); line += 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[j] + c_begin + line * 8));
      }
      if (preload) {
        load_batch(wr, c_begin + lane);
        preloaded = true;
      }
    }
  }
  pdl_wait();
  const uint4* xrow[R];
  activation_rows<R, IN>(p, staged, xrow, lane, warp, kc);

  uint64_t best[kArgmax ? R : 1];  // f32_argmax: this warp's largest key per activation row so far
#pragma unroll
  for (int r = 0; r < (kArgmax ? R : 1); ++r) best[r] = 0;
  // Tiles are uniform across the block (the barriers of split-K and fused RoPE sit inside); warps whose group is
  // past the end idle through them.
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int grp = group_of(tile);
    const bool active = grp < groups;
    const int u0 = grp * U;
    float acc[NW][R];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[j][r] = 0.f;
    if (active) {
      const uint4* wr[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) wr[j] = weight_row(grp, j);
      for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * kUnroll) {
        if (!preloaded) load_batch(wr, c0);
        preloaded = false;
        dot_batch(acc, wv, xrow, c0, c_end);
      }
      warp_sum(acc);
    }
    preloaded = false;  // a lane with no chunk in its first tile never consumed its (empty) batch
    if constexpr (kRope) {
      // Round as the unfused path stores q/k/v in bf16, rotate pairs across warps, route q / k / v.
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
          const float c = rp.cos[size_t(rp.pos[r]) * half + sl.pair], s = rp.sin[size_t(rp.pos[r]) * half + sl.pair];
          const float x0 = sl.second ? other : self, x1 = sl.second ? self : other;
          const __nv_bfloat16 y = __float2bfloat16(sl.second ? x0 * s + x1 * c : x0 * c - x1 * s);
          if (sl.head < rp.heads) static_cast<__nv_bfloat16*>(p.y)[size_t(r) * p.out + sl.row] = y;
          else static_cast<__nv_bfloat16*>(rp.k_cache)[size_t(rp.cache_row[r]) * kvd + (sl.head - rp.heads) * D + sl.d] = y;
        }
      }
      __syncthreads();  // part is rewritten by the next tile
      continue;
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
  if (late_trigger) pdl_launch_dependents();
  if constexpr (kArgmax) {
    // One atomicMax per block and row (keys are unique, max is order-independent: the result is deterministic).
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
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms > 0 ? sms : 1;
  }();
  return n;
}

template <int R, GemvIn IN, GemvOut OUT, bool V, bool P = false>
void launch(const GemvParams& p, cudaStream_t s) {
  auto* kernel = [] {
    if constexpr (V) return gemv_variant_kernel<R, IN, OUT, P>;
    else return gemv_kernel<R, IN, OUT>;
  }();
  const size_t smem = IN == GemvIn::rmsnorm ? size_t(p.rows) * p.k * 2 : 0;
  if (smem > 48 * 1024) {
    static bool raised = false;  // once per instantiation (the limit is per kernel), once it succeeded
    if (!raised) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_staged_bytes()));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fail_runtime(std::string("the gemv's shared-memory limit could not be raised: ") + cudaGetErrorString(e));
      }
      raised = true;
    }
  }
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? 1 : rows_per_warp<OUT>();
  int blocks;
  if constexpr (!V) {
    const int groups = (p.out + U - 1) / U;
    blocks = std::max(1, std::min((groups + kWarps - 1) / kWarps, sm_count() * 4));
  } else {
    const int S = (OUT == GemvOut::swiglu_bf16 || OUT == GemvOut::rope_bf16) ? 1 : p.split;
    const int groups = (p.out + U - 1) / U, per_tile = kWarps / S;
    const int tiles = OUT == GemvOut::rope_bf16 ? p.out / 8 : (groups + per_tile - 1) / per_tile;
    // One resident wave at most: the blocks per SM this kernel's registers and shared memory allow (queried once
    // per instantiation and staged size, on the first, eager step: nothing but the launch happens under capture).
    static size_t queried_smem = ~size_t(0);
    static int per_sm = 1;
    if (smem != queried_smem) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1) {
        cudaGetLastError();
        per_sm = 1;
      }
      queried_smem = smem;
    }
    blocks = std::max(1, std::min(tiles, sm_count() * per_sm));
  }
  const cudaError_t e = launch_pdl(kernel, dim3(blocks), dim3(kThreads), smem, s, p);
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

template <GemvIn IN, GemvOut OUT, bool V, bool P = false>
void launch_rows_v(const GemvParams& p, cudaStream_t s) {
  if (p.rows <= 1) launch<1, IN, OUT, V, P>(p, s);
  else if (p.rows <= 2) launch<2, IN, OUT, V, P>(p, s);
  else if (p.rows <= 4) launch<4, IN, OUT, V, P>(p, s);
  else launch<8, IN, OUT, V, P>(p, s);
}

// The fused RoPE and argmax epilogues exist only in the variant kernel; the others in both.
template <GemvIn IN, GemvOut OUT>
void launch_rows(const GemvParams& p, cudaStream_t s) {
  constexpr bool kOnlyVariant = OUT == GemvOut::rope_bf16 || OUT == GemvOut::f32_argmax;
  if (p.preload) launch_rows_v<IN, OUT, true, true>(p, s);
  else if (kOnlyVariant || p.split > 1 || p.late_trigger) launch_rows_v<IN, OUT, true, false>(p, s);
  else if constexpr (!kOnlyVariant) launch_rows_v<IN, OUT, false>(p, s);
}

}  // namespace

int gemv_auto_split(int out, int k) {
  const int kc = k / 8;
  int s = 1;
  while (s < 8 && kc / (2 * s) >= 2 * 32 * 8 && int64_t(out) * 2 * s <= int64_t(sm_count()) * 4 * kWarps) s *= 2;
  return s;
}

bool gemv_supported(int rows, int k, bool staged) {
  return rows >= 1 && rows <= kGemvMaxRows && k > 0 && k % 8 == 0 && (!staged || size_t(rows) * k * 2 <= max_staged_bytes());
}

void gemv(const GemvParams& p, void* stream) {
  if (!gemv_supported(p.rows, p.k, p.in == GemvIn::rmsnorm)) {
    fail("gemv with " + std::to_string(p.rows) + " rows and k = " + std::to_string(p.k) + "; expected 1.." +
         std::to_string(kGemvMaxRows) + " rows, k a multiple of 8 and, with the RMSNorm prologue, rows x k x 2 bytes "
         "within " + std::to_string(max_staged_bytes()) + " bytes of shared memory");
  }
  if (p.split != 1 && p.split != 2 && p.split != 4 && p.split != 8) fail("gemv split " + std::to_string(p.split) + "; expected 1, 2, 4 or 8");
  if (p.epi == GemvOut::rope_bf16) {
    const GemvRope& r = p.rope;
    if (r.head_dim <= 0 || r.head_dim % 8 != 0 || p.out != (r.heads + 2 * r.kv_heads) * r.head_dim || !r.cos || !r.sin ||
        !r.pos || !r.cache_row || !r.k_cache || !r.v_cache) {
      fail("gemv with the RoPE epilogue needs head_dim a multiple of 8, out = (heads + 2 kv_heads) * head_dim and every "
           "table and cache pointer");
    }
  }
  if (p.epi == GemvOut::f32_argmax && !p.argmax_keys) fail("gemv with the argmax epilogue needs argmax_keys");
  if (p.stream && (p.stream_stages < 8 || p.stream_stages % 8 != 0))
    fail("gemv stream_stages " + std::to_string(p.stream_stages) + "; expected a multiple of 8 (a ring slot per consumer warp)");
  if (p.out <= 0) return;
  if (p.stream && gemv_stream_supported(p)) return gemv_stream(p, stream);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The combinations the engine uses: QKV, gate/up + SwiGLU and the LM head read the normed stream; O and down add.
  if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::bf16) launch_rows<GemvIn::rmsnorm, GemvOut::bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::swiglu_bf16) launch_rows<GemvIn::rmsnorm, GemvOut::swiglu_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32) launch_rows<GemvIn::rmsnorm, GemvOut::f32>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::rope_bf16) launch_rows<GemvIn::rmsnorm, GemvOut::rope_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32_argmax) launch_rows<GemvIn::rmsnorm, GemvOut::f32_argmax>(p, s);
  else if (p.in == GemvIn::bf16 && p.epi == GemvOut::add_f32) launch_rows<GemvIn::bf16, GemvOut::add_f32>(p, s);
  else fail("gemv: this prologue/epilogue combination is not instantiated");
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

}  // namespace flashlite::engine::cuda_ops
