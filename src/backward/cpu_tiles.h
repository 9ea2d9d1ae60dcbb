#pragma once
// The CPU backward's tile work (FlashAttention-2's backward: P recomputed from the forward's LSE, D_i = dout_i . out_i
// given), included by one translation unit per instruction set (cpu_portable.cpp, cpu_avx2.cpp, cpu_avx512.cpp) with
// FL_BWD_ISA naming its namespace: the loops are written so the compiler vectorises them (innermost loops run over a
// contiguous row with no reduction), the flags of each unit pick the vector width.
//
// Two passes, each task owning what it writes, so nothing races and every run gives the same bits:
//   dkdv_task (one key block of one kv head): for each q head of the group and each q block that sees the keys,
//     S = scale Q K^T, P = exp(S - L), dV += P^T dO, dP = dO V^T, dS = P (dP - D) [softcap'], dK += scale dS^T Q;
//   dq_task (one q block of one q head): the same S, P, dP, dS over the key blocks it sees, dQ += scale dS K, and the
//     block's share of dsink = -sum_i exp(sink - L_i) D_i.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backward/cpu_backward.h"

#ifndef FL_BWD_ISA
#error "define FL_BWD_ISA before including backward/cpu_tiles.h"
#endif

namespace flashlite::cpu_backward::FL_BWD_ISA {
namespace {

// Rows [r0, r0 + n) of head h of one sequence, converted to fp32 into dst (n x d, row-major); rows past n zeroed.
void load_rows(const AttentionProblem& p, const void* base, const BSHStrides& st, const SequenceSlice& s,
               int64_t row0, int64_t h, int64_t n, int64_t rows, float* dst) {
  const int64_t d = p.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * d;
    if (r >= n) {
      std::fill(out, out + d, 0.f);
      continue;
    }
    const int64_t off = s.batch_index * st.batch + (row0 + r) * st.seq + h * st.head;
    if (p.dtype == DType::f32) {
      const float* src = static_cast<const float*>(base) + off;
      std::copy(src, src + d, out);
    } else {
      for (int64_t c = 0; c < d; ++c) out[c] = load_as_float(base, p.dtype, off + c);
    }
  }
}

// dst (cols x rows) = src (rows x cols) transposed.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// The shared middle of both passes for one (q block, key block) tile: S, P (into s), dP, then dS (into dp, scale
// included). q, dout: bq x d; kt, vt: d x bk (transposed); L, D: bq. Masked entries get P = 0 and dS = 0.
void tile_probs_and_ds(const AttentionProblem& p, const SequenceSlice& s, int64_t i0, int64_t bq, int64_t j0,
                       int64_t bk, const float* q, const float* dout, const float* kt, const float* vt, const float* L,
                       const float* D, float* sm, float* dp) {
  const int64_t d = p.head_dim;
  const float scale = float(p.scale), cap = float(p.softcap);
  std::fill(sm, sm + kTile * kTile, 0.f);
  std::fill(dp, dp + kTile * kTile, 0.f);
  for (int64_t i = 0; i < bq; ++i) {
    float* srow = sm + i * kTile;
    float* prow = dp + i * kTile;
    for (int64_t c = 0; c < d; ++c) {
      const float qc = q[i * d + c], oc = dout[i * d + c];
      const float* kc = kt + c * kTile;
      const float* vc = vt + c * kTile;
      for (int64_t j = 0; j < kTile; ++j) {
        srow[j] += qc * kc[j];
        prow[j] += oc * vc[j];
      }
    }
  }
  const bool full = i0 + bq <= s.seq_q && tile_fully_visible(p.mask, i0, i0 + bq, j0, j0 + bk, s.seq_q, s.seq_k);
  for (int64_t i = 0; i < bq; ++i) {
    float* srow = sm + i * kTile;
    float* prow = dp + i * kTile;
    // A row without keys and without a sink has L = -inf: its P is 0 (exp(-inf - -inf) would be NaN).
    const float li = L[i] == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity() : L[i];
    for (int64_t j = 0; j < kTile; ++j) {
      float x = srow[j] * scale, t = x;
      if (cap > 0.f) t = cap * std::tanh(x / cap);
      const bool vis = j < bk && (full || key_visible(p.mask, i0 + i, j0 + j, s.seq_q, s.seq_k));
      const float pr = vis ? std::exp(t - li) : 0.f;
      float ds = pr * (prow[j] - D[i]);
      if (cap > 0.f) ds *= 1.f - (t / cap) * (t / cap);
      srow[j] = pr;
      prow[j] = vis ? ds * scale : 0.f;
    }
  }
}

// Query rows [i0, i1) of a sequence that key block [j0, j1) may be visible to (the inverse of the forward's skip):
// coarse, whole q blocks; tiles inside it that the mask hides give P = 0.
bool q_block_sees_keys(const AttentionProblem& p, const SequenceSlice& s, int64_t i0, int64_t i1, int64_t j0,
                       int64_t j1) {
  if (j0 < p.mask.sink_tokens && j0 < causal_key_end(p.mask, i1, s.seq_q, s.seq_k)) return true;
  const KeyRange r = window_key_range(p.mask, i0, i1, s.seq_q, s.seq_k);
  return r.begin < j1 && j0 < r.end;
}

}  // namespace

