// The `cpu` backend: FlashAttention-2 Algorithm 1 on the CPU.
//
// A task is (sequence, KV head, a tile of query rows) and takes every q head of that KV head's group along, so a K/V
// tile is loaded once for the whole group. Its "query columns" are (row, head) pairs, n = r * heads + g, at most
// kQueryCols of them. For each K/V tile of kKeys keys that the mask leaves visible:
//   S^T = K Q^T           (keys x query columns; Q^T packed once per task)
//   softcap, then mask    (the predicate is evaluated only on tiles that are not fully visible)
//   online softmax        (running max m, running sum l, rescale factor alpha; vectorised across query columns)
//   O = O * alpha + P V   (the rescale folded into the GEMM's load of O)
//   every ~2048 keys: O and l folded into float64 totals (long rows stay accurate, see fold())
// Non-finite inputs follow include/flashlite/attention.h: a NaN or +inf score makes its p = 2^NaN, so l is NaN at the
// end (finalise tests l), masked keys are -inf before the softmax and their V rows kept out of P V (hidden_nonfinite_v).
// Memory per thread: O(kKeys * head_dim + kQueryCols * head_dim), never seq x seq. fp32 K/V are read in place; fp16
// and bf16 tiles are converted to fp32 once per tile. The hot loops (GEMM, conversion, softmax step, softcap) are
// built per instruction set (tiled_simd.h); the planner picks one (plan_cpu_simd, src/dispatch.cpp) and this file holds
// the algorithm around them.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backends.h"
#include "common/half.h"
#include "cpu/tiled_kernels.h"
#include "flashlite/errors.h"

