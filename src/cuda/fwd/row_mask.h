#pragma once
// The mask predicate of src/common/mask.h restated per query row as intervals, for the fused kernels' boundary
// tiles: key j of row i is visible exactly when (lo <= j <= hi) || j < sink_end, which costs three compares per
// score instead of the 64-bit predicate (and far fewer live registers). tests/gpu/row_mask_test.cpp checks the
// equivalence with key_visible exhaustively on small shapes; the GPU grid checks it end to end.
#include <cstdint>

#include "common/mask.h"

namespace flashlite::cuda_fwd {

struct RowKeys {
  int64_t lo, hi;    // window (and causal) range, inclusive; empty when hi < lo
  int64_t sink_end;  // sink tokens [0, sink_end) that the causal limit leaves visible
};

// Row i of a sequence with lengths (seq_q, seq_k); keys past seq_k are excluded.
FL_HD RowKeys row_keys(const MaskParams& m, int64_t i, int64_t seq_q, int64_t seq_k) {
  const int64_t p = query_position(i, seq_q, seq_k);
  RowKeys r{0, seq_k - 1, m.sink_tokens < seq_k ? m.sink_tokens : seq_k};
  if (m.causal && p < r.hi) r.hi = p;
  if (m.window_right >= 0 && p + m.window_right < r.hi) r.hi = p + m.window_right;
  if (m.window_left >= 0 && p - m.window_left > r.lo) r.lo = p - m.window_left;
  if (m.causal && p + 1 < r.sink_end) r.sink_end = p + 1 < 0 ? 0 : p + 1;
  return r;
}

// x clamped to [lo, hi], as int (tile-relative key bounds).
FL_HD int clamp_to(int64_t x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : int(x); }

FL_HD bool row_visible(const RowKeys& r, int64_t j) { return (j >= r.lo && j <= r.hi) || j < r.sink_end; }

}  // namespace flashlite::cuda_fwd