void dkdv_task(const BackwardProblem& bp, const RowTerms& terms, int64_t b, int64_t kvh, int64_t kb, Scratch& w) {
  const AttentionProblem& p = bp.fwd;
  const SequenceSlice s = sequence_slice(p, b);
  const int64_t d = p.head_dim, j0 = kb * kTile, bk = std::min<int64_t>(kTile, s.seq_k - j0);
  w.resize(d);
  load_rows(p, p.k, p.k_stride, s, s.k_row0 + j0, kvh, bk, kTile, w.a.data());
  load_rows(p, p.v, p.v_stride, s, s.k_row0 + j0, kvh, bk, kTile, w.b.data());
  transpose(w.a.data(), kTile, d, w.kt.data());
  transpose(w.b.data(), kTile, d, w.vt.data());
  std::fill(w.acc1.begin(), w.acc1.end(), 0.f);  // dK (kTile x d)
  std::fill(w.acc2.begin(), w.acc2.end(), 0.f);  // dV
  const int64_t group = p.group_size();
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < s.seq_q; i0 += kTile) {
      const int64_t bq = std::min<int64_t>(kTile, s.seq_q - i0);
      if (!q_block_sees_keys(p, s, i0, i0 + bq, j0, j0 + bk)) continue;
      load_rows(p, p.q, p.q_stride, s, s.q_row0 + i0, h, bq, bq, w.q.data());
      load_rows(p, bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, bq, w.dout.data());
      const float* L = terms.lse(s, h, i0);
      const float* D = terms.delta(s, h, i0);
      tile_probs_and_ds(p, s, i0, bq, j0, bk, w.q.data(), w.dout.data(), w.kt.data(), w.vt.data(), L, D, w.s.data(),
                        w.dp.data());
      for (int64_t i = 0; i < bq; ++i) {
        const float* pr = w.s.data() + i * kTile;
        const float* ds = w.dp.data() + i * kTile;
        const float* qi = w.q.data() + i * d;
        const float* oi = w.dout.data() + i * d;
        for (int64_t j = 0; j < bk; ++j) {
          const float pj = pr[j], dsj = ds[j];
          float* dk = w.acc1.data() + j * d;
          float* dv = w.acc2.data() + j * d;
          for (int64_t c = 0; c < d; ++c) {
            dv[c] += pj * oi[c];
            dk[c] += dsj * qi[c];
          }
        }
      }
    }
  }
  for (int64_t j = 0; j < bk; ++j) {
    const int64_t ko = s.batch_index * bp.dk_stride.batch + (s.k_row0 + j0 + j) * bp.dk_stride.seq + kvh * bp.dk_stride.head;
    const int64_t vo = s.batch_index * bp.dv_stride.batch + (s.k_row0 + j0 + j) * bp.dv_stride.seq + kvh * bp.dv_stride.head;
    for (int64_t c = 0; c < d; ++c) {
      store_from_float(bp.dk, p.dtype, ko + c, w.acc1[size_t(j * d + c)]);
      store_from_float(bp.dv, p.dtype, vo + c, w.acc2[size_t(j * d + c)]);
    }
  }
}