namespace flashlite {
namespace cpu_tiled {
namespace {

constexpr int64_t kQueryCols = 64;  // query columns (rows x heads of one group) per task
constexpr int64_t kKeys = 64;       // keys per K/V tile
constexpr int64_t kSmallCols = 8;   // tasks with at most this many query columns take the decode path
constexpr int64_t kSmallKeys = 256; // keys per chunk on the decode path (at most)
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---- Stored rows <-> fp32 (once per task, not per tile: plain code is enough).

void load_row(const void* base, DType dtype, int64_t offset, int64_t n, float* dst) {
  if (dtype == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, size_t(n) * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] = dtype == DType::f16 ? fp16_to_float(src[i]) : bf16_to_float(src[i]);
}

void store_row(void* base, DType dtype, int64_t offset, int64_t n, const float* src, float mul) {
  if (dtype == DType::f32) {
    float* dst = static_cast<float*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * mul;
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(base) + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] = dtype == DType::f16 ? float_to_fp16(src[i] * mul) : float_to_bf16(src[i] * mul);
}

// ---- Per-thread scratch, kept between calls (grow-only), 64-byte aligned.
struct Scratch {
  float* data = nullptr;
  size_t floats = 0;
  ~Scratch() { std::free(data); }
  float* get(size_t n) {
    if (n > floats) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(64, round_up(int64_t(n) * 4, 64)));
      floats = data ? n : 0;
      if (!data) throw std::bad_alloc();
    }
    return data;
  }
};

// One task: query rows [row0, row0 + rows) of sequence `seq`, q heads [head0, head0 + heads) (all of kv_head's group,
// or a chunk of it when the group has more than kQueryCols heads).
struct Task {
  int64_t seq, kv_head, head0, heads, row0, rows;
  double cost;  // visible (row, key) pairs x heads: heavy tasks are started first
};

struct Plan {
  const AttentionProblem& p;
  const TiledKernels& k;
  int64_t dp;           // head_dim rounded up to the vector width
  bool k_in_place;      // fp32 K is the GEMM's A operand as stored (any head_dim)
  bool v_in_place;      // fp32 V is the GEMM's B operand as stored (head_dim a multiple of the vector width)
  float q_sign;         // folded into Q^T: the sign of scale (0 for scale 0), so that log2_scale is > 0
  float log2_scale;     // score units -> log2 units: |scale| * log2(e), or log2(e) after the softcap
  float softcap_in, softcap_out;  // softcap: s -> softcap * tanh(s * scale / softcap)
};

// Visible key ranges of rows [i0, i1): the window range and the sink tokens below it, merged when they touch.
int visible_ranges(const AttentionProblem& p, const SequenceSlice& s, int64_t i0, int64_t i1, KeyRange out[2]) {
  const KeyRange win = window_key_range(p.mask, i0, i1, s.seq_q, s.seq_k);
  const int64_t sink_end = std::min<int64_t>(p.mask.sink_tokens, causal_key_end(p.mask, i1, s.seq_q, s.seq_k));
  int n = 0;
  if (sink_end > 0 && sink_end >= win.begin) {
    out[n++] = {0, std::max(sink_end, win.end)};
  } else {
    if (sink_end > 0) out[n++] = {0, sink_end};
    if (win.end > win.begin) out[n++] = {win.begin, win.end};
  }
  return n;
}

// ---- Long rows: the kernels accumulate o and l in fp32 over about kFoldKeys keys, then fold() adds them into float64
// totals and clears them, so a row's rounding error stays that of a kFoldKeys-key row at any length (one fp32
// accumulator over 2^23 equal terms was 3% off, and an fp32 sum of 2^24 ones stops growing). Rows up to kFoldKeys keys
// never fold (finalise reads the fp32 sums, as before); longer ones pay O(n_real * dp) float64 work per fold.
constexpr int64_t kFoldKeys = 2048;

struct Totals {
  double* o;      // (n_real, dp)  sum of p v, in the units of m_fold
  double* l;      // (n_real)      sum of p, in the units of m_fold
  float* m_fold;  // (n_real)      running max at the last fold, log2 units
  bool empty;     // nothing folded yet (o, l, m_fold unset)
};

// Moves the chunk accumulators o (n_real, dp) and l, scaled to the running max m, into the totals and clears l; o too
// when clear_o (the tiled path instead lets its next P V GEMM overwrite o).
void fold(Totals& tot, int64_t n_real, int64_t dp, float* o, float* l, const float* m, bool clear_o) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n = 0; n < n_real; ++n) {
    double* to = tot.o + n * dp;
    float* on = o + n * dp;
    const float mn = m[n];
    if (tot.empty) {
      for (int64_t x = 0; x < dp; ++x) to[x] = on[x];
      tot.l[n] = l[n];
    } else {
      // 2^(m_fold - m): 1 while the max stands (also -inf to -inf); NaN once m is +inf (the row is NaN anyway).
      const float mf = tot.m_fold[n];
      const double beta = mf == mn && mf != inf ? 1.0 : std::exp2(double(mf) - double(mn));
      for (int64_t x = 0; x < dp; ++x) to[x] = to[x] * beta + on[x];
      tot.l[n] = tot.l[n] * beta + l[n];
    }
    if (clear_o) std::fill(on, on + dp, 0.0f);
    l[n] = 0.0f;
    tot.m_fold[n] = mn;
  }
  tot.empty = false;
}

