// The seeds' baseline on the CPU: three separate steps over an explicit [batch * heads, seq_q, seq_k] fp32 score
// buffer (what a matmul-softmax-matmul framework path materialises). Threaded like the tiled path, so the
// speedup between them is the algorithm's, not the thread count's.
#include <cmath>
#include <limits>
#include <vector>

#include "backends.h"

namespace flashlite {

void run_cpu_naive(const AttentionProblem& p) {
  const int64_t d = p.head_dim, hq = p.q_heads, sq = p.seq_q, sk = p.seq_k;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // (batch * q_heads, seq_q, seq_k): the S x S matrices, all of them at once.
  std::vector<float> scores(size_t(p.batch * hq * sq * sk));
  const int64_t pairs = p.batch * hq;

  // Step 1: S = scale * Q K^T, masked entries -inf, softcap applied.
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t b = bh / hq, h = bh % hq, kvh = p.kv_head_of(h);
    const SequenceSlice s = sequence_slice(p, b);
    std::vector<float> q_row(d), k_row(d);
    for (int64_t i = 0; i < s.seq_q; ++i) {
      const int64_t q_off = s.batch_index * p.q_stride.batch + (s.q_row0 + i) * p.q_stride.seq + h * p.q_stride.head;
      for (int64_t c = 0; c < d; ++c) q_row[c] = load_as_float(p.q, p.dtype, q_off + c);
      float* row = scores.data() + (bh * sq + i) * sk;
      for (int64_t j = 0; j < s.seq_k; ++j) {
        if (!key_visible(p.mask, i, j, s.seq_q, s.seq_k)) {
          row[j] = neg_inf;
          continue;
        }
        const int64_t k_off = s.batch_index * p.k_stride.batch + (s.k_row0 + j) * p.k_stride.seq + kvh * p.k_stride.head;
        float dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q_row[c] * load_as_float(p.k, p.dtype, k_off + c);
        float score = dot * float(p.scale);
        if (p.softcap > 0) score = float(p.softcap) * std::tanh(score / float(p.softcap));
        row[j] = score;
      }
    }
  }

  // Step 2: row softmax in place (P overwrites S); the sink logit joins the denominator; LSE written here.
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t b = bh / hq, h = bh % hq;
    const SequenceSlice s = sequence_slice(p, b);
    const float sink = p.sink_logits ? p.sink_logits[h] : neg_inf;
    for (int64_t i = 0; i < s.seq_q; ++i) {
      float* row = scores.data() + (bh * sq + i) * sk;
      float row_max = sink;
      for (int64_t j = 0; j < s.seq_k; ++j) row_max = std::max(row_max, row[j]);
      float keys_sum = 0;
      for (int64_t j = 0; j < s.seq_k; ++j) {
        row[j] = row_max == neg_inf ? 0.f : std::exp(row[j] - row_max);
        keys_sum += row[j];
      }
      const float denom = keys_sum + (sink == neg_inf || row_max == neg_inf ? 0.f : std::exp(sink - row_max));
      const float inv = keys_sum > 0 ? 1.f / denom : 0.f;
      for (int64_t j = 0; j < s.seq_k; ++j) row[j] *= inv;
      if (p.lse) {
        p.lse[s.batch_index * p.lse_stride_batch + h * p.lse_stride_head + (s.q_row0 + i) * p.lse_stride_seq] =
            denom > 0 ? row_max + std::log(denom) : neg_inf;
      }
    }
  }

  // Step 3: O = P V.
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t b = bh / hq, h = bh % hq, kvh = p.kv_head_of(h);
    const SequenceSlice s = sequence_slice(p, b);
    std::vector<float> acc(d);
    for (int64_t i = 0; i < s.seq_q; ++i) {
      const float* row = scores.data() + (bh * sq + i) * sk;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < s.seq_k; ++j) {
        if (row[j] == 0.f) continue;
        const int64_t v_off = s.batch_index * p.v_stride.batch + (s.k_row0 + j) * p.v_stride.seq + kvh * p.v_stride.head;
        for (int64_t c = 0; c < d; ++c) acc[c] += row[j] * load_as_float(p.v, p.dtype, v_off + c);
      }
      const int64_t o_off = s.batch_index * p.out_stride.batch + (s.q_row0 + i) * p.out_stride.seq + h * p.out_stride.head;
      for (int64_t c = 0; c < d; ++c) store_from_float(p.out, p.dtype, o_off + c, acc[c]);
    }
  }
}

}  // namespace flashlite