double dq_task(const BackwardProblem& bp, const RowTerms& terms, int64_t b, int64_t h, int64_t qb, Scratch& w) {
  const AttentionProblem& p = bp.fwd;
  const SequenceSlice s = sequence_slice(p, b);
  const int64_t d = p.head_dim, i0 = qb * kTile, bq = std::min<int64_t>(kTile, s.seq_q - i0), kvh = p.kv_head_of(h);
  w.resize(d);
  load_rows(p, p.q, p.q_stride, s, s.q_row0 + i0, h, bq, bq, w.q.data());
  load_rows(p, bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, bq, w.dout.data());
  const float* L = terms.lse(s, h, i0);
  const float* D = terms.delta(s, h, i0);
  std::fill(w.acc1.begin(), w.acc1.end(), 0.f);  // dQ (kTile x d)
  for (int64_t j0 = 0; j0 < s.seq_k; j0 += kTile) {
    const int64_t bk = std::min<int64_t>(kTile, s.seq_k - j0);
    if (!q_block_sees_keys(p, s, i0, i0 + bq, j0, j0 + bk)) continue;
    load_rows(p, p.k, p.k_stride, s, s.k_row0 + j0, kvh, bk, kTile, w.a.data());
    load_rows(p, p.v, p.v_stride, s, s.k_row0 + j0, kvh, bk, kTile, w.b.data());
    transpose(w.a.data(), kTile, d, w.kt.data());
    transpose(w.b.data(), kTile, d, w.vt.data());
    tile_probs_and_ds(p, s, i0, bq, j0, bk, w.q.data(), w.dout.data(), w.kt.data(), w.vt.data(), L, D, w.s.data(),
                      w.dp.data());
    for (int64_t i = 0; i < bq; ++i) {
      const float* ds = w.dp.data() + i * kTile;
      float* dq = w.acc1.data() + i * d;
      for (int64_t j = 0; j < bk; ++j) {
        const float dsj = ds[j];
        const float* kj = w.a.data() + j * d;
        for (int64_t c = 0; c < d; ++c) dq[c] += dsj * kj[c];
      }
    }
  }
  for (int64_t i = 0; i < bq; ++i) {
    const int64_t o = s.batch_index * bp.dq_stride.batch + (s.q_row0 + i0 + i) * bp.dq_stride.seq + h * bp.dq_stride.head;
    for (int64_t c = 0; c < d; ++c) store_from_float(bp.dq, p.dtype, o + c, w.acc1[size_t(i * d + c)]);
  }
  // dsink's share of these rows: -sum_i exp(sink - L_i) D_i, in float64 (summed in a fixed order by the caller).
  double dsink = 0;
  if (p.sink_logits) {
    const double sink = p.sink_logits[h];
    if (sink != -std::numeric_limits<double>::infinity()) {
      for (int64_t i = 0; i < bq; ++i) dsink -= std::exp(sink - double(L[i])) * double(D[i]);
    }
  }
  return dsink;
}

}  // namespace flashlite::cpu_backward::FL_BWD_ISA

namespace flashlite::cpu_backward {
extern const Kernels FL_BWD_TABLE;
const Kernels FL_BWD_TABLE = {FL_BWD_NAME, &FL_BWD_ISA::dkdv_task, &FL_BWD_ISA::dq_task};
}  // namespace flashlite::cpu_backward