// Output rows and LSE of a task from m (log2 units) and its sums o (n_real, ldo) and l: the fp32 accumulators when
// nothing was folded, else the float64 totals. Column n = r * heads + g; tmp holds head_dim floats. The non-finite rule
// (include/flashlite/attention.h): a NaN or +inf sink logit or score poisons the row (out and LSE NaN; such a score's
// p = 2^NaN made l NaN); a row whose scores were all -inf or masked (m = -inf, l not NaN) is keyless: zeros and LSE the
// sink logit (or -inf), its o being 0 or 0 * NaN.
template <class T>
void finalise(const AttentionProblem& p, const SequenceSlice& s, const Task& t, const float* m, const T* o,
              const T* l_sum, int64_t ldo, float* tmp) {
  const int64_t d = p.head_dim, heads = t.heads, i0 = t.row0;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t g = 0; g < heads; ++g) {
      const int64_t n = r * heads + g, h = t.head0 + g, i = s.q_row0 + i0 + r;
      const double sink = p.sink_logits ? double(p.sink_logits[h]) : -inf;
      const double l = l_sum[n], m_nat = double(m[n]) * kLn2;
      const bool poisoned = std::isnan(sink) || sink == inf || std::isnan(l) || m_nat == inf;
      const bool keyless = !poisoned && m_nat == -inf;
      double lse = poisoned ? nan : sink, mul = poisoned ? nan : 0.0;
      if (!poisoned && !keyless) {  // the sink logit joins the denominator only
        const double row_max = std::max(m_nat, sink);
        const double e = std::exp(m_nat - row_max);
        const double denom = l * e + (sink == -inf ? 0.0 : std::exp(sink - row_max));
        lse = row_max + std::log(denom);
        mul = e / denom;
      }
      const int64_t out_off = s.batch_index * p.out_stride.batch + i * p.out_stride.seq + h * p.out_stride.head;
      const T* on = o + n * ldo;
      if (keyless) {  // exact zeros, whatever 0 * V left in o
        std::fill(tmp, tmp + d, 0.0f);
        store_row(p.out, p.dtype, out_off, d, tmp, 1.0f);
      } else if constexpr (std::is_same_v<T, float>) {
        store_row(p.out, p.dtype, out_off, d, on, float(mul));
      } else {
        for (int64_t x = 0; x < d; ++x) tmp[x] = float(on[x] * mul);
        store_row(p.out, p.dtype, out_off, d, tmp, 1.0f);
      }
      if (p.lse) p.lse[p.lse_stride.offset(s.batch_index, h, i)] = float(lse);
    }
  }
}

// Rows [j0, j0 + keys) of K (is_v false) or V of one kv head (element offset `base` of its row 0 in a dense layout)
// into dst as fp32, row stride ldd, columns zero-padded to pad_cols: one conversion, or one per page run when the
// problem reads a paged cache sequence in place (p.kv_pages; base is then the head offset alone).
void load_kv_rows(const Plan& plan, bool is_v, int64_t base, int64_t j0, int64_t keys, float* dst, int64_t ldd,
                  int64_t pad_cols) {
  const AttentionProblem& p = plan.p;
  const size_t elem = p.dtype == DType::f32 ? 4 : 2;
  const char* src = static_cast<const char*>(is_v ? p.v : p.k);
  const int64_t row = is_v ? p.v_stride.seq : p.k_stride.seq;
  const KvPagesView* pg = p.kv_pages;
  if (pg == nullptr) {
    plan.k.convert({src + (base + j0 * row) * elem, p.dtype, row, dst, ldd, keys, p.head_dim, pad_cols});
    return;
  }
  const int64_t page_stride = is_v ? pg->v_page_stride : pg->k_page_stride;
  for (int64_t j = j0; j < j0 + keys;) {
    const int64_t slot = j % pg->page_size, run = std::min(pg->page_size - slot, j0 + keys - j);
    const int64_t off = int64_t(pg->page_ids[j / pg->page_size]) * page_stride + slot * row + base;
    plan.k.convert({src + off * elem, p.dtype, row, dst + (j - j0) * ldd, ldd, run, p.head_dim, pad_cols});
    j += run;
  }
}

// ---- Masked keys never matter, but P V multiplies a masked key's p = 0 by its V row, and 0 * NaN = NaN. In a tile that
// the mask cuts, the keys hidden from some query column whose V row holds a NaN or inf (rare: a scan of those rows)
// are zeroed in the V operand and added back, p v, for the columns that see them (run_task, run_task_small).

