#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/pdl.cuh"
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

// Weights are read once: skip L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// bf16 pairs in a 32-bit word: element 2i in the low half. A bf16 is the top half of the fp32 with the same value.
__device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

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
#pragma unroll
      for (int t = 0; t < kUnroll; ++t) {
        const int c = c0 + 32 * t;
        if (c < kc) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint4 xv = xrow[r][c];
#pragma unroll
            for (int j = 0; j < NW; ++j) acc[j][r] = dot8(wv[t][j], xv, acc[j][r]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[j][r] += __shfl_xor_sync(0xffffffffu, acc[j][r], o);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= p.rows) break;
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const int u = u0 + j;
          if (u >= p.out) break;
          const size_t at = size_t(r) * p.out + u;
          const float v = acc[j][r];
          if constexpr (OUT == GemvOut::bf16) {
            static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16(v);
          } else if constexpr (OUT == GemvOut::f32) {
            static_cast<float*>(p.y)[at] = v;
          } else if constexpr (OUT == GemvOut::add_f32) {
            static_cast<float*>(p.y)[at] += v;
          } else {
            const float up = acc[j + U][r];
            static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16(v / (1.f + __expf(-v)) * up);
          }
        }
      }
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

template <int R, GemvIn IN, GemvOut OUT>
void launch(const GemvParams& p, cudaStream_t s) {
  const size_t smem = IN == GemvIn::rmsnorm ? size_t(p.rows) * p.k * 2 : 0;
  if (smem > 48 * 1024) {
    static bool raised = false;  // once per instantiation (the limit is per kernel)
    if (!raised) {
      cudaFuncSetAttribute(gemv_kernel<R, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxStagedBytes));
      raised = true;
    }
  }
  constexpr int U = OUT == GemvOut::swiglu_bf16 ? 1 : rows_per_warp<OUT>();
  const int groups = (p.out + U - 1) / U;
  const int blocks = std::max(1, std::min((groups + kWarps - 1) / kWarps, sm_count() * 4));
  const cudaError_t e = launch_pdl(gemv_kernel<R, IN, OUT>, dim3(blocks), dim3(kThreads), smem, s, p);
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

template <GemvIn IN, GemvOut OUT>
void launch_rows(const GemvParams& p, cudaStream_t s) {
  if (p.rows <= 1) launch<1, IN, OUT>(p, s);
  else if (p.rows <= 2) launch<2, IN, OUT>(p, s);
  else if (p.rows <= 4) launch<4, IN, OUT>(p, s);
  else launch<8, IN, OUT>(p, s);
}

}  // namespace

bool gemv_supported(int rows, int k) {
  return rows >= 1 && rows <= kGemvMaxRows && k > 0 && k % 8 == 0 && size_t(rows) * k * 2 <= kMaxStagedBytes;
}

void gemv(const GemvParams& p, void* stream) {
  if (!gemv_supported(p.rows, p.k)) {
    fail("gemv with " + std::to_string(p.rows) + " rows and k = " + std::to_string(p.k) + "; expected 1.." +
         std::to_string(kGemvMaxRows) + " rows and k a multiple of 8");
  }
  if (p.out <= 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The combinations the engine uses: QKV, gate/up + SwiGLU and the LM head read the normed stream; O and down add.
  if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::bf16) launch_rows<GemvIn::rmsnorm, GemvOut::bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::swiglu_bf16) launch_rows<GemvIn::rmsnorm, GemvOut::swiglu_bf16>(p, s);
  else if (p.in == GemvIn::rmsnorm && p.epi == GemvOut::f32) launch_rows<GemvIn::rmsnorm, GemvOut::f32>(p, s);
  else if (p.in == GemvIn::bf16 && p.epi == GemvOut::add_f32) launch_rows<GemvIn::bf16, GemvOut::add_f32>(p, s);
  else fail("gemv: this prologue/epilogue combination is not instantiated");
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_runtime(std::string("CUDA launch of gemv failed: ") + cudaGetErrorString(e));
}

}  // namespace flashlite::engine::cuda_ops
