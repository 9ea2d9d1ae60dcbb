// The CPU backward (backend 'cpu'): FlashAttention-2's backward with P recomputed from the forward's LSE and
// D_i = dout_i . out_i (less dlse_i) over OpenMP threads, each task owning what it writes, so nothing races. Per tile
// of (q block, key block): S = Q K^T, P = exp(scale S - L), dP = dO V^T, dS = P (dP - D) [softcap'] scale; then
//   dV += P^T dO, dK += dS^T Q  (per key block, over the q heads of its kv head and the q blocks that see it),
//   dQ += dS K                  (per q block, over the key blocks it sees, in key order),
// and per q block its share of dsink = -sum_i exp(sink - L_i) D_i (summed per head in task order). Two schedules:
//   one pass:   a task is one (sequence, kv head) whole: its q heads' Q and dO converted to fp32 once, each tile
//               formed once, dQ accumulated in the thread's fp32 buffer: 5 products a tile. Taken when the tasks
//               spread over the threads well enough to keep that saving and the threads' buffers are small
//               (kOnePassBufferBytes);
//   two passes: tasks are key blocks (dK, dV) and then q blocks (dQ), each tile formed in both: 7 products a tile,
//               but as many tasks as blocks.
// Both add every sum in the same order, so the bits are the same whichever runs and for any thread count. The products
// run on the forward's SIMD GEMM (src/cpu/tiled_kernels.h: the build the planner's cpu_simd_default picks), and so
// does the element-wise step between them (bwd_row: exp and tanh by the forward's polynomials).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <omp.h>

#include "backends.h"
#include "cpu/tiled_kernels.h"

namespace flashlite {
namespace {

using cpu_tiled::GemmArgs;
using cpu_tiled::TiledKernels;

constexpr int64_t kTile = 64;  // query rows and keys per tile (a multiple of every SIMD width)
constexpr int64_t kOnePassBufferBytes = int64_t(256) << 20;  // the threads' one-pass buffers together, at most

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

