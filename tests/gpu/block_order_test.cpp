// The fused kernels' block order (src/cuda/fwd/block_order.h): every order maps the pairs x q_tiles blocks one to one
// onto (pair, rank), rank-major groups keep their pairs together and put rank 0 first. Host-only: runs without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/fwd/block_order.h"

namespace {

using flashlite::cuda_fwd::block_pair_rank;

TEST(BlockOrder, EveryOrderIsABijection) {
  for (int pairs : {1, 2, 3, 7, 8, 9, 16, 31, 64, 513})
    for (int tiles : {1, 2, 5, 8, 33})
      for (bool rank_major : {false, true})
        for (int group : {0, 1, 3, 8, 32, 600}) {
          std::vector<int> seen(size_t(pairs) * tiles, 0);
          for (int b = 0; b < pairs * tiles; ++b) {
            const auto pr = block_pair_rank(b, pairs, tiles, rank_major, group);
            ASSERT_TRUE(pr.pair >= 0 && pr.pair < pairs && pr.rank >= 0 && pr.rank < tiles)
                << "pairs " << pairs << " tiles " << tiles << " rank_major " << rank_major << " group " << group
                << " block " << b << " -> (" << pr.pair << ", " << pr.rank << ")";
            ++seen[size_t(pr.pair) * tiles + pr.rank];
          }
          for (size_t i = 0; i < seen.size(); ++i)
            ASSERT_EQ(seen[i], 1) << "pairs " << pairs << " tiles " << tiles << " rank_major " << rank_major
                                  << " group " << group << " (pair, rank) #" << i;
        }
}

TEST(BlockOrder, GroupsRunRankMajorOneAfterAnother) {
  const int pairs = 20, tiles = 4, group = 8;  // groups of 8, 8, 4 pairs
  int b = 0;
  for (int g0 : {0, 8, 16}) {
    const int n = g0 == 16 ? 4 : 8;
    for (int rank = 0; rank < tiles; ++rank)
      for (int i = 0; i < n; ++i, ++b) {
        const auto pr = block_pair_rank(b, pairs, tiles, true, group);
        EXPECT_EQ(pr.pair, g0 + i) << "block " << b;
        EXPECT_EQ(pr.rank, rank) << "block " << b;
      }
  }
  // One group (0): rank-major over the whole grid; pair-major ignores the group.
  EXPECT_EQ(block_pair_rank(pairs, pairs, tiles, true, 0).rank, 1);
  EXPECT_EQ(block_pair_rank(pairs, pairs, tiles, true, 0).pair, 0);
  EXPECT_EQ(block_pair_rank(5, pairs, tiles, false, group).pair, 1);
  EXPECT_EQ(block_pair_rank(5, pairs, tiles, false, group).rank, 1);
}

}  // namespace