bool row_finite(const float* x, int64_t n) {
  uint32_t bad = 0;  // branch-free, so that the scan vectorises
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    bad |= uint32_t((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// Keys c < keys with hidden[c] set whose V row (v + c * v_row, head_dim floats) is not finite, into bad; their count.
int hidden_nonfinite_v(const uint8_t* hidden, int64_t keys, const float* v, int64_t v_row, int64_t d, int16_t* bad) {
  int n = 0;
  for (int64_t c = 0; c < keys; ++c) {
    if (hidden[c] && !row_finite(v + c * v_row, d)) bad[n++] = int16_t(c);
  }
  return n;
}

// The V operand of keys [j0, j0 + keys) with the rows `bad` zeroed, in vbuf (row stride dp): converted again when it was
// read in place.
void zero_v_rows(const Plan& plan, int64_t v_base, int64_t j0, int64_t keys, const int16_t* bad, int n_bad,
                 bool in_place, float* vbuf, int64_t dp) {
  if (in_place) load_kv_rows(plan, true, v_base, j0, keys, vbuf, dp, dp);
  for (int b = 0; b < n_bad; ++b) std::fill(vbuf + bad[b] * dp, vbuf + (bad[b] + 1) * dp, 0.0f);
}

// The K (is_v false) or V operand of keys [j0, j0 + keys) as fp32 rows: the tensor as stored when in_place (base: the
// kv head's row 0), else converted into buf (row stride plan.dp, columns zero-padded to pad_cols).
struct KvOperand {
  const float* rows;
  int64_t row_stride;
};

KvOperand kv_operand(const Plan& plan, bool is_v, bool in_place, int64_t base, int64_t j0, int64_t keys, float* buf,
                     int64_t pad_cols) {
  const AttentionProblem& p = plan.p;
  if (in_place) {
    const int64_t row = is_v ? p.v_stride.seq : p.k_stride.seq;
    return {static_cast<const float*>(is_v ? p.v : p.k) + base + j0 * row, row};
  }
  load_kv_rows(plan, is_v, base, j0, keys, buf, plan.dp, pad_cols);
  return {buf, plan.dp};
}

// After P V over the operand with the rows `bad` zeroed: those keys added back, p v, for the query columns
// n = r * heads + g that see them (prob(n, c): column n's probability of key c). row: one V row's scratch (dp floats).
template <class Prob>
void add_zeroed_v_rows(const Plan& plan, const Task& t, const SequenceSlice& s, int64_t v_base, int64_t j0,
                       const int16_t* bad, int n_bad, float* row, float* o, Prob prob) {
  const AttentionProblem& p = plan.p;
  const int64_t d = p.head_dim, dp = plan.dp, heads = t.heads, i0 = t.row0;
  for (int b = 0; b < n_bad; ++b) {
    const int64_t c = bad[b];
    load_kv_rows(plan, true, v_base, j0 + c, 1, row, dp, dp);
    for (int64_t r = 0; r < t.rows; ++r) {
      if (!key_visible(p.mask, i0 + r, j0 + c, s.seq_q, s.seq_k)) continue;
      for (int64_t g = 0; g < heads; ++g) {
        const int64_t n = r * heads + g;
        const float pc = prob(n, c);
        for (int64_t x = 0; x < d; ++x) o[n * dp + x] += pc * row[x];
      }
    }
  }
}

void run_task(const Plan& plan, const Task& t, Scratch& scratch) {
  const AttentionProblem& p = plan.p;
  const TiledKernels& kern = plan.k;
  const SequenceSlice s = sequence_slice(p, t.seq);
  const int64_t d = p.head_dim, dp = plan.dp, heads = t.heads;
  const int64_t n_real = t.rows * heads, np = round_up(n_real, kern.width);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  float* const base = scratch.get(size_t(d * np + 2 * kKeys * dp + kKeys * np + n_real * dp + 3 * np + 2 * dp +
                                         2 * n_real * (dp + 1) + n_real));
  float* const qt = base;                  // (head_dim, np)  Q^T, pre-scaled; columns >= n_real are zero
  float* const kbuf = qt + d * np;         // (kKeys, dp)     converted K tile (fp16/bf16)
  float* const vbuf = kbuf + kKeys * dp;   // (kKeys, dp)     converted V tile, zero-padded columns
  float* const st = vbuf + kKeys * dp;     // (kKeys, np)     scores S^T, then probabilities P^T
  float* const o = st + kKeys * np;        // (n_real, dp)    unnormalised output accumulator
  float* const m = o + n_real * dp;        // (np)            running max, log2 units
  float* const l = m + np;                 // (np)            running sum
  float* const alpha = l + np;             // (np)            rescale factor of this step
  float* const row = alpha + np;           // (2 * dp)        one stored row as fp32
  // Float64 totals (every offset above is even: 8-byte aligned).
  Totals tot{reinterpret_cast<double*>(row + 2 * dp), reinterpret_cast<double*>(row + 2 * dp) + n_real * dp,
             row + 2 * dp + 2 * n_real * (dp + 1), true};

  // Q^T: column n = r * heads + g is query row row0 + r of q head head0 + g.
  std::fill(qt, qt + d * np, 0.0f);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t g = 0; g < heads; ++g) {
      const int64_t n = r * heads + g;
      load_row(p.q, p.dtype,
               s.batch_index * p.q_stride.batch + (s.q_row0 + t.row0 + r) * p.q_stride.seq + (t.head0 + g) * p.q_stride.head,
               d, row);
      for (int64_t x = 0; x < d; ++x) qt[x * np + n] = row[x] * plan.q_sign;
    }
  }
  std::fill(m, m + np, neg_inf);
  std::fill(l, l + np, 0.0f);
  std::fill(o, o + n_real * dp, 0.0f);

  const int64_t i0 = t.row0, i1 = t.row0 + t.rows;
  int64_t unfolded = 0;  // keys in o and l since the last fold
  bool o_folded = false;  // o was folded: the next P V overwrites it
  const int64_t k_base = s.batch_index * p.k_stride.batch + s.k_row0 * p.k_stride.seq + t.kv_head * p.k_stride.head;
  const int64_t v_base = s.batch_index * p.v_stride.batch + s.k_row0 * p.v_stride.seq + t.kv_head * p.v_stride.head;
  KeyRange ranges[2];
  const int n_ranges = visible_ranges(p, s, i0, i1, ranges);
  for (int ri = 0; ri < n_ranges; ++ri) {
    for (int64_t j0 = ranges[ri].begin; j0 < ranges[ri].end; j0 += kKeys) {
      const int64_t j1 = std::min(j0 + kKeys, ranges[ri].end), keys = j1 - j0;

      // K and V tiles as fp32 operands.
      const auto [ka, ka_row] = kv_operand(plan, false, plan.k_in_place, k_base, j0, keys, kbuf, d);
      auto [vb, vb_row] = kv_operand(plan, true, plan.v_in_place, v_base, j0, keys, vbuf, dp);

      // S^T = K Q^T, softcap, mask.
      kern.gemm({ka, ka_row, 1, qt, np, st, np, keys, np, d, false, nullptr});
      if (p.softcap > 0) kern.softcap({st, np, keys, np, plan.softcap_in, plan.softcap_out});
      int16_t bad[kKeys];  // hidden keys with a non-finite V row
      int n_bad = 0;
      if (!tile_fully_visible(p.mask, i0, i1, j0, j1, s.seq_q, s.seq_k)) {
        uint8_t hidden[kKeys] = {};
        for (int64_t c = 0; c < keys; ++c) {
          float* srow = st + c * np;
          for (int64_t r = 0; r < t.rows; ++r) {
            if (key_visible(p.mask, i0 + r, j0 + c, s.seq_q, s.seq_k)) continue;
            for (int64_t g = 0; g < heads; ++g) srow[r * heads + g] = neg_inf;
            hidden[c] = 1;
          }
        }
        n_bad = hidden_nonfinite_v(hidden, keys, vb, vb_row, d, bad);
        if (n_bad > 0) {
          zero_v_rows(plan, v_base, j0, keys, bad, n_bad, vb != vbuf, vbuf, dp);
          vb = vbuf;
          vb_row = dp;
        }
      }

      // Online softmax, then O = O * alpha + P V.
      kern.online_softmax({st, np, keys, np, plan.log2_scale, m, l, alpha});
      kern.gemm({st, 1, np, vb, vb_row, o, dp, n_real, dp, keys, !o_folded, alpha});
      o_folded = false;
      add_zeroed_v_rows(plan, t, s, v_base, j0, bad, n_bad, row, o,
                        [&](int64_t n, int64_t c) { return st[c * np + n]; });  // st holds P^T
      if ((unfolded += keys) >= kFoldKeys) {
        fold(tot, n_real, dp, o, l, m, false);
        unfolded = 0;
        o_folded = true;
      }
    }
  }

  if (tot.empty) {  // a row of at most ~kFoldKeys keys: straight from the fp32 sums
    finalise(p, s, t, m, o, l, dp, row);
    return;
  }
  if (!o_folded) fold(tot, n_real, dp, o, l, m, false);
  finalise(p, s, t, m, tot.o, tot.l, dp, row);
}

// A decode-shaped task (n_real <= kSmallCols query columns): keys are the vector lanes (SmallArgs), so a q_len 1
// GQA group of 2 does not pay for 8 or 16 padded query columns, and a chunk of up to kSmallKeys keys costs two kernel
// calls instead of three per 64 keys.
void run_task_small(const Plan& plan, const Task& t, Scratch& scratch) {
  const AttentionProblem& p = plan.p;
  const TiledKernels& kern = plan.k;
  const SequenceSlice s = sequence_slice(p, t.seq);
  const int64_t d = p.head_dim, dp = plan.dp, heads = t.heads, w = kern.width;
  const int64_t n_real = t.rows * heads;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Keys per chunk: the K and V chunks (when converted) stay near 32 KB each.
  const int64_t chunk = std::min<int64_t>(kSmallKeys, std::max<int64_t>(w, (8192 / dp) / w * w));
  const bool kv_in_place = plan.v_in_place;  // fp32 with head_dim a multiple of the width: rows readable as dp floats

  float* const base = scratch.get(size_t(n_real * dp * 2 + n_real * chunk + 2 * chunk * dp + 2 * n_real + dp +
                                         2 * n_real * (dp + 1) + n_real));
  float* const q = base;                // (n_real, dp)   Q rows, sign folded in, zero-padded
  float* const o = q + n_real * dp;     // (n_real, dp)   unnormalised output accumulator
  float* const sc = o + n_real * dp;    // (n_real, chunk) scores, then probabilities
  float* const m = sc + n_real * chunk; // (n_real)        running max, log2 units
  float* const l = m + n_real;          // (n_real)        running sum
  float* const kbuf = l + n_real;       // (chunk, dp)     converted K chunk (not fp32, or head_dim % width != 0)
  float* const vbuf = kbuf + chunk * dp;// (chunk, dp)     converted V chunk (in place: only for hidden non-finite rows)
  float* const row = vbuf + chunk * dp; // (dp)            one V row, then one output row
  // Float64 totals (every offset above is even: 8-byte aligned).
  Totals tot{reinterpret_cast<double*>(row + dp), reinterpret_cast<double*>(row + dp) + n_real * dp,
             row + dp + 2 * n_real * (dp + 1), true};

  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t g = 0; g < heads; ++g) {
      float* qn = q + (r * heads + g) * dp;
      load_row(p.q, p.dtype,
               s.batch_index * p.q_stride.batch + (s.q_row0 + t.row0 + r) * p.q_stride.seq + (t.head0 + g) * p.q_stride.head,
               d, qn);
      for (int64_t x = 0; x < d; ++x) qn[x] *= plan.q_sign;
      std::fill(qn + d, qn + dp, 0.0f);
    }
  }
  std::fill(m, m + n_real, neg_inf);
  std::fill(l, l + n_real, 0.0f);
  std::fill(o, o + n_real * dp, 0.0f);

  const int64_t i0 = t.row0, i1 = t.row0 + t.rows;
  const int64_t k_base = s.batch_index * p.k_stride.batch + s.k_row0 * p.k_stride.seq + t.kv_head * p.k_stride.head;
  const int64_t v_base = s.batch_index * p.v_stride.batch + s.k_row0 * p.v_stride.seq + t.kv_head * p.v_stride.head;
  KeyRange ranges[2];
  const int n_ranges = visible_ranges(p, s, i0, i1, ranges);
  int64_t unfolded = 0;  // keys in o and l since the last fold
  for (int ri = 0; ri < n_ranges; ++ri) {
    for (int64_t j0 = ranges[ri].begin; j0 < ranges[ri].end; j0 += chunk) {
      const int64_t j1 = std::min(j0 + chunk, ranges[ri].end), keys = j1 - j0, kp = round_up(keys, w);
      const KvOperand ko = kv_operand(plan, false, kv_in_place, k_base, j0, keys, kbuf, dp);
      const KvOperand vo = kv_operand(plan, true, kv_in_place, v_base, j0, keys, vbuf, dp);
      SmallArgs a{q, dp, ko.rows, ko.row_stride, vo.rows, vo.row_stride, sc, chunk, o, dp, n_real, keys, dp,
                  plan.log2_scale, m, l};
      kern.small_scores(a);
      if (p.softcap > 0) kern.softcap({sc, chunk, n_real, kp, plan.softcap_in, plan.softcap_out});
      int16_t bad[kSmallKeys];  // hidden keys with a non-finite V row
      int n_bad = 0;
      if (!tile_fully_visible(p.mask, i0, i1, j0, j1, s.seq_q, s.seq_k)) {
        uint8_t hidden[kSmallKeys] = {};
        for (int64_t r = 0; r < t.rows; ++r) {
          for (int64_t c = 0; c < keys; ++c) {
            if (key_visible(p.mask, i0 + r, j0 + c, s.seq_q, s.seq_k)) continue;
            for (int64_t g = 0; g < heads; ++g) sc[(r * heads + g) * chunk + c] = neg_inf;
            hidden[c] = 1;
          }
        }
        n_bad = hidden_nonfinite_v(hidden, keys, a.v, a.v_row, d, bad);
        if (n_bad > 0) {
          zero_v_rows(plan, v_base, j0, keys, bad, n_bad, kv_in_place, vbuf, dp);
          a.v = vbuf;
          a.v_row = dp;
        }
      }
      for (int64_t n = 0; n < n_real; ++n) std::fill(sc + n * chunk + keys, sc + n * chunk + kp, neg_inf);
      kern.small_softmax_pv(a);
      // p from the updated max (sc holds scores).
      add_zeroed_v_rows(plan, t, s, v_base, j0, bad, n_bad, row, o, [&](int64_t n, int64_t c) {
        return std::exp2(sc[n * chunk + c] * plan.log2_scale - std::max(m[n], -FLT_MAX));
      });
      if ((unfolded += keys) >= kFoldKeys) {
        fold(tot, n_real, dp, o, l, m, true);
        unfolded = 0;
      }
    }
  }
  if (tot.empty) {  // a row of at most ~kFoldKeys keys: straight from the fp32 sums
    finalise(p, s, t, m, o, l, dp, row);
    return;
  }
  if (unfolded > 0) fold(tot, n_real, dp, o, l, m, true);
  finalise(p, s, t, m, tot.o, tot.l, dp, row);
}

