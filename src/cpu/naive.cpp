// The seeds' baseline on the CPU: three separate steps over an explicit [batch * heads, seq_q, seq_k] fp32 score
// buffer (what a matmul-softmax-matmul framework path materialises). Threaded like the tiled path, so the
// speedup between them is the algorithm's, not the thread count's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "backends.h"
#include "flashlite/errors.h"

namespace flashlite {
namespace {

// The score buffer's size, refused at once when it exceeds the machine's memory (2^31 keys asked for 8 TiB and
// grew until the kernel killed the process).
size_t score_count(const AttentionProblem& p) {
  const unsigned __int128 n = (unsigned __int128)(p.batch * p.q_heads) * uint64_t(p.seq_q) * uint64_t(p.seq_k);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const unsigned __int128 memory = pages > 0 && page > 0 ? (unsigned __int128)pages * uint64_t(page) : SIZE_MAX / 8;
  if (n * sizeof(float) > memory) {
    throw Error(ErrorKind::invalid_value,
                "backend 'naive' needs a " + std::to_string(p.batch * p.q_heads) + " x " + std::to_string(p.seq_q) +
                    " x " + std::to_string(p.seq_k) + " fp32 score buffer (" +
                    std::to_string(uint64_t(n * sizeof(float) >> 20)) + " MiB), more than this machine's " +
                    std::to_string(uint64_t(memory >> 20)) + " MiB of memory; use backend 'cpu' (no score buffer)");
  }
  return size_t(n);
}

}  // namespace

void run_cpu_naive(const AttentionProblem& p) {
  const int64_t d = p.head_dim, hq = p.q_heads, sq = p.seq_q, sk = p.seq_k;
  const float inf = std::numeric_limits<float>::infinity(), neg_inf = -inf;
  // (batch * q_heads, seq_q, seq_k): the S x S matrices, all of them at once.
  std::vector<float> scores(score_count(p));
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

  // Step 2: row softmax in place (P overwrites S); the sink logit joins the denominator; LSE written here. Non-finite
  // values as the reference (src/cpu/reference.cpp): a NaN or +inf score or sink logit poisons the row, a -inf score
  // weighs 0, a row without a finite score is keyless. Sums in float64: an fp32 sum of 2^24 equal terms stops growing.
  enum : uint8_t { kRowNormal, kRowKeyless, kRowPoisoned };
  std::vector<uint8_t> row_kind(size_t(pairs * sq));  // (batch * q_heads, seq_q)
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t b = bh / hq, h = bh % hq;
    const SequenceSlice s = sequence_slice(p, b);
    const float sink = p.sink_logits ? p.sink_logits[h] : neg_inf;
    for (int64_t i = 0; i < s.seq_q; ++i) {
      float* row = scores.data() + (bh * sq + i) * sk;
      bool poisoned = std::isnan(sink) || sink == inf;
      bool any_finite = false;
      float row_max = sink;
      for (int64_t j = 0; j < s.seq_k; ++j) {
        if (std::isnan(row[j]) || row[j] == inf) {
          poisoned = true;
        } else if (row[j] != neg_inf) {
          any_finite = true;
          row_max = std::max(row_max, row[j]);
        }
      }
      uint8_t kind = poisoned ? kRowPoisoned : kRowNormal;
      float lse = std::numeric_limits<float>::quiet_NaN();
      if (!poisoned && !any_finite) {  // every key masked or -inf: zeros, LSE the sink logit (or -inf)
        kind = kRowKeyless;
        lse = sink;
      } else if (!poisoned) {
        double keys_sum = 0;
        for (int64_t j = 0; j < s.seq_k; ++j) {
          row[j] = std::exp(row[j] - row_max);
          keys_sum += row[j];
        }
        const double denom = keys_sum + (sink == neg_inf ? 0.0 : std::exp(double(sink) - row_max));
        const float inv = float(1.0 / denom);
        for (int64_t j = 0; j < s.seq_k; ++j) row[j] *= inv;
        lse = float(row_max + std::log(denom));
      }
      row_kind[size_t(bh * sq + i)] = kind;
      if (p.lse) p.lse[p.lse_stride.offset(s.batch_index, h, s.q_row0 + i)] = lse;
    }
  }

  // Step 3: O = P V over the visible keys (a zero weight times a NaN/inf value is NaN, as IEEE has it; masked keys
  // never take part), accumulated in float64.
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < pairs; ++bh) {
    const int64_t b = bh / hq, h = bh % hq, kvh = p.kv_head_of(h);
    const SequenceSlice s = sequence_slice(p, b);
    std::vector<double> acc(d);
    for (int64_t i = 0; i < s.seq_q; ++i) {
      const float* row = scores.data() + (bh * sq + i) * sk;
      const uint8_t kind = row_kind[size_t(bh * sq + i)];
      std::fill(acc.begin(), acc.end(), kind == kRowPoisoned ? std::numeric_limits<double>::quiet_NaN() : 0.0);
      for (int64_t j = 0; j < s.seq_k && kind == kRowNormal; ++j) {
        if (row[j] == 0.f && !key_visible(p.mask, i, j, s.seq_q, s.seq_k)) continue;
        const int64_t v_off = s.batch_index * p.v_stride.batch + (s.k_row0 + j) * p.v_stride.seq + kvh * p.v_stride.head;
        for (int64_t c = 0; c < d; ++c) acc[c] += double(row[j]) * load_as_float(p.v, p.dtype, v_off + c);
      }
      const int64_t o_off = s.batch_index * p.out_stride.batch + (s.q_row0 + i) * p.out_stride.seq + h * p.out_stride.head;
      for (int64_t c = 0; c < d; ++c) store_from_float(p.out, p.dtype, o_off + c, float(acc[c]));
    }
  }
}

}  // namespace flashlite
