#pragma once
// The one mask predicate every backend uses (CPU reference, naive, tiled CPU, CUDA), so they cannot disagree.
// See include/flashlite/attention.h for the semantics.
#include <cstdint>

#include "common/host_device.h"

namespace flashlite {

struct MaskParams {
  bool causal = false;
  int window_left = -1;   // -1 = unlimited
  int window_right = -1;  // -1 = unlimited
  int sink_tokens = 0;
};

// Key position of query row i: bottom-right alignment (the last query sees the last key).
FL_HD int64_t query_position(int64_t i, int64_t seq_q, int64_t seq_k) { return i + (seq_k - seq_q); }

FL_HD bool key_visible(const MaskParams& m, int64_t i, int64_t j, int64_t seq_q, int64_t seq_k) {
  const int64_t p = query_position(i, seq_q, seq_k);
  if (m.causal && j > p) return false;
  const bool in_window = (m.window_left < 0 || j >= p - m.window_left) && (m.window_right < 0 || j <= p + m.window_right);
  return in_window || j < m.sink_tokens;
}

// Half-open key range [begin, end) outside of which no key is visible to any of the rows [i0, i1), ignoring sink
// tokens (which add [0, sink_tokens)). Used to skip tiles that the mask makes invisible.
struct KeyRange {
  int64_t begin, end;
};

FL_HD KeyRange window_key_range(const MaskParams& m, int64_t i0, int64_t i1, int64_t seq_q, int64_t seq_k) {
  const int64_t p0 = query_position(i0, seq_q, seq_k);
  const int64_t p1 = query_position(i1 - 1, seq_q, seq_k);
  int64_t begin = 0, end = seq_k;
  if (m.window_left >= 0 && p0 - m.window_left > begin) begin = p0 - m.window_left;
  int64_t right = -1;  // -1: no right limit
  if (m.causal) right = 0;
  if (m.window_right >= 0 && (right < 0 || m.window_right < right)) right = m.window_right;
  if (right >= 0 && p1 + right + 1 < end) end = p1 + right + 1;
  if (end < begin) end = begin;
  if (begin > seq_k) begin = end = seq_k;
  if (end < 0) begin = end = 0;
  return {begin, end};
}

// Causal limit alone: keys > this are invisible even for sink tokens. Returns end (exclusive) for rows [i0, i1).
FL_HD int64_t causal_key_end(const MaskParams& m, int64_t i1, int64_t seq_q, int64_t seq_k) {
  if (!m.causal) return seq_k;
  const int64_t e = query_position(i1 - 1, seq_q, seq_k) + 1;
  return e < 0 ? 0 : (e > seq_k ? seq_k : e);
}

// The keys that rows [i0, i1) may see, as 32-bit bounds: their window range (window_key_range) and the sink tokens
// [0, sink_end) that the causal limit leaves. `may_see(j0, j1)` is false only when no row sees a key of [j0, j1): a
// tile it rules out holds nothing for these rows (it may say true for a tile none of them sees).
struct RowsKeys {
  int win_begin = 0, win_end = 0, sink_end = 0;
  FL_HD bool may_see(int j0, int j1) const { return (j0 < win_end && win_begin < j1) || j0 < sink_end; }
};
FL_HD RowsKeys rows_keys(const MaskParams& m, int64_t i0, int64_t i1, int64_t seq_q, int64_t seq_k) {
  if (i1 <= i0) return {};
  const KeyRange w = window_key_range(m, i0, i1, seq_q, seq_k);
  int64_t sink_end = m.sink_tokens < seq_k ? m.sink_tokens : seq_k;
  const int64_t causal_end = causal_key_end(m, i1, seq_q, seq_k);
  if (causal_end < sink_end) sink_end = causal_end;
  return {int(w.begin), int(w.end), int(sink_end)};
}

// True when every (i, j) of the tile [i0, i1) x [j0, j1) is visible, so the predicate need not be evaluated.
FL_HD bool tile_fully_visible(const MaskParams& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t seq_q,
                              int64_t seq_k) {
  const int64_t pfirst = query_position(i0, seq_q, seq_k);
  const int64_t plast = query_position(i1 - 1, seq_q, seq_k);
  if (m.causal && j1 - 1 > pfirst) return false;
  if (m.window_right >= 0 && j1 - 1 > pfirst + m.window_right) return false;
  if (m.window_left >= 0 && j0 < plast - m.window_left) {
    // Keys below the window of the last row are visible only if they are sink tokens.
    const int64_t below_end = j1 < plast - m.window_left ? j1 : plast - m.window_left;
    if (below_end > m.sink_tokens) return false;
  }
  return true;
}

// Query blocks [begin, end) of bm rows: exactly the blocks with a row that sees a key of [j0, j1) (rows whose window
// reaches the keys; with sink keys among them, every row from the first that may see one: the union is one range),
// the q blocks a backward key block walks. tests/mask checks it exhaustively against key_visible.
struct BlockRange {
  int begin, end;
};
FL_HD BlockRange q_blocks_seeing_keys(const MaskParams& m, int64_t j0, int64_t j1, int64_t seq_q, int64_t seq_k,
                                      int64_t bm) {
  constexpr int64_t kFar = int64_t(1) << 40;
  int64_t right = m.causal ? 0 : -1;  // the nearest right limit (-1: none)
  if (m.window_right >= 0 && (right < 0 || m.window_right < right)) right = m.window_right;
  int64_t plo = right >= 0 ? j0 - right : -kFar;  // key positions p = i + seq_k - seq_q of the rows
  int64_t phi = m.window_left >= 0 ? j1 - 1 + m.window_left : kFar;
  if (j0 < m.sink_tokens) {
    const int64_t sink_lo = m.causal ? j0 : -kFar;
    if (sink_lo < plo) plo = sink_lo;
    phi = kFar;
  }
  const int64_t off = seq_k - seq_q;
  const int64_t ilo = plo - off > 0 ? plo - off : 0;
  const int64_t ihi = phi - off < seq_q - 1 ? phi - off : seq_q - 1;
  if (ihi < ilo) return {0, 0};
  return {int(ilo / bm), int(ihi / bm) + 1};
}

}  // namespace flashlite
