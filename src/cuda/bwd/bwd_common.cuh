#pragma once
// Device helpers of both CUDA backward families (the mma.sync kernels of bwd_kernels.cuh and the Hopper kernels of
// src/cuda/bwd_hopper/): a sequence's rows, which q blocks see a key block, the per-row terms and P / dS of a score.
#include <cuda_runtime.h>

#include "common/grid_order.h"
#include "cuda/bwd/bwd_params.h"
#include "cuda/fwd/fwd_common.cuh"
#include "cuda/fwd/row_mask.h"

namespace flashlite::cuda_bwd {

using cuda_fwd::kLog2e;

// A CTA's place in a backward grid (common/grid_order.h).
__device__ __forceinline__ GridPlace grid_place(int tiles, int heads, bool lead) {
  return flashlite::grid_place(blockIdx.x, gridDim.x, tiles, heads, lead);
}

// One sequence's lengths and first rows in the tensors.
struct SeqInfo {
  int sq, sk;
  int64_t q_row0, k_row0, tb;
};

__device__ __forceinline__ SeqInfo seq_info(const BwdParams& p, int b) {
  if (p.cu_q) return {p.cu_q[b + 1] - p.cu_q[b], p.cu_k[b + 1] - p.cu_k[b], p.cu_q[b], p.cu_k[b], 0};
  return {p.seq_q, p.seq_k, 0, 0, b};
}

// A dK / dV CTA's work item x (0 <= x < group * nq, nq = qr.end - qr.begin): the q head within the group and the first
// q row of its block, head-major over the q blocks qr that see the CTA's keys; no division for GQA group 1 (a division
// per item cost the Hopper kernel's loop measurably).
struct QItem {
  int hg, i0;
};
__device__ __forceinline__ QItem q_item(int x, const BlockRange& qr, int group, int bm) {
  if (group == 1) return {0, (qr.begin + x) * bm};
  const int nq = qr.end - qr.begin;
  return {x / nq, (qr.begin + x % nq) * bm};
}

// The two element-wise passes of a score x (raw dot product) given its row's L log2e: `prob_in_place` returns P and
// leaves P times the softcap's tanh' in x (0 where the mask hides the score), so that `grad_of` can form dS from it
// and dP = dout . v once that product lands (the Hopper kernels run the first pass while dP is still in flight).
// SOFTCAP is a template argument so that a whole tile's pass is straight-line code: a branch per score serialises
// the scores' exp2 chains (measured: the Hopper dK / dV kernel spent most of its time there).
template <bool SOFTCAP>
__device__ __forceinline__ float prob_in_place(const BwdParams& p, float& x, float l2, bool visible) {
  float logit2, dfac = 1.f;
  if constexpr (SOFTCAP) {
    const float th = cuda_fwd::accurate_tanh(x * p.softcap_pre);
    logit2 = th * p.softcap_post;
    dfac = 1.f - th * th;
  } else {
    logit2 = x * p.scale_log2;
  }
  const float pr = visible ? cuda_fwd::fast_exp2(logit2 - l2) : 0.f;
  x = visible ? pr * dfac : 0.f;  // (a hidden NaN score's tanh' is NaN: 0 x NaN would reach dS)
  return pr;
}
// dS = P tanh' (dP - D). MASKED: exactly 0 where P is, so that a hidden score's dP is never looked at (a non-finite
// value of a key the row cannot see stays out of its gradient); where every score is visible the product alone, as
// the formula reads.
template <bool MASKED = true>
__device__ __forceinline__ float grad_of(float p_dfac, float dp, float delta) {
  if constexpr (MASKED) return p_dfac == 0.f ? 0.f : p_dfac * (dp - delta);
  return p_dfac * (dp - delta);
}
// Whether a row with visible interval [lo, hi] and sink keys [0, se) sees `key`, without branches.
__device__ __forceinline__ bool key_visible(int key, int lo, int hi, int se) {
  return ((key >= lo) & (key <= hi)) | (key < se);
}

// The terms of query row i (within its sequence) that every score of the row needs: L log2e, D and the visible key
// interval [lo, hi] plus the sink keys [0, se). Rows past the sequence see nothing; a row with LSE -inf (no key, no
// sink) gets L log2e = +inf so that P = exp2(x - inf) = 0, not exp(-inf + inf).
struct RowTerms {
  float l2, d;
  int lo, hi, se;
};
// The same from the row's LSE and D already loaded (the Hopper dK / dV kernel loads them an item ahead).
__device__ __forceinline__ RowTerms row_terms_of(const BwdParams& p, const SeqInfo& s, int i, float L, float d) {
  RowTerms r{INFINITY, 0.f, 1, 0, 0};
  if (i < s.sq) {
    r.l2 = L == -INFINITY ? INFINITY : L * kLog2e;
    r.d = d;
    const cuda_fwd::RowKeys rk = cuda_fwd::row_keys(p.mask, i, s.sq, s.sk);
    r.lo = cuda_fwd::clamp_to(rk.lo, 0, s.sk);
    r.hi = cuda_fwd::clamp_to(rk.hi, -1, s.sk - 1);
    r.se = cuda_fwd::clamp_to(rk.sink_end, 0, s.sk);
  }
  return r;
}
__device__ __forceinline__ RowTerms row_terms(const BwdParams& p, const SeqInfo& s, const float* lse,
                                              const float* delta, int i) {
  return i < s.sq ? row_terms_of(p, s, i, lse[(s.q_row0 + i) * p.lse_stride.seq], delta[i])
                  : row_terms_of(p, s, i, 0.f, 0.f);
}

// The element-wise step of both CUDA families, a whole tile per pass (x: this thread's S accumulator, NB n8 blocks of
// four values, contiguous), straight-line code for each of the four (softcap, masked) cases, chosen once per tile.
//
// Row-major tile (dQ kernels; rows g and g + 8 of the warp's 16 with terms rt[0], rt[1]; block nb's keys
// key0 + nb * 8 + {0, 1}), first pass: x becomes P tanh' in place.
template <int NB, bool SOFTCAP, bool MASKED>
__device__ __forceinline__ void probs_tile_as(const BwdParams& p, const RowTerms rt[2], int key0, float* x) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool vis = !MASKED || key_visible(key0 + nb * 8 + e, rt[r].lo, rt[r].hi, rt[r].se);
        prob_in_place<SOFTCAP>(p, x[nb * 4 + 2 * r + e], rt[r].l2, vis);
      }
}
template <int NB>
__device__ __forceinline__ void probs_tile(const BwdParams& p, const RowTerms rt[2], int key0, bool full, float* x) {
  if (p.softcap > 0.f) {
    full ? probs_tile_as<NB, true, false>(p, rt, key0, x) : probs_tile_as<NB, true, true>(p, rt, key0, x);
  } else {
    full ? probs_tile_as<NB, false, false>(p, rt, key0, x) : probs_tile_as<NB, false, true>(p, rt, key0, x);
  }
}
// Second pass: dS from the first pass's x and the tile's dP, packed to 16 bits as A fragments.
template <class T, int NB, bool MASKED>
__device__ __forceinline__ void grads_tile_as(uint32_t (&dsk)[NB][2], const RowTerms rt[2], const float* x,
                                              const float* dp) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = nb * 4 + 2 * r;
      dsk[nb][r] = cuda_fwd::pack2<T>(grad_of<MASKED>(x[i], dp[i], rt[r].d),
                                      grad_of<MASKED>(x[i + 1], dp[i + 1], rt[r].d));
    }
}
template <class T, int NB>
__device__ __forceinline__ void grads_tile(uint32_t (&dsk)[NB][2], const RowTerms rt[2], bool full, const float* x,
                                           const float* dp) {
  full ? grads_tile_as<T, NB, false>(dsk, rt, x, dp) : grads_tile_as<T, NB, true>(dsk, rt, x, dp);
}

