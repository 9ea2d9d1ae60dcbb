#pragma once
// Which (sequence, head) pair and query-tile rank a block of the fused kernels' 1-D grid works on (both the mma.sync
// and the Hopper kernel, fwd_common.cuh's decode_block). Host and device: tests/gpu/block_order_test.cpp checks on
// the CPU that every order is a bijection between blocks and (pair, rank).
#include "common/mask.h"  // FL_HD

namespace flashlite::cuda_fwd {

struct PairRank {
  int pair, rank;
};

// Block `block` of pairs x q_tiles blocks.
//   pair-major (rank_major false): a pair's tiles side by side (they share its K/V in L2);
//   rank-major: rank 0 of every pair first, then rank 1, ... (longest-job-first when rank 0 is a sequence's heaviest
//     tile), inside groups of rank_group pairs that follow one another, so a group's K/V stays in L2 while its
//     tiles run (rank_group <= 0 or >= pairs: one group, the whole grid).
FL_HD PairRank block_pair_rank(int block, int pairs, int q_tiles, bool rank_major, int rank_group) {
  if (!rank_major) return {block / q_tiles, block % q_tiles};
  const int group = rank_group > 0 && rank_group < pairs ? rank_group : pairs;
  const int g = block / (group * q_tiles);
  const int within = block - g * group * q_tiles;
  const int g_pairs = group < pairs - g * group ? group : pairs - g * group;  // the last group may be smaller
  const int rank = within / g_pairs;
  return {g * group + (within - rank * g_pairs), rank};
}

}  // namespace flashlite::cuda_fwd
