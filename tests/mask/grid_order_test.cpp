// The CUDA backward's CTA order (src/common/grid_order.h), checked exhaustively on small grids: every CTA gets a
// distinct (tile, head, sequence), the order is head-major, and with `lead` every tile 0 comes first.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "common/grid_order.h"

namespace flashlite {
namespace {

TEST(GridOrder, EveryCtaGetsADistinctPlace) {
  for (int tiles : {1, 2, 5}) {
    for (int heads : {1, 3}) {
      for (int batch : {1, 4}) {
        for (bool lead : {false, true}) {
          const unsigned grid = unsigned(tiles * heads * batch);
          std::set<std::tuple<int, int, int>> seen;
          for (unsigned x = 0; x < grid; ++x) {
            const GridPlace g = grid_place(x, grid, tiles, heads, lead);
            ASSERT_TRUE(g.tile >= 0 && g.tile < tiles && g.head >= 0 && g.head < heads && g.batch >= 0 &&
                        g.batch < batch) << "x " << x;
            seen.insert({g.tile, g.head, g.batch});
            const unsigned units = unsigned(heads * batch);
            if (lead) {
              EXPECT_EQ(g.tile == 0, x < units) << "x " << x << ": tile 0 of every head leads";
            } else {
              EXPECT_EQ(g.batch * heads + g.head, int(x) / tiles) << "x " << x << ": head-major";
            }
          }
          EXPECT_EQ(seen.size(), size_t(grid)) << tiles << " " << heads << " " << batch << " " << lead;
        }
      }
    }
  }
}

TEST(GridOrder, SinkBlockLeadsOnlyWhereItIsFarHeavier) {
  const MaskParams window_sinks{true, 1024, -1, 4};
  EXPECT_TRUE(sink_block_leads(window_sinks, 8192, 8192, 64, 64));
  EXPECT_TRUE(sink_block_leads(window_sinks, 8192, 8192, 64, 128));
  EXPECT_FALSE(sink_block_leads({true, 1024, -1, 0}, 8192, 8192, 64, 64)) << "no sinks";
  EXPECT_FALSE(sink_block_leads({true, -1, -1, 4}, 8192, 8192, 64, 64)) << "causal: block 1 sees nearly as many";
  EXPECT_FALSE(sink_block_leads({false, -1, -1, 4}, 8192, 8192, 64, 64)) << "no mask: all blocks alike";
  EXPECT_FALSE(sink_block_leads(window_sinks, 8192, 64, 64, 64)) << "one key block";
  EXPECT_TRUE(sink_block_leads({true, 100, -1, 4}, 2048, 2048, 64, 64)) << "32 q blocks against 3";
  EXPECT_FALSE(sink_block_leads({true, 1024, -1, 4}, 2048, 2048, 64, 64)) << "32 against 17: not twice";
}

}  // namespace
}  // namespace flashlite
