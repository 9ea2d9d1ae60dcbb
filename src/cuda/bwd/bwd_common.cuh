#pragma once
// Device helpers of both CUDA backward families (the mma.sync kernels of bwd_kernels.cuh and the Hopper kernels of
// src/cuda/bwd_hopper/): a sequence's rows, which q blocks see a key block, the per-row terms and P / dS of a score.
#include <cuda_runtime.h>

#include "cuda/bwd/bwd_params.h"
#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/row_mask.h"

namespace flashlite::cuda_bwd {

using cuda_fwd::kLog2e;

// One sequence's lengths and first rows in the tensors.
struct SeqInfo {
  int sq, sk;
  int64_t q_row0, k_row0, tb;
};

__device__ __forceinline__ SeqInfo seq_info(const BwdParams& p, int b) {
  if (p.cu_q) return {p.cu_q[b + 1] - p.cu_q[b], p.cu_k[b + 1] - p.cu_k[b], p.cu_q[b], p.cu_k[b], 0};
  return {p.seq_q, p.seq_k, 0, 0, b};
}

// Whether query rows [i0, i1) may see any key of [j0, j1) (the inverse of the forward's tile skip; coarse: entries
// inside it that the mask hides are masked per element).
__device__ __forceinline__ bool q_block_sees_keys(const MaskParams& m, int i0, int i1, int j0, int j1, int sq,
                                                  int sk) {
  if (j0 < m.sink_tokens && j0 < causal_key_end(m, i1, sq, sk)) return true;
  const KeyRange r = window_key_range(m, i0, i1, sq, sk);
  return r.begin < j1 && j0 < r.end;
}

// The two element-wise passes of a score x (raw dot product) given its row's L log2e: `prob_in_place` returns P and
// leaves P times the softcap's tanh' in x (0 where the mask hides the score), so that `grad_of` can form dS from it
// and dP = dout . v once that product lands (the Hopper kernels run the first pass while dP is still in flight).
__device__ __forceinline__ float prob_in_place(const BwdParams& p, float& x, float l2, bool visible) {
  float logit2, dfac = 1.f;
  if (p.softcap > 0.f) {
    const float th = cuda_fwd::accurate_tanh(x * p.softcap_pre);
    logit2 = th * p.softcap_post;
    dfac = 1.f - th * th;
  } else {
    logit2 = x * p.scale_log2;
  }
  const float pr = visible ? cuda_fwd::fast_exp2(logit2 - l2) : 0.f;
  x = pr * dfac;
  return pr;
}
// dS = P tanh' (dP - D); exactly 0 where P is (a hidden score's dP is never looked at).
__device__ __forceinline__ float grad_of(float p_dfac, float dp, float delta) {
  return p_dfac == 0.f ? 0.f : p_dfac * (dp - delta);
}

// The terms of query row i (within its sequence) that every score of the row needs: L log2e, D and the visible key
// interval [lo, hi] plus the sink keys [0, se). Rows past the sequence see nothing; a row with LSE -inf (no key, no
// sink) gets L log2e = +inf so that P = exp2(x - inf) = 0, not exp(-inf + inf).
struct RowTerms {
  float l2, d;
  int lo, hi, se;
};
__device__ __forceinline__ RowTerms row_terms(const BwdParams& p, const SeqInfo& s, const float* lse,
                                              const float* delta, int i) {
  RowTerms r{INFINITY, 0.f, 1, 0, 0};
  if (i < s.sq) {
    const float L = lse[(s.q_row0 + i) * p.lse_stride.seq];
    r.l2 = L == -INFINITY ? INFINITY : L * kLog2e;
    r.d = delta[i];
    const cuda_fwd::RowKeys rk = cuda_fwd::row_keys(p.mask, i, s.sq, s.sk);
    r.lo = cuda_fwd::clamp_to(rk.lo, 0, s.sk);
    r.hi = cuda_fwd::clamp_to(rk.hi, -1, s.sk - 1);
    r.se = cuda_fwd::clamp_to(rk.sink_end, 0, s.sk);
  }
  return r;
}

// One n8 block of a tile (x: its four S accumulator values, rows g and g + 8 of the warp's 16 against two adjacent
// keys key0, key0 + 1; rt[0], rt[1]: the two rows' terms), first pass: x becomes P tanh' in place.
__device__ __forceinline__ void probs_block(const BwdParams& p, const RowTerms rt[2], int key0, bool full, float* x) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + e;
      const bool vis = full || (key >= rt[r].lo && key <= rt[r].hi) || key < rt[r].se;
      prob_in_place(p, x[2 * r + e], rt[r].l2, vis);
    }
  }
}
// Second pass: dS from the first pass's x and the block's four dP values, packed to 16 bits as an mma A fragment's
// two registers.
template <class T>
__device__ __forceinline__ void grads_block(uint32_t dsk[2], const RowTerms rt[2], const float* x, const float* dp) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dsk[r] = cuda_fwd::pack2<T>(grad_of(x[2 * r], dp[2 * r], rt[r].d), grad_of(x[2 * r + 1], dp[2 * r + 1], rt[r].d));
  }
}
// Both passes at once (the mma.sync dQ kernel, whose dP is in registers already).
template <class T>
__device__ __forceinline__ void pack_ds_block(uint32_t dsk[2], const BwdParams& p, const RowTerms rt[2], int key0,
                                              bool full, const float* x, const float* dp) {
  float v[4] = {x[0], x[1], x[2], x[3]};
  probs_block(p, rt, key0, full, v);
  grads_block<T>(dsk, rt, v, dp);
}