std::vector<Task> make_tasks(const AttentionProblem& p) {
  const int64_t group = p.group_size();
  const int64_t heads_per_task = std::min(group, kQueryCols);
  const int64_t rows_per_task = std::max<int64_t>(1, kQueryCols / heads_per_task);
  std::vector<Task> tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceSlice s = sequence_slice(p, b);
    for (int64_t i0 = 0; i0 < s.seq_q; i0 += rows_per_task) {
      const int64_t rows = std::min(rows_per_task, s.seq_q - i0);
      KeyRange ranges[2];
      const int n = visible_ranges(p, s, i0, i0 + rows, ranges);
      double keys = 0;
      for (int r = 0; r < n; ++r) keys += double(ranges[r].end - ranges[r].begin);
      for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
        for (int64_t g0 = 0; g0 < group; g0 += heads_per_task) {
          const int64_t heads = std::min(heads_per_task, group - g0);
          tasks.push_back({b, kvh, kvh * group + g0, heads, i0, rows, (keys + 16) * double(rows * heads)});
        }
      }
    }
  }
  // Longest first, so that under a causal mask the last (heaviest) q tiles start first and the dynamic schedule fills
  // in behind them.
  // (Decode tasks all cost the same: skip the sort and its buffer allocation.)
  const auto heavier = [](const Task& a, const Task& b) { return a.cost > b.cost; };
  if (!std::is_sorted(tasks.begin(), tasks.end(), heavier)) std::stable_sort(tasks.begin(), tasks.end(), heavier);
  return tasks;
}

}  // namespace
}  // namespace cpu_tiled

