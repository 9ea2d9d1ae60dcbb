#pragma once
// The PTX wrappers of the mma.sync kernels (forward, backward, decode), each written once: cp.async, shared stores,
// ldmatrix, mma.sync m16n8k16, ex2, the quad / warp shuffles, and load_chunk. The forward (cuda_fwd,
// src/cuda/fwd/fwd_common.cuh) namespace takes them in by using-declarations, decode (cuda_decode,
// src/cuda/decode/decode_ptx.cuh) by a using-directive.
// (mbarrier: src/cuda/common/mbarrier.cuh; programmatic dependent launch: src/cuda/common/pdl.cuh; Hopper's TMA and
// wgmma: src/cuda/fwd_hopper/hopper_ptx.cuh.)
//
// Shared-memory operands are 32-bit shared-window addresses (smem_addr), so that the tile offsets of unrolled loops
// fold into the instructions' immediate offsets instead of occupying registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashlite::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------ cp.async (global -> shared)

// 16 bytes, L2 only (.cg: streamed data skips L1); src_bytes = 0 writes zeros (rows past the sequence end).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4 bytes through L1 (.ca: the only path for sizes below 16).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
// cp_async_16 with an L2 prefetch hint: a miss fetches the whole aligned 256-byte block (one K/V row of head_dim 128;
// the rest of the row is requested by the neighbouring threads of the same pass anyway), larger DRAM bursts.
__device__ __forceinline__ void cp_async_16_l2_256(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// The same two copies with an L2 cache policy (l2_evict_first_policy below).
__device__ __forceinline__ void cp_async_16_l2_256_policy(uint32_t dst, const void* src, int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(pol));
}
__device__ __forceinline__ void cp_async_16_policy(uint32_t dst, const void* src, int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
               "l"(pol));
}
// For data read once: its L2 lines are the first to go, so smaller hot data (lengths, q, partials) stays.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ------------------------------------------------------------------ shared stores

__device__ __forceinline__ void st_shared_4(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v));
}
__device__ __forceinline__ void st_shared_f32(uint32_t dst, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(dst), "f"(v));
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t dst, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dst), "f"(a), "f"(b));
}
__device__ __forceinline__ void st_shared_16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// ------------------------------------------------------------------ ldmatrix, mma.sync

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D(16x8, f32) += A(16x16, row) * B(16x8, col), fp16 or bf16 operands.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (lo = first, the lower column index), round to nearest even.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ------------------------------------------------------------------ ex2, shuffles

// 2^x in one MUFU instruction (ex2.approx.ftz); exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes of a quad (the lanes holding one row of an mma fragment) and over a warp.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// One 16-byte chunk of 16-bit elements global -> shared; zeros when !ok (then `safe`, any valid address, stands in
// for src). vec: cp.async (16-byte aligned rows); else eight 2-byte loads and one 16-byte shared store (synchronous,
// the same barriers order it).
__device__ __forceinline__ void load_chunk(uint32_t d, const void* src, const void* safe, bool ok, bool vec) {
  if (vec) {
    cp_async_16(d, ok ? src : safe, ok ? 16 : 0);
  } else {
    union {
      uint4 v;
      unsigned short h[8];
    } u;
    u.v = make_uint4(0, 0, 0, 0);
    if (ok) {
      const unsigned short* e = reinterpret_cast<const unsigned short*>(src);
#pragma unroll
      for (int x = 0; x < 8; ++x) u.h[x] = e[x];
    }
    st_shared_16(d, u.v);
  }
}

}  // namespace flashlite::cuda