// One n8 block of a transposed tile (x: its four S^T values, a thread's two key rows key0, key0 + 8 against two
// adjacent q columns col0, col0 + 1 of a q block whose terms lie at `terms` as both dK / dV kernels keep them in
// shared memory: BM floats each of L log2e and D, then BM ints each of the visible interval's lo and hi and the sink
// end), first pass: P^T packed to 16 bits as an mma A fragment's two registers, and x becomes P tanh' in place.
template <class T, int BM>
__device__ __forceinline__ void probs_transposed_block(uint32_t pk[2], const BwdParams& p, const float* terms,
                                                       int key0, int col0, bool full, float* x) {
  const int* it = reinterpret_cast<const int*>(terms + 2 * BM);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    float pr[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = col0 + e;
      const bool vis = full || (key >= it[col] && key <= it[BM + col]) || key < it[2 * BM + col];
      pr[e] = prob_in_place(p, x[2 * r + e], terms[col], vis);
    }
    pk[r] = cuda_fwd::pack2<T>(pr[0], pr[1]);
  }
}
// Second pass: dS^T from the first pass's x and the block's four dP^T values, packed as the A fragment.
template <class T, int BM>
__device__ __forceinline__ void grads_transposed_block(uint32_t dsk[2], const float* terms, int col0, const float* x,
                                                       const float* dp) {
  const float d0 = terms[BM + col0], d1 = terms[BM + col0 + 1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dsk[r] = cuda_fwd::pack2<T>(grad_of(x[2 * r], dp[2 * r], d0), grad_of(x[2 * r + 1], dp[2 * r + 1], d1));
  }
}
// Both passes at once (the mma.sync dK / dV kernel).
template <class T, int BM>
__device__ __forceinline__ void pack_transposed_block(uint32_t pk[2], uint32_t dsk[2], const BwdParams& p,
                                                      const float* terms, int key0, int col0, bool full,
                                                      const float* x, const float* dp) {
  float v[4] = {x[0], x[1], x[2], x[3]};
  probs_transposed_block<T, BM>(pk, p, terms, key0, col0, full, v);
  grads_transposed_block<T, BM>(dsk, terms, col0, v, dp);
}

}  // namespace flashlite::cuda_bwd