const cpu_tiled::TiledKernels& cpu_tiled::kernels_of(CpuSimd simd) {
  switch (simd) {
    case CpuSimd::avx512: return kernels_avx512();
    case CpuSimd::avx2: return kernels_avx2();
    case CpuSimd::portable: break;
  }
  return kernels_portable();
}

// The condition mirrors make_tasks' task shape.
bool cpu_tiled_decode_shaped(const AttentionProblem& p) {
  using namespace cpu_tiled;
  const int64_t heads = std::min(p.group_size(), kQueryCols);
  const int64_t rows = std::min(std::max<int64_t>(1, kQueryCols / heads), p.seq_q);
  return rows * heads <= kSmallCols;
}

void run_cpu_tiled(const AttentionProblem& p, CpuSimd simd) {
  using namespace cpu_tiled;
  const TiledKernels& kern = kernels_of(simd);
  const bool f32 = p.dtype == DType::f32;
  const bool cap = p.softcap > 0;
  Plan plan{p,
            kern,
            round_up(p.head_dim, kern.width),
            f32 && p.kv_pages == nullptr,  // a paged sequence's rows are copied chunk by chunk (load_kv_rows)
            f32 && p.head_dim % kern.width == 0 && p.kv_pages == nullptr,
            cap ? 1.0f : p.scale > 0 ? 1.0f : p.scale < 0 ? -1.0f : 0.0f,
            float(cap || p.scale == 0 ? kLog2e : std::fabs(p.scale) * kLog2e),
            cap ? float(p.scale / p.softcap) : 0.0f,
            float(p.softcap)};
  const std::vector<Task> tasks = make_tasks(p);
  const int64_t n_tasks = int64_t(tasks.size());
  double work = 0;  // (row, key, head) triples: below ~1M a parallel region costs more than it saves
  for (const Task& t : tasks) work += t.cost;
  std::atomic<bool> failed{false};
  const auto run_one = [&](int64_t i, Scratch& scratch) {
    try {
      const Task& t = tasks[size_t(i)];
      if (kern.small_scores && t.rows * t.heads <= kSmallCols) {
        run_task_small(plan, t, scratch);
      } else {
        run_task(plan, t, scratch);
      }
    } catch (...) {
      failed = true;
    }
  };
  // Serial inside an enclosing parallel region (cpu_prefill runs decode-shaped sequences one per thread).
  if (n_tasks > 1 && work * double(p.head_dim) > 2e5 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tasks; ++i) {
      thread_local Scratch scratch;
      run_one(i, scratch);
    }
  } else {  // small problems (decode steps) run on the calling thread without entering the OpenMP runtime
    thread_local Scratch scratch;
    for (int64_t i = 0; i < n_tasks; ++i) run_one(i, scratch);
  }
  if (failed) throw Error(ErrorKind::runtime, "cpu backend: out of memory for the per-thread tile scratch");
}

}  // namespace flashlite
