#pragma once
// Device helpers shared by the fused forward kernels: which work a block owns, which key tiles it must visit,
// and the few PTX instructions the tensor-core kernel uses (cp.async, ldmatrix, mma.sync, ex2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mask.h"
#include "cuda/fwd/block_order.h"
#include "cuda/fwd/fwd_params.h"

namespace flashlite::cuda_fwd {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// ------------------------------------------------------------------ work decomposition

// One block: a tile of query rows of one head of one sequence.
struct BlockWork {
  int seq;          // sequence (batch index, or varlen sequence)
  int head;         // q head
  int tile;         // query tile within the sequence
  int sq, sk;       // lengths of this sequence
  int64_t q_row0;   // first tensor row of the sequence (varlen), 0 when padded
  int64_t k_row0;
  int64_t tb;       // tensor batch index: seq when padded, 0 when varlen
};

// Length of sequence b in a KV cache, from the cache's device index (prefill, CACHE kernels).
__device__ __forceinline__ int cache_length(const FwdParams& p, int b) {
  if (!p.kv_paged) return p.kv_seq_lens[b];
  const int pages = p.kv_page_indptr[b + 1] - p.kv_page_indptr[b];
  return pages == 0 ? 0 : (pages - 1) * p.page_size + p.kv_last_page_len[b];
}

// 1-D grid over (sequence, head) pairs and tile ranks (block_order.h). Pair-major (default): a pair's tiles run side by
// side and share its K/V in L2 (neighbouring heads share a GQA group's K/V too). Rank-major (causal): rank 0 of every
// pair of a group first; with reverse_tiles a sequence's heaviest query tile (its last) has rank 0, so the longest
// blocks start first (longest-job-first balancing across the SMs). Returns false when the rank lies past the
// sequence's tiles.
// CACHE (prefill): q rows as usual (padded or ragged), keys from the cache: sk = the sequence's cache length and
// k_row0 = 0 (the kernel addresses K/V through the sequence index, contiguous or paged).
template <bool CACHE = false>
__device__ __forceinline__ bool decode_block(const FwdParams& p, int block_rows, BlockWork& w) {
  const PairRank pr = block_pair_rank(int(blockIdx.x), p.q_heads * p.batch, p.q_tiles, p.rank_major, p.rank_group);
  const int pair = pr.pair, rank = pr.rank;
  w.head = pair % p.q_heads;
  w.seq = pair / p.q_heads;
  if constexpr (CACHE) {
    w.sk = cache_length(p, w.seq);
    w.k_row0 = 0;
    if (p.varlen == VarlenMode::padded) {
      w.sq = p.seq_q;
      w.q_row0 = 0;
      w.tb = w.seq;
    } else {
      const int* cq = p.varlen == VarlenMode::inline_table ? p.cu_inline[0] : p.cu_dev;
      w.q_row0 = cq[w.seq];
      w.sq = cq[w.seq + 1] - cq[w.seq];
      w.tb = 0;
    }
  } else if (p.varlen == VarlenMode::padded) {
    w.sq = p.seq_q;
    w.sk = p.seq_k;
    w.q_row0 = w.k_row0 = 0;
    w.tb = w.seq;
  } else {
    const int* cq = p.varlen == VarlenMode::inline_table ? p.cu_inline[0] : p.cu_dev;
    const int* ck = p.varlen == VarlenMode::inline_table ? p.cu_inline[1] : p.cu_dev + p.batch + 1;
    w.q_row0 = cq[w.seq];
    w.k_row0 = ck[w.seq];
    w.sq = cq[w.seq + 1] - cq[w.seq];
    w.sk = ck[w.seq + 1] - ck[w.seq];
    w.tb = 0;
  }
  const int tiles = (w.sq + block_rows - 1) / block_rows;
  if (rank >= tiles) return false;
  w.tile = p.reverse_tiles ? tiles - 1 - rank : rank;
  return true;
}

// The key tiles a block visits, in order: first the tiles holding sink tokens, then the tiles of the window/causal
// range that were not already visited. Tiles outside both are never loaded or computed.
struct KeyTiles {
  int n_sink;     // tiles [0, n_sink)
  int win_first;  // then tiles win_first, win_first + 1, ...
  int count;      // total tiles
  __device__ __forceinline__ int tile(int n) const { return n < n_sink ? n : win_first + (n - n_sink); }
};

__device__ __forceinline__ KeyTiles key_tiles(const MaskParams& m, int i0, int i1, int sq, int sk, int bc) {
  const KeyRange w = window_key_range(m, i0, i1, sq, sk);
  int64_t sink_end = m.sink_tokens;
  const int64_t causal_end = causal_key_end(m, i1, sq, sk);
  if (causal_end < sink_end) sink_end = causal_end;
  if (sk < sink_end) sink_end = sk;
  KeyTiles t;
  t.n_sink = int((sink_end + bc - 1) / bc);
  int first = int(w.begin / bc), last = int((w.end + bc - 1) / bc);
  if (w.end <= w.begin) first = last = 0;
  if (first < t.n_sink) first = t.n_sink;
  t.win_first = first;
  t.count = t.n_sink + (last > first ? last - first : 0);
  return t;
}

// ------------------------------------------------------------------ PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory operands are 32-bit shared-window addresses, so that the tile offsets of unrolled loops fold into
// the instructions' immediate offsets instead of occupying registers.

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (rows past the sequence end).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void st_shared_16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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

// Two floats -> one register of two 16-bit values (lo = first, the lower column index).
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

// 2^x in one MUFU instruction; exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error ~1e-7 (tanh.approx's 2^-11 relative error would move a capped
// logit of 30 by 0.015, visible in the LSE).
__device__ __forceinline__ float accurate_tanh(float x) {
  const float e = fast_exp2(2.f * kLog2e * x);
  return 1.f - __fdividef(2.f, e + 1.f);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Final normalisation of one row: the sink logit (log2 units, -inf when absent) joins the denominator.
// m: running max (log2 units, -inf when no key was visible), l: running sum relative to m.
// Returns the factor that multiplies the accumulator; writes the natural-log LSE.
__device__ __forceinline__ float finish_row(float m, float l, float sink2, float& lse) {
  const float mf = fmaxf(m, sink2);
  const float fac = m == -INFINITY ? 0.f : fast_exp2(m - mf);
  const float lf = l * fac + (sink2 == -INFINITY ? 0.f : fast_exp2(sink2 - mf));
  // lf is NaN when a visible score or the sink logit was NaN or +inf (docs/numerics.md): out and LSE NaN.
  lse = lf == 0.f ? -INFINITY : (mf + __log2f(lf)) * kLn2;
  return lf == 0.f ? 0.f : fac / lf;
}

}  // namespace flashlite::cuda_fwd
