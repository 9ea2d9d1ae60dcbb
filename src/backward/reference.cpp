// The float64 backward oracle: the forward recomputed in float64 from q, k, v and the sink logits (never from the
// stored out / lse), then the textbook gradients of include/flashlite/backward.h row by row. Written plainly and
// never optimised; every backward kernel is tested against it, and it is tested against finite differences of the
// float64 forward (tests/cpu/backward_test.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends.h"

namespace flashlite {

void reference_backward_compute(const BackwardProblem& bp, double* dq64, double* dk64, double* dv64, double* dsink64) {
  const AttentionProblem& p = bp.fwd;
  const int64_t d = p.head_dim, hq = p.q_heads, hkv = p.kv_heads;
  const int64_t tensor_batch = p.varlen() ? 1 : p.batch;
  const int64_t q_rows = p.q_tensor_rows, k_rows = bp.k_tensor_rows;
  const double inf = std::numeric_limits<double>::infinity(), neg_inf = -inf;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> dq(size_t(tensor_batch * q_rows * hq * d), 0.0), dk(size_t(tensor_batch * k_rows * hkv * d), 0.0);
  std::vector<double> dv(dk.size(), 0.0), dsink(size_t(hq), 0.0);
  std::vector<double> q_row(static_cast<size_t>(d)), do_row(q_row), o_row(q_row), scores, probs;
  std::vector<char> visible;
  const auto elem = [&](const void* base, const RowStrides& st, int64_t b, int64_t row, int64_t h, int64_t c) {
    return double(load_as_float(base, p.dtype, b * st.batch + row * st.seq + h * st.head + c));
  };

  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    const int64_t tb = s.batch_index;
    scores.resize(size_t(s.seq_k));
    probs.resize(size_t(s.seq_k));
    visible.resize(size_t(s.seq_k));
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = p.kv_head_of(h);
      const double sink = p.sink_logits ? double(p.sink_logits[h]) : neg_inf;
      for (int64_t i = 0; i < s.seq_q; ++i) {
        for (int64_t c = 0; c < d; ++c) {
          q_row[c] = elem(p.q, p.q_stride, tb, s.q_row0 + i, h, c);
          do_row[c] = elem(bp.dout, bp.dout_stride, tb, s.q_row0 + i, h, c);
        }
        // Forward: scores of the visible keys (softcapped), the row's LSE over them and the sink, P, out.
        double row_max = sink;
        bool any_finite = false;
        for (int64_t j = 0; j < s.seq_k; ++j) {
          visible[j] = key_visible(p.mask, i, j, s.seq_q, s.seq_k);
          if (!visible[j]) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q_row[c] * elem(p.k, p.k_stride, tb, s.k_row0 + j, kvh, c);
          double x = dot * p.scale;
          if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
          scores[j] = x;
          if (std::isnan(x) || x == inf) {
            row_max = nan;
          } else if (x != neg_inf && !std::isnan(row_max)) {
            any_finite = true;
            row_max = std::max(row_max, x);
          }
        }
        if (std::isnan(sink) || sink == inf) row_max = nan;
        // lse: NaN for a poisoned row; the sink logit (or -inf) for a row without a finite score.
        double lse = sink;
        if (std::isnan(row_max)) {
          lse = nan;
        } else if (any_finite) {
          double denom = sink == neg_inf ? 0.0 : std::exp(sink - row_max);
          for (int64_t j = 0; j < s.seq_k; ++j) {
            if (visible[j]) denom += std::exp(scores[j] - row_max);
          }
          lse = row_max + std::log(denom);
        }
        const bool keyless = !std::isnan(lse) && !any_finite;
        std::fill(o_row.begin(), o_row.end(), 0.0);
        for (int64_t j = 0; j < s.seq_k; ++j) {
          if (!visible[j]) continue;
          probs[j] = keyless ? 0.0 : std::exp(scores[j] - lse);
          for (int64_t c = 0; c < d; ++c) o_row[c] += probs[j] * elem(p.v, p.v_stride, tb, s.k_row0 + j, kvh, c);
        }
        double D = -double(bp.dlse_at(tb, h, s.q_row0 + i));
        for (int64_t c = 0; c < d; ++c) D += do_row[c] * o_row[c];

        // Backward.
        const int64_t qi = (tb * q_rows + s.q_row0 + i) * hq + h;
        for (int64_t j = 0; j < s.seq_k; ++j) {
          if (!visible[j]) continue;
          const int64_t kj = (tb * k_rows + s.k_row0 + j) * hkv + kvh;
          double dp = 0;
          for (int64_t c = 0; c < d; ++c) dp += do_row[c] * elem(p.v, p.v_stride, tb, s.k_row0 + j, kvh, c);
          double ds = probs[j] * (dp - D);
          if (p.softcap > 0) ds *= 1.0 - (scores[j] / p.softcap) * (scores[j] / p.softcap);
          ds *= p.scale;
          for (int64_t c = 0; c < d; ++c) {
            dq[size_t(qi * d + c)] += ds * elem(p.k, p.k_stride, tb, s.k_row0 + j, kvh, c);
            dk[size_t(kj * d + c)] += ds * q_row[c];
            dv[size_t(kj * d + c)] += probs[j] * do_row[c];
          }
        }
        if (p.sink_logits && sink != neg_inf) dsink[size_t(h)] -= std::exp(sink - lse) * D;
      }
    }
  }
  if (dq64) std::copy(dq.begin(), dq.end(), dq64);
  if (dk64) std::copy(dk.begin(), dk.end(), dk64);
  if (dv64) std::copy(dv.begin(), dv.end(), dv64);
  if (dsink64) std::copy(dsink.begin(), dsink.end(), dsink64);
}

void run_backward_reference(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const int64_t d = p.head_dim, hq = p.q_heads, hkv = p.kv_heads;
  const int64_t tensor_batch = p.varlen() ? 1 : p.batch;
  const int64_t q_rows = p.q_tensor_rows, k_rows = bp.k_tensor_rows;
  std::vector<double> dq(size_t(tensor_batch * q_rows * hq * d)), dk(size_t(tensor_batch * k_rows * hkv * d));
  std::vector<double> dv(dk.size()), dsink(static_cast<size_t>(hq));
  reference_backward_compute(bp, dq.data(), dk.data(), dv.data(), dsink.data());
  const auto store = [&](void* base, const RowStrides& st, const std::vector<double>& g, int64_t rows, int64_t heads) {
    for (int64_t b = 0; b < tensor_batch; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < d; ++c) {
            store_from_float(base, p.dtype, b * st.batch + r * st.seq + h * st.head + c,
                             float(g[size_t(((b * rows + r) * heads + h) * d + c)]));
          }
  };
  store(bp.dq, bp.dq_stride, dq, q_rows, hq);
  store(bp.dk, bp.dk_stride, dk, k_rows, hkv);
  store(bp.dv, bp.dv_stride, dv, k_rows, hkv);
  if (bp.dsink) {
    for (int64_t h = 0; h < hq; ++h) bp.dsink[h] = float(dsink[size_t(h)]);
  }
}

}  // namespace flashlite