// The visibility of keys key0 and key0 + 8 to the two q columns col, col + 1 of a transposed tile, from the columns'
// visible intervals (lo, hi, sink end) at `it` (BM ints each): vis[r] = {column col, column col + 1} for key0 + 8 r.
template <int BM, bool MASKED>
struct ColumnVisibility {
  bool vis[2][2] = {{true, true}, {true, true}};
  __device__ __forceinline__ ColumnVisibility(const int* it, int col, int key0) {
    if constexpr (MASKED) {
      const int2 lo = *reinterpret_cast<const int2*>(it + col);
      const int2 hi = *reinterpret_cast<const int2*>(it + BM + col);
      const int2 se = *reinterpret_cast<const int2*>(it + 2 * BM + col);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        vis[r][0] = key_visible(key0 + 8 * r, lo.x, hi.x, se.x);
        vis[r][1] = key_visible(key0 + 8 * r, lo.y, hi.y, se.y);
      }
    }
  }
};

// Transposed tile (dK / dV kernels; key rows key0, key0 + 8; block nb's q columns nb * 8 + t2 + {0, 1}, whose terms
// lie at `terms` as both dK / dV kernels keep them in shared memory: BM floats each of L log2e and D, then BM ints
// each of the visible interval's lo and hi and the sink end), first pass: P^T packed as A fragments, x becomes
// P tanh'.
template <class T, int BM, int NB, bool SOFTCAP, bool MASKED>
__device__ __forceinline__ void probs_transposed_tile_as(uint32_t (&pk)[NB][2], const BwdParams& p,
                                                         const float* terms, int key0, int t2, float* x) {
  const int* it = reinterpret_cast<const int*>(terms + 2 * BM);
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const int col = nb * 8 + t2;
    const float2 l2 = *reinterpret_cast<const float2*>(terms + col);
    const ColumnVisibility<BM, MASKED> cv(it, col, key0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float p0 = prob_in_place<SOFTCAP>(p, x[nb * 4 + 2 * r], l2.x, cv.vis[r][0]);
      const float p1 = prob_in_place<SOFTCAP>(p, x[nb * 4 + 2 * r + 1], l2.y, cv.vis[r][1]);
      pk[nb][r] = cuda_fwd::pack2<T>(p0, p1);
    }
  }
}
template <class T, int BM, int NB>
__device__ __forceinline__ void probs_transposed_tile(uint32_t (&pk)[NB][2], const BwdParams& p, const float* terms,
                                                      int key0, int t2, bool full, float* x) {
  if (p.softcap > 0.f) {
    full ? probs_transposed_tile_as<T, BM, NB, true, false>(pk, p, terms, key0, t2, x)
         : probs_transposed_tile_as<T, BM, NB, true, true>(pk, p, terms, key0, t2, x);
  } else {
    full ? probs_transposed_tile_as<T, BM, NB, false, false>(pk, p, terms, key0, t2, x)
         : probs_transposed_tile_as<T, BM, NB, false, true>(pk, p, terms, key0, t2, x);
  }
}
// Second pass: dS^T from the first pass's x and the tile's dP^T, packed as A fragments.
template <class T, int BM, int NB, bool MASKED>
__device__ __forceinline__ void grads_transposed_tile_as(uint32_t (&dsk)[NB][2], const float* terms, int t2,
                                                         const float* x, const float* dp) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const float2 d = *reinterpret_cast<const float2*>(terms + BM + nb * 8 + t2);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = nb * 4 + 2 * r;
      dsk[nb][r] = cuda_fwd::pack2<T>(grad_of<MASKED>(x[i], dp[i], d.x), grad_of<MASKED>(x[i + 1], dp[i + 1], d.y));
    }
  }
}
template <class T, int BM, int NB>
__device__ __forceinline__ void grads_transposed_tile(uint32_t (&dsk)[NB][2], const float* terms, int t2, bool full,
                                                      const float* x, const float* dp) {
  full ? grads_transposed_tile_as<T, BM, NB, false>(dsk, terms, t2, x, dp)
       : grads_transposed_tile_as<T, BM, NB, true>(dsk, terms, t2, x, dp);
}