  // Rows [row0, row0 + n) of head h of sequence s into dst (kTile x dp, fp32; converted by the forward's SIMD
  // kernel); other rows and columns zero.
  void load_rows(const void* base, const RowStrides& st, const SequenceSlice& s, int64_t row0, int64_t h, int64_t n,
                 float* dst) const {
    if (n > 0) {
      const size_t elem = p.dtype == DType::f32 ? 4 : 2;
      const int64_t off = s.batch_index * st.batch + row0 * st.seq + h * st.head;
      kern.convert({static_cast<const char*>(base) + off * int64_t(elem), p.dtype, st.seq, dst, dp, n, d, dp});
    }
    std::fill(dst + std::max<int64_t>(n, 0) * dp, dst + kTile * dp, 0.f);
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
  // Needs q, dout (rows i0.., kTile x dp), w.kt, w.vt (keys j0.., transposed).
  void probs_and_ds(const SequenceSlice& s, int64_t b, int64_t h, int64_t i0, int64_t bq, int64_t j0, int64_t bk,
                    const float* q, const float* dout, Scratch& w) const {
    gemm(q, dp, 1, w.kt.data(), kTile, w.s.data(), kTile, bq, kTile, d, false);
    gemm(dout, dp, 1, w.vt.data(), kTile, w.ds.data(), kTile, bq, kTile, d, false);
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

  // dK and dV of key block kb of kv head kvh (K, V loaded into w). With a one-pass task's buffers (each the group's
  // q heads one after another, rows of each padded to whole tiles, dp columns): Q and dO read from them instead of
  // loaded per tile, and dQ += dS K of every tile into dq_acc.
  struct GroupRows {
    const float *q = nullptr, *dout = nullptr;
    float* dq_acc = nullptr;
  };
  void key_block(const SequenceSlice& s, int64_t b, int64_t kvh, int64_t kb, Scratch& w, const GroupRows& g) const {
    const int64_t j0 = kb * kTile, bk = std::min(kTile, s.seq_k - j0);
    const int64_t q_rows = (s.seq_q + kTile - 1) / kTile * kTile;
    load_rows(p.k, p.k_stride, s, s.k_row0 + j0, kvh, bk, w.k.data());
    load_rows(p.v, p.v_stride, s, s.k_row0 + j0, kvh, bk, w.v.data());
    transpose(w.k.data(), dp, d, w.kt.data());
    transpose(w.v.data(), dp, d, w.vt.data());
    std::fill(w.acc1.begin(), w.acc1.end(), 0.f);  // dK
    std::fill(w.acc2.begin(), w.acc2.end(), 0.f);  // dV
    const int64_t h0 = kvh * p.group_size();
    for (int64_t h = h0; h < h0 + p.group_size(); ++h) {
      for (int64_t i0 = 0; i0 < s.seq_q; i0 += kTile) {
        const int64_t bq = std::min(kTile, s.seq_q - i0);
        if (!block_sees(s, i0, i0 + bq, j0, j0 + bk)) continue;
        const int64_t at = ((h - h0) * q_rows + i0) * dp;  // the tile's place in a one-pass task's buffers
        const float* q = g.q ? g.q + at : w.q.data();
        const float* dout = g.dout ? g.dout + at : w.dout.data();
        if (!g.q) {
          load_rows(p.q, p.q_stride, s, s.q_row0 + i0, h, bq, w.q.data());
          load_rows(bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, w.dout.data());
        }
        probs_and_ds(s, b, h, i0, bq, j0, bk, q, dout, w);
        gemm(w.s.data(), 1, kTile, dout, dp, w.acc2.data(), dp, bk, dp, bq, true);  // dV += P^T dO
        gemm(w.ds.data(), 1, kTile, q, dp, w.acc1.data(), dp, bk, dp, bq, true);    // dK += dS^T Q
        if (g.dq_acc) {  // dQ += dS K
          gemm(w.ds.data(), kTile, 1, w.k.data(), dp, g.dq_acc + at, dp, bq, dp, bk, true);
        }
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

  void dkdv(int64_t b, int64_t kvh, int64_t kb, Scratch& w) const {
    key_block(sequence_slice(p, b), b, kvh, kb, w, GroupRows{});
  }

  // Rows [i0, i0 + bq) of dQ of head h from acc (bq x dp).
  void store_dq(const SequenceSlice& s, int64_t h, int64_t i0, int64_t bq, const float* acc) const {
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t row = s.q_row0 + i0 + i;
      const int64_t o = s.batch_index * bp.dq_stride.batch + row * bp.dq_stride.seq + h * bp.dq_stride.head;
      for (int64_t c = 0; c < d; ++c) store_from_float(bp.dq, p.dtype, o + c, acc[size_t(i * dp + c)]);
    }
  }

  // Rows [i0, i0 + bq)'s share of dsink of head h, in float64.
  double dsink_share(const SequenceSlice& s, int64_t h, int64_t i0, int64_t bq) const {
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
      probs_and_ds(s, b, h, i0, bq, j0, bk, w.q.data(), w.dout.data(), w);
      gemm(w.ds.data(), kTile, 1, w.k.data(), dp, w.acc1.data(), dp, bq, dp, bk, true);  // dQ += dS K
    }
    store_dq(s, h, i0, bq, w.acc1.data());
    return dsink_share(s, h, i0, bq);
  }

  // A one-pass task's buffers: Q and dO of the group's q heads (fp32, loaded once), dQ's accumulator.
  struct GroupBuffers {
    std::vector<float> q, dout, dq_acc;
  };

  // One pass over (sequence b, kv head kvh): the group's Q and dO rows loaded once, every key block in order, dQ of
  // the group's q heads accumulated, then stored; the q blocks' dsink shares into dsink_parts[(h - h0) * q_blocks +
  // qb] (the caller points it at the group's first q task).
  void one_pass(int64_t b, int64_t kvh, Scratch& w, GroupBuffers& gb, double* dsink_parts) const {
    const SequenceSlice s = sequence_slice(p, b);
    const int64_t q_blocks = (s.seq_q + kTile - 1) / kTile, q_rows = q_blocks * kTile;
    const int64_t h0 = kvh * p.group_size();
    const size_t n = size_t(p.group_size() * q_rows * dp);
    gb.q.resize(n), gb.dout.resize(n);
    gb.dq_acc.assign(n, 0.f);
    for (int64_t h = h0; h < h0 + p.group_size(); ++h) {
      for (int64_t i0 = 0; i0 < s.seq_q; i0 += kTile) {
        const int64_t bq = std::min(kTile, s.seq_q - i0), at = ((h - h0) * q_rows + i0) * dp;
        load_rows(p.q, p.q_stride, s, s.q_row0 + i0, h, bq, gb.q.data() + at);
        load_rows(bp.dout, bp.dout_stride, s, s.q_row0 + i0, h, bq, gb.dout.data() + at);
      }
    }
    const GroupRows g{gb.q.data(), gb.dout.data(), gb.dq_acc.data()};
    for (int64_t kb = 0; kb * kTile < s.seq_k; ++kb) key_block(s, b, kvh, kb, w, g);
    for (int64_t h = h0; h < h0 + p.group_size(); ++h) {
      for (int64_t qb = 0; qb < q_blocks; ++qb) {
        const int64_t i0 = qb * kTile, bq = std::min(kTile, s.seq_q - i0);
        store_dq(s, h, i0, bq, gb.dq_acc.data() + ((h - h0) * q_rows + i0) * dp);
        dsink_parts[(h - h0) * q_blocks + qb] = dsink_share(s, h, i0, bq);
      }
    }
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
  std::vector<size_t> first_q_task(size_t(p.batch));  // sequence b's q tasks start here (head-major, then q block)
  int64_t max_q_rows = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    first_q_task[size_t(b)] = q_tasks.size();
    max_q_rows = std::max(max_q_rows, (s.seq_q + kTile - 1) / kTile * kTile);
    for (int64_t g = 0; g < p.kv_heads; ++g)
      for (int64_t kb = 0; kb * kTile < s.seq_k; ++kb) kv_tasks.emplace_back(b, g, kb);
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t qb = 0; qb * kTile < s.seq_q; ++qb) q_tasks.emplace_back(b, h, qb);
  }
  const Pass pass{bp, p, kern, terms, d, dp};
  std::vector<double> dsink_parts(q_tasks.size(), 0.0);
  // One pass does 5/7 of the two passes' work, in whole (sequence, kv head) tasks: taken when its waves of them
  // (ceil(tasks / threads), the tasks of a padded batch being equal) cost no more than the two passes' 7/5 as much
  // work spread evenly over the threads. Varlen tasks differ in size: there, twice as many tasks as threads.
  const int64_t whole_tasks = p.batch * p.kv_heads, threads = omp_get_max_threads();
  const int64_t waves = (whole_tasks + threads - 1) / threads;
  const bool balanced = p.varlen() ? whole_tasks >= 2 * threads : 5 * waves * threads <= 7 * whole_tasks;
  const bool one_pass =
      balanced && threads * 3 * p.group_size() * max_q_rows * dp * int64_t(sizeof(float)) <= kOnePassBufferBytes;
  if (one_pass) {
#pragma omp parallel
    {
      Scratch w(dp);
      Pass::GroupBuffers gb;
#pragma omp for schedule(dynamic)
      for (int64_t t = 0; t < whole_tasks; ++t) {
        const int64_t b = t / p.kv_heads, g = t % p.kv_heads;
        const int64_t q_blocks = (sequence_slice(p, b).seq_q + kTile - 1) / kTile;
        double* parts = dsink_parts.data() + first_q_task[size_t(b)] + g * p.group_size() * q_blocks;
        pass.one_pass(b, g, w, gb, parts);
      }
    }
  } else {
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
  }
  if (bp.dsink) {
    std::vector<double> dsink(size_t(hq), 0.0);
    for (size_t t = 0; t < q_tasks.size(); ++t) dsink[size_t(std::get<1>(q_tasks[t]))] += dsink_parts[t];
    for (int64_t h = 0; h < hq; ++h) bp.dsink[h] = float(dsink[size_t(h)]);
  }
}

}  // namespace flashlite
