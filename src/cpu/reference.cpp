// The float64 oracle: the three textbook steps (scores, masked softmax, weighted sum), written plainly and
// never optimised. Every other backend is tested against this.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends.h"

namespace flashlite {

// out64: contiguous like q [batch, q_tensor_rows, q_heads, head_dim]; lse64: contiguous [batch, q_heads,
// q_tensor_rows]; either may be null. Varlen: batch 1. Rows outside every sequence are left as they are.
void reference_compute(const AttentionProblem& p, double* out64, double* lse64) {
  const int64_t tensor_seq_q = p.q_tensor_rows;
  const int64_t d = p.head_dim;
  const double inf = std::numeric_limits<double>::infinity(), neg_inf = -inf;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> scores, q_row(d), acc(d);
  std::vector<char> visible;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    scores.resize(size_t(s.seq_k));
    visible.resize(size_t(s.seq_k));
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t kvh = p.kv_head_of(h);
      const double sink = p.sink_logits ? double(p.sink_logits[h]) : neg_inf;
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t q_off = s.batch_index * p.q_stride.batch + (s.q_row0 + i) * p.q_stride.seq + h * p.q_stride.head;
        for (int64_t c = 0; c < d; ++c) q_row[c] = load_as_float(p.q, p.dtype, q_off + c);

        // Step 1: scores of the visible keys, in IEEE arithmetic (NaN/inf inputs give NaN/inf scores). A NaN or +inf
        // score or sink logit poisons the row; the max runs over the finite scores and the sink.
        bool poisoned = std::isnan(sink) || sink == inf;
        bool any_finite = false;
        double row_max = sink;
        for (int64_t j = 0; j < s.seq_k; ++j) {
          visible[j] = key_visible(p.mask, i, j, s.seq_q, s.seq_k);
          if (!visible[j]) continue;
          const int64_t k_off = s.batch_index * p.k_stride.batch + (s.k_row0 + j) * p.k_stride.seq + kvh * p.k_stride.head;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q_row[c] * load_as_float(p.k, p.dtype, k_off + c);
          double score = dot * p.scale;
          if (p.softcap > 0) score = p.softcap * std::tanh(score / p.softcap);
          scores[j] = score;
          if (std::isnan(score) || score == inf) {
            poisoned = true;
          } else if (score != neg_inf) {
            any_finite = true;
            row_max = std::max(row_max, score);
          }
        }

        // Step 2: softmax; the sink logit joins the denominator only. A -inf score weighs 0; a row without a finite
        // score (every key masked or -inf) has no denominator from keys: zeros and LSE = the sink logit (or -inf).
        double denom = 0, lse = sink;
        if (poisoned) {
          lse = nan;
        } else if (any_finite) {
          for (int64_t j = 0; j < s.seq_k; ++j) {
            if (!visible[j]) continue;
            scores[j] = std::exp(scores[j] - row_max);
            denom += scores[j];
          }
          if (sink != neg_inf) denom += std::exp(sink - row_max);
          lse = row_max + std::log(denom);
        }

        // Step 3: weighted sum of V over every visible key, a zero weight included (0 * inf = NaN, as in IEEE
        // arithmetic); masked keys never take part.
        std::fill(acc.begin(), acc.end(), poisoned ? nan : 0.0);
        if (!poisoned && any_finite) {
          for (int64_t j = 0; j < s.seq_k; ++j) {
            if (!visible[j]) continue;
            const double w = scores[j] / denom;
            const int64_t v_off = s.batch_index * p.v_stride.batch + (s.k_row0 + j) * p.v_stride.seq + kvh * p.v_stride.head;
            for (int64_t c = 0; c < d; ++c) acc[c] += w * load_as_float(p.v, p.dtype, v_off + c);
          }
        }
        const int64_t row = s.batch_index * tensor_seq_q + s.q_row0 + i;
        if (out64) std::copy(acc.begin(), acc.end(), out64 + (row * p.q_heads + h) * d);
        if (lse64) lse64[(s.batch_index * p.q_heads + h) * tensor_seq_q + s.q_row0 + i] = lse;
      }
    }
  }
}

}  // namespace flashlite

namespace flashlite {

void run_reference(const AttentionProblem& p) {
  // Rows of the tensors: varlen keeps all sequences in batch 0.
  const int64_t tensor_batch = p.varlen() ? 1 : p.batch;
  const int64_t tensor_seq_q = p.q_tensor_rows;
  const int64_t d = p.head_dim;
  std::vector<double> out64(size_t(tensor_batch * tensor_seq_q * p.q_heads * d));
  std::vector<double> lse64(size_t(tensor_batch * p.q_heads * tensor_seq_q));
  reference_compute(p, out64.data(), lse64.data());
  // Write only the rows that belong to a sequence (varlen rows past the last offset stay untouched).
  for (int64_t seq = 0; seq < p.batch; ++seq) {
    const SequenceSlice s = sequence_slice(p, seq);
    for (int64_t i = s.q_row0; i < s.q_row0 + s.seq_q; ++i) {
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const int64_t b = s.batch_index;
        const int64_t o_off = b * p.out_stride.batch + i * p.out_stride.seq + h * p.out_stride.head;
        const double* src = out64.data() + ((b * tensor_seq_q + i) * p.q_heads + h) * d;
        for (int64_t c = 0; c < d; ++c) store_from_float(p.out, p.dtype, o_off + c, float(src[c]));
        if (p.lse) {
          p.lse[p.lse_stride.offset(b, h, i)] =
              float(lse64[(b * p.q_heads + h) * tensor_seq_q + i]);
        }
      }
    }
  }
}

}  // namespace flashlite
