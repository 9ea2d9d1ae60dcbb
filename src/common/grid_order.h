#pragma once
// The order of the CUDA backward's CTAs over (tile, head, sequence), host and device, so that tests/mask can check it
// exhaustively on the CPU.
#include <cstdint>

#include "common/host_device.h"
#include "common/mask.h"

namespace flashlite {

struct GridPlace {
  int tile, head, batch;
};

// CTA x of a grid of `grid` = tiles x heads x sequences CTAs: head-major, so that a head's tiles run together and
// share its Q / dO (or K / V) in L2 (tile-major order for every call measured up to 12% slower on the H100 without
// sinks: Hopper D128 causal S 2048). With `lead`,
// every (sequence, head)'s tile 0 comes first: the dK / dV kernels' key block 0 where sink tokens make it far heavier
// than the rest (sink_block_leads), which head-major order spread one per head up to the last wave.
FL_HD GridPlace grid_place(unsigned x, unsigned grid, int tiles, int heads, bool lead) {
  if (lead) {
    const unsigned units = grid / unsigned(tiles);  // (sequence, head) pairs
    if (x < units) return {0, int(x % unsigned(heads)), int(x / unsigned(heads))};
    x -= units;
    const int rest = int(x / unsigned(tiles - 1));
    return {1 + int(x % unsigned(tiles - 1)), rest % heads, rest / heads};
  }
  const int rest = int(x / unsigned(tiles));
  return {int(x % unsigned(tiles)), rest % heads, rest / heads};
}

// Whether the dK / dV grids start every head's key block 0 (keys [0, bn)) first: with sink tokens every q block
// sees it, and here it sees more than twice the q blocks (of bm rows) that key block 1 sees (under a window: 128
// against 17 at S 8192, window 1024, bm = bn = 64). Timed on the H100 at window 1024 + 4 sinks, S 8192, D128: +16%
// (Hopper) and +15% (mma.sync).
FL_HD bool sink_block_leads(const MaskParams& m, int64_t seq_q, int64_t seq_k, int64_t bm, int64_t bn) {
  if (m.sink_tokens <= 0 || seq_k <= bn) return false;
  const BlockRange first = q_blocks_seeing_keys(m, 0, bn, seq_q, seq_k, bm);
  const BlockRange second = q_blocks_seeing_keys(m, bn, 2 * bn < seq_k ? 2 * bn : seq_k, seq_q, seq_k, bm);
  return first.end - first.begin > 2 * (second.end - second.begin);
}

}  // namespace flashlite