// Both passes at once, element by element (P^T and dS^T packed as A fragments): a thread's S^T and dP^T registers are
// spent as the fragments fill, for tiles whose two accumulators and both fragments would not fit side by side.
template <class T, int BM, int NB, bool SOFTCAP, bool MASKED>
__device__ __forceinline__ void probs_grads_transposed_tile_as(uint32_t (&pk)[NB][2], uint32_t (&dsk)[NB][2],
                                                               const BwdParams& p, const float* terms, int key0,
                                                               int t2, float* x, const float* dp) {
  const int* it = reinterpret_cast<const int*>(terms + 2 * BM);
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    const int col = nb * 8 + t2;
    const float2 l2 = *reinterpret_cast<const float2*>(terms + col);
    const float2 d = *reinterpret_cast<const float2*>(terms + BM + col);
    const ColumnVisibility<BM, MASKED> cv(it, col, key0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = nb * 4 + 2 * r;
      const float p0 = prob_in_place<SOFTCAP>(p, x[i], l2.x, cv.vis[r][0]);
      const float p1 = prob_in_place<SOFTCAP>(p, x[i + 1], l2.y, cv.vis[r][1]);
      pk[nb][r] = cuda_fwd::pack2<T>(p0, p1);
      dsk[nb][r] = cuda_fwd::pack2<T>(grad_of<MASKED>(x[i], dp[i], d.x), grad_of<MASKED>(x[i + 1], dp[i + 1], d.y));
    }
  }
}
template <class T, int BM, int NB>
__device__ __forceinline__ void probs_grads_transposed_tile(uint32_t (&pk)[NB][2], uint32_t (&dsk)[NB][2],
                                                            const BwdParams& p, const float* terms, int key0, int t2,
                                                            bool full, float* x, const float* dp) {
  if (p.softcap > 0.f) {
    full ? probs_grads_transposed_tile_as<T, BM, NB, true, false>(pk, dsk, p, terms, key0, t2, x, dp)
         : probs_grads_transposed_tile_as<T, BM, NB, true, true>(pk, dsk, p, terms, key0, t2, x, dp);
  } else {
    full ? probs_grads_transposed_tile_as<T, BM, NB, false, false>(pk, dsk, p, terms, key0, t2, x, dp)
         : probs_grads_transposed_tile_as<T, BM, NB, false, true>(pk, dsk, p, terms, key0, t2, x, dp);
  }
}

}  // namespace flashlite::cuda_bwd
