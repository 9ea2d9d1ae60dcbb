// The CPU backward (backend 'cpu'): FlashAttention-2's backward with P recomputed from the forward's LSE and
// D_i = dout_i . out_i (less dlse_i), in two passes over OpenMP threads, each task owning what it writes, so nothing
// races and the result does not depend on the thread count or the schedule:
//   key blocks (one kv head):   for each q head of the group and each q block that sees the keys:
//                               S = Q K^T, P = exp(scale S - L), dP = dO V^T, dS = P (dP - D) [softcap'] scale,
//                               dV += P^T dO, dK += dS^T Q;
//   query blocks (one q head):  the same S, P, dP, dS over the key blocks it sees, dQ += dS K, and the block's share
//                               of dsink = -sum_i exp(sink - L_i) D_i (summed per head in task order).
// The five products run on the forward's SIMD GEMM (src/cpu/tiled_kernels.h: the build the planner's cpu_simd_default
// picks), and so does the element-wise step between them (bwd_row: exp and tanh by the forward's polynomials).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "backends.h"
#include "cpu/tiled_kernels.h"

namespace flashlite {
namespace {

using cpu_tiled::GemmArgs;
using cpu_tiled::TiledKernels;

constexpr int64_t kTile = 64;  // query rows and keys per tile (a multiple of every SIMD width)

// L (the forward's LSE) and D = dout . out - dlse of every row, one float per (tensor batch, q head, q tensor row).
struct RowTerms {
  int64_t heads = 0, rows = 0;
  std::vector<float> lse, delta;
  int64_t index(int64_t tb, int64_t h, int64_t row) const { return (tb * heads + h) * rows + row; }
};

// One thread's tiles; dp = head_dim rounded up to the SIMD width (padding columns zero).
struct Scratch {
  int64_t dp = 0;
  std::vector<float> q, dout, k, v, kt, vt, s, ds, acc1, acc2;
  explicit Scratch(int64_t dp_) : dp(dp_) {
    for (auto* x : {&q, &dout, &k, &v, &kt, &vt, &acc1, &acc2}) x->assign(size_t(kTile * dp), 0.f);
    s.assign(size_t(kTile * kTile), 0.f);
    ds.assign(size_t(kTile * kTile), 0.f);
  }
};

struct Pass {
  const BackwardProblem& bp;
  const AttentionProblem& p;
  const TiledKernels& kern;
  const RowTerms& terms;
  int64_t d, dp;

  // Rows [row0, row0 + n) of head h of sequence s into dst (kTile x dp, fp32); other rows and columns zero.
  void load_rows(const void* base, const RowStrides& st, const SequenceSlice& s, int64_t row0, int64_t h, int64_t n,
                 float* dst) const {
    for (int64_t r = 0; r < kTile; ++r) {
      float* out = dst + r * dp;
      std::fill(out, out + dp, 0.f);
      if (r >= n) continue;
      const int64_t off = s.batch_index * st.batch + (row0 + r) * st.seq + h * st.head;
      if (p.dtype == DType::f32) {
        const float* src = static_cast<const float*>(base) + off;
        std::copy(src, src + d, out);
      } else {
        for (int64_t c = 0; c < d; ++c) out[c] = load_as_float(base, p.dtype, off + c);
      }
    }
  }

