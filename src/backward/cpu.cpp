// The CPU backward (backend 'cpu'): gathers L and D = dout . out per row, then the two passes of cpu_tiles.h over
// OpenMP threads: key blocks (dK, dV) and query blocks (dQ, dsink). Every task writes only its own rows and dsink is
// summed in task order, so the result does not depend on the thread count or the schedule.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backends.h"
#include "backward/cpu_backward.h"

namespace flashlite {
namespace {

const cpu_backward::Kernels& kernels_named(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512") return cpu_backward::kAvx512;
  if (isa == "avx2") return cpu_backward::kAvx2;
#endif
  (void)isa;
  return cpu_backward::kPortable;
}

// Zeroes rows [from, rows) of every batch and head of a gradient (varlen rows that no sequence covers).
void zero_rows(void* base, DType dtype, const BSHStrides& st, int64_t batch, int64_t from, int64_t rows, int64_t heads,
               int64_t d) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = from; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < d; ++c) store_from_float(base, dtype, b * st.batch + r * st.seq + h * st.head + c, 0.f);
}

}  // namespace

void run_backward_cpu(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const cpu_backward::Kernels& kern = kernels_named(cpu_tiled_variant());
  const int64_t d = p.head_dim, hq = p.q_heads, tensor_batch = p.varlen() ? 1 : p.batch;
  using cpu_backward::kTile;

  // L and D of every row of every sequence.
  cpu_backward::RowTerms terms;
  terms.heads = hq;
  terms.rows = p.q_tensor_rows;
  terms.lse_.assign(size_t(tensor_batch * hq * p.q_tensor_rows), 0.f);
  terms.delta_.assign(terms.lse_.size(), 0.f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const SequenceSlice s = sequence_slice(p, b);
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t row = s.q_row0 + i, tb = s.batch_index;
        const int64_t o = tb * p.out_stride.batch + row * p.out_stride.seq + h * p.out_stride.head;
        const int64_t g = tb * bp.dout_stride.batch + row * bp.dout_stride.seq + h * bp.dout_stride.head;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(load_as_float(p.out, p.dtype, o + c)) * load_as_float(bp.dout, p.dtype, g + c);
        const int64_t t = terms.index(tb, h, row);
        terms.delta_[size_t(t)] = float(dot - bp.dlse_at(tb, h, row));
        terms.lse_[size_t(t)] = p.lse[tb * p.lse_stride_batch + h * p.lse_stride_head + row * p.lse_stride_seq];
      }
    }

  // Varlen rows past the last sequence get zero gradients.
  if (p.varlen()) {
    zero_rows(bp.dq, p.dtype, bp.dq_stride, 1, p.cu_seqlens_q[p.batch], p.q_tensor_rows, hq, d);
    zero_rows(bp.dk, p.dtype, bp.dk_stride, 1, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads, d);
    zero_rows(bp.dv, p.dtype, bp.dv_stride, 1, p.cu_seqlens_k[p.batch], bp.k_tensor_rows, p.kv_heads, d);
  }

  // Pass 1: dK, dV per (sequence, kv head, key block).
  std::vector<std::tuple<int64_t, int64_t, int64_t>> kv_tasks, q_tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    for (int64_t g = 0; g < p.kv_heads; ++g)
      for (int64_t kb = 0; kb * kTile < s.seq_k; ++kb) kv_tasks.emplace_back(b, g, kb);
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t qb = 0; qb * kTile < s.seq_q; ++qb) q_tasks.emplace_back(b, h, qb);
  }
#pragma omp parallel
  {
    cpu_backward::Scratch w;
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < kv_tasks.size(); ++t) {
      const auto [b, g, kb] = kv_tasks[t];
      kern.dkdv(bp, terms, b, g, kb, w);
    }
  }

  // Pass 2: dQ per (sequence, q head, q block), and each block's share of dsink.
  std::vector<double> dsink_parts(q_tasks.size(), 0.0);
#pragma omp parallel
  {
    cpu_backward::Scratch w;
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < q_tasks.size(); ++t) {
      const auto [b, h, qb] = q_tasks[t];
      dsink_parts[t] = kern.dq(bp, terms, b, h, qb, w);
    }
  }
  if (bp.dsink) {
    std::vector<double> dsink(size_t(hq), 0.0);
    for (size_t t = 0; t < q_tasks.size(); ++t) dsink[size_t(std::get<1>(q_tasks[t]))] += dsink_parts[t];
    for (int64_t h = 0; h < hq; ++h) bp.dsink[h] = float(dsink[size_t(h)]);
  }
}

}  // namespace flashlite