  static void transpose(const float* src, int64_t ld, int64_t cols, float* dst) {  // kTile x cols -> cols x kTile
    for (int64_t r = 0; r < kTile; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[c * kTile + r] = src[r * ld + c];
  }

  void gemm(const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
            int64_t n, int64_t k, bool accumulate) const {
    kern.gemm(GemmArgs{a, a_row, a_k, b, ldb, c, ldc, m, n, k, accumulate, nullptr});
  }

  // Whether any row of [i0, i1) may see a key of [j0, j1) (whole blocks; hidden pairs inside get P = 0).
  bool block_sees(const SequenceSlice& s, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (j0 < p.mask.sink_tokens && j0 < causal_key_end(p.mask, i1, s.seq_q, s.seq_k)) return true;
    const KeyRange r = window_key_range(p.mask, i0, i1, s.seq_q, s.seq_k);
    return r.begin < j1 && j0 < r.end;
  }

  // One (q block, key block) tile: w.s = P, w.ds = dS (scale included); masked and out-of-range entries 0.
  // Needs w.q, w.dout (rows i0..), w.kt, w.vt (keys j0.., transposed).
  void probs_and_ds(const SequenceSlice& s, int64_t b, int64_t h, int64_t i0, int64_t bq, int64_t j0, int64_t bk,
                    Scratch& w) const {
    gemm(w.q.data(), dp, 1, w.kt.data(), kTile, w.s.data(), kTile, bq, kTile, d, false);
    gemm(w.dout.data(), dp, 1, w.vt.data(), kTile, w.ds.data(), kTile, bq, kTile, d, false);
    const float scale = float(p.scale), cap = float(p.softcap), inf = std::numeric_limits<float>::infinity();
    const bool full = tile_fully_visible(p.mask, i0, i0 + bq, j0, j0 + bk, s.seq_q, s.seq_k);
    const int64_t t0 = terms.index(s.batch_index, h, s.q_row0 + i0);
    (void)b;
    for (int64_t i = 0; i < bq; ++i) {
      float* srow = w.s.data() + i * kTile;
      float* drow = w.ds.data() + i * kTile;
      // A row without keys and without a sink has L = -inf: its P is 0 (exp(-inf - -inf) would be NaN).
      const float L = terms.lse[size_t(t0 + i)] == -inf ? inf : terms.lse[size_t(t0 + i)];
      kern.bwd_row({srow, drow, kTile, scale, cap, L, terms.delta[size_t(t0 + i)]});
      if (full && bk == kTile) continue;
      for (int64_t j = 0; j < kTile; ++j) {
        if (j < bk && (full || key_visible(p.mask, i0 + i, j0 + j, s.seq_q, s.seq_k))) continue;
        srow[j] = 0.f;
        drow[j] = 0.f;
      }
    }
  }

  void dkdv(int64_t b, int64_t kvh, int64_t kb, Scratch& w) const {
    const SequenceSlice s = sequence_slice(p, b);
    const int64_t j0 = kb * kTile, bk = std::min(kTile, s.seq_k - j0);
    load_rows(p.k, p.k_stride, s, s.k_row0 + j0, kvh, bk, w.k.data());
    load_rows(p.v, p.v_stride, s, s.k_row0 + j0, kvh, bk, w.v.data());
    transpose(w.k.data(), dp, d, w.kt.data());
    transpose(w.v.data(), dp, d, w.vt.data());
    std::fill(w.acc1.begin(), w.acc1.end(), 0.f);  // dK
    std::fill(w.acc2.begin(), w.acc2.end(), 0.f);  // dV
    for (int64_t h = kvh * p.group_size(); h < (kvh + 1) * p.group_size(); ++h) {
      for (int64_t i0 = 0; i0 < s.seq_q; i0 += kTile) {
        const int64_t bq = std::min(kTile, s.seq_q - i0);
        if (!block_sees(s, i0, i0 + bq, j0, j0 + bk)) continue;
        load_rows(p.q, p.q_stride, s, s.q_row0 + i0, h, bq, w.q.data());
        load_rows(bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, w.dout.data());
        probs_and_ds(s, b, h, i0, bq, j0, bk, w);
        gemm(w.s.data(), 1, kTile, w.dout.data(), dp, w.acc2.data(), dp, bk, dp, bq, true);  // dV += P^T dO
        gemm(w.ds.data(), 1, kTile, w.q.data(), dp, w.acc1.data(), dp, bk, dp, bq, true);    // dK += dS^T Q
      }
    }
    for (int64_t j = 0; j < bk; ++j) {
      const int64_t row = s.k_row0 + j0 + j;
      const int64_t ko = s.batch_index * bp.dk_stride.batch + row * bp.dk_stride.seq + kvh * bp.dk_stride.head;
      const int64_t vo = s.batch_index * bp.dv_stride.batch + row * bp.dv_stride.seq + kvh * bp.dv_stride.head;
      for (int64_t c = 0; c < d; ++c) {
        store_from_float(bp.dk, p.dtype, ko + c, w.acc1[size_t(j * dp + c)]);
        store_from_float(bp.dv, p.dtype, vo + c, w.acc2[size_t(j * dp + c)]);
      }
    }
  }

  double dq(int64_t b, int64_t h, int64_t qb, Scratch& w) const {
    const SequenceSlice s = sequence_slice(p, b);
    const int64_t i0 = qb * kTile, bq = std::min(kTile, s.seq_q - i0), kvh = p.kv_head_of(h);
    load_rows(p.q, p.q_stride, s, s.q_row0 + i0, h, bq, w.q.data());
    load_rows(bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, w.dout.data());
    std::fill(w.acc1.begin(), w.acc1.end(), 0.f);  // dQ
    for (int64_t j0 = 0; j0 < s.seq_k; j0 += kTile) {
      const int64_t bk = std::min(kTile, s.seq_k - j0);
      if (!block_sees(s, i0, i0 + bq, j0, j0 + bk)) continue;
      load_rows(p.k, p.k_stride, s, s.k_row0 + j0, kvh, bk, w.k.data());
      load_rows(p.v, p.v_stride, s, s.k_row0 + j0, kvh, bk, w.v.data());
      transpose(w.k.data(), dp, d, w.kt.data());
      transpose(w.v.data(), dp, d, w.vt.data());
      probs_and_ds(s, b, h, i0, bq, j0, bk, w);
      gemm(w.ds.data(), kTile, 1, w.k.data(), dp, w.acc1.data(), dp, bq, dp, bk, true);  // dQ += dS K
    }
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t row = s.q_row0 + i0 + i;
      const int64_t o = s.batch_index * bp.dq_stride.batch + row * bp.dq_stride.seq + h * bp.dq_stride.head;
      for (int64_t c = 0; c < d; ++c) store_from_float(bp.dq, p.dtype, o + c, w.acc1[size_t(i * dp + c)]);
    }
    // This block's share of dsink, in float64.
    double dsink = 0;
    const double sink = p.sink_logits ? double(p.sink_logits[h]) : -std::numeric_limits<double>::infinity();
    if (sink != -std::numeric_limits<double>::infinity()) {
      const int64_t t0 = terms.index(s.batch_index, h, s.q_row0 + i0);
      for (int64_t i = 0; i < bq; ++i) {
        dsink -= std::exp(sink - double(terms.lse[size_t(t0 + i)])) * double(terms.delta[size_t(t0 + i)]);
      }
    }
    return dsink;
  }
};

// Zeroes rows [from, rows) of every head of a varlen gradient (rows no sequence covers).
void zero_rows(void* base, DType dtype, const RowStrides& st, int64_t from, int64_t rows, int64_t heads, int64_t d) {
  for (int64_t r = from; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < d; ++c) store_from_float(base, dtype, r * st.seq + h * st.head + c, 0.f);
}

}  // namespace

void run_backward_cpu(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const TiledKernels& kern = cpu_tiled::kernels_of(cpu_simd_default());
  const int64_t d = p.head_dim, hq = p.q_heads, tensor_batch = p.varlen() ? 1 : p.batch;
  const int64_t dp = (d + kern.width - 1) / kern.width * kern.width;

  RowTerms terms;
  terms.heads = hq;
  terms.rows = p.q_tensor_rows;
  terms.lse.assign(size_t(tensor_batch * hq * p.q_tensor_rows), 0.f);
  terms.delta.assign(terms.lse.size(), 0.f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const SequenceSlice s = sequence_slice(p, b);
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t row = s.q_row0 + i, tb = s.batch_index;
        const int64_t o = tb * p.out_stride.batch + row * p.out_stride.seq + h * p.out_stride.head;
        const int64_t g = tb * bp.dout_stride.batch + row * bp.dout_stride.seq + h * bp.dout_stride.head;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += double(load_as_float(p.out, p.dtype, o + c)) * load_as_float(bp.dout, p.dtype, g + c);
        }
        const int64_t t = terms.index(tb, h, row);
        terms.delta[size_t(t)] = float(dot - bp.dlse_at(tb, h, row));
        terms.lse[size_t(t)] = p.lse[p.lse_stride.offset(tb, h, row)];
      }
    }
  if (p.varlen()) {  // rows past the last sequence get zero gradients
    zero_rows(bp.dq, p.dtype, bp.dq_stride, p.cu_seqlens_q[p.batch], p.q_tensor_rows, hq, d);
    zero_rows(bp.dk, p.dtype, bp.dk_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads, d);
    zero_rows(bp.dv, p.dtype, bp.dv_stride, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads, d);
  }

  std::vector<std::tuple<int64_t, int64_t, int64_t>> kv_tasks, q_tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    for (int64_t g = 0; g < p.kv_heads; ++g)
      for (int64_t kb = 0; kb * kTile < s.seq_k; ++kb) kv_tasks.emplace_back(b, g, kb);
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t qb = 0; qb * kTile < s.seq_q; ++qb) q_tasks.emplace_back(b, h, qb);
  }
  const Pass pass{bp, p, kern, terms, d, dp};
  std::vector<double> dsink_parts(q_tasks.size(), 0.0);
  // Both passes in one parallel region, one scratch per thread (the passes write disjoint outputs).
#pragma omp parallel
  {
    Scratch w(dp);
#pragma omp for schedule(dynamic) nowait
    for (size_t t = 0; t < kv_tasks.size(); ++t) {
      const auto [b, g, kb] = kv_tasks[t];
      pass.dkdv(b, g, kb, w);
    }
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < q_tasks.size(); ++t) {
      const auto [b, h, qb] = q_tasks[t];
      dsink_parts[t] = pass.dq(b, h, qb, w);
    }
  }
  if (bp.dsink) {
    std::vector<double> dsink(size_t(hq), 0.0);
    for (size_t t = 0; t < q_tasks.size(); ++t) dsink[size_t(std::get<1>(q_tasks[t]))] += dsink_parts[t];
    for (int64_t h = 0; h < hq; ++h) bp.dsink[h] = float(dsink[size_t(h)]);
  }
}

}  // namespace flashlite
