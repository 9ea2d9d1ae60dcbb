// The tile helpers of src/common/mask.h must agree with the predicate they summarise: checked exhaustively on small
// problems against key_visible itself (and the backward's q-block range).
#include <gtest/gtest.h>

#include <algorithm>

#include "common/mask.h"

namespace flashlite {
namespace {

struct Case {
  int64_t seq_q, seq_k;
  MaskParams mask;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int64_t sq : {1, 3, 7, 16}) {
    for (int64_t sk : {1, 5, 16, 23}) {
      for (bool causal : {false, true}) {
        for (int wl : {-1, 0, 2, 9}) {
          for (int wr : {-1, 0, 3}) {
            for (int sinks : {0, 1, 4}) cases.push_back({sq, sk, {causal, wl, wr, sinks}});
          }
        }
      }
    }
  }
  return cases;
}

TEST(Mask, BottomRightCausal) {
  const MaskParams causal{true, -1, -1, 0};
  // seq_q 2, seq_k 5: row 0 sits at key 3, row 1 at key 4.
  EXPECT_TRUE(key_visible(causal, 0, 3, 2, 5));
  EXPECT_FALSE(key_visible(causal, 0, 4, 2, 5));
  EXPECT_TRUE(key_visible(causal, 1, 4, 2, 5));
  // seq_q 5, seq_k 2: rows 0..2 see nothing.
  for (int j = 0; j < 2; ++j) EXPECT_FALSE(key_visible(causal, 2, j, 5, 2));
  EXPECT_TRUE(key_visible(causal, 3, 0, 5, 2));
}

TEST(Mask, SinksBypassWindowButNotCausal) {
  const MaskParams m{true, 1, -1, 2};
  EXPECT_TRUE(key_visible(m, 9, 0, 10, 10));   // sink, far outside the window
  EXPECT_FALSE(key_visible(m, 9, 5, 10, 10));  // outside the window, not a sink
  EXPECT_FALSE(key_visible(m, 0, 1, 10, 10));  // a sink but in the causal future of row 0
}

TEST(Mask, WindowKeyRangeCoversEveryVisibleNonSinkKey) {
  for (const Case& c : all_cases()) {
    for (int64_t i0 = 0; i0 < c.seq_q; ++i0) {
      for (int64_t i1 = i0 + 1; i1 <= c.seq_q; ++i1) {
        const KeyRange r = window_key_range(c.mask, i0, i1, c.seq_q, c.seq_k);
        const int64_t causal_end = causal_key_end(c.mask, i1, c.seq_q, c.seq_k);
        ASSERT_LE(r.begin, r.end);
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = 0; j < c.seq_k; ++j) {
            if (!key_visible(c.mask, i, j, c.seq_q, c.seq_k)) continue;
            ASSERT_LT(j, causal_end) << "row " << i << " key " << j;
            if (j >= c.mask.sink_tokens) {
              ASSERT_TRUE(j >= r.begin && j < r.end) << "row " << i << " key " << j << " range [" << r.begin << ", "
                                                     << r.end << ") sq " << c.seq_q << " sk " << c.seq_k;
            }
          }
        }
      }
    }
  }
}

TEST(Mask, TileFullyVisibleIsNeverWrong) {
  int fully = 0;
  for (const Case& c : all_cases()) {
    for (int64_t i0 = 0; i0 < c.seq_q; i0 += 2) {
      const int64_t i1 = std::min(c.seq_q, i0 + 3);
      for (int64_t j0 = 0; j0 < c.seq_k; j0 += 3) {
        const int64_t j1 = std::min(c.seq_k, j0 + 4);
        if (!tile_fully_visible(c.mask, i0, i1, j0, j1, c.seq_q, c.seq_k)) continue;
        ++fully;
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = j0; j < j1; ++j) ASSERT_TRUE(key_visible(c.mask, i, j, c.seq_q, c.seq_k));
        }
      }
    }
  }
  EXPECT_GT(fully, 1000);  // the helper must also say "yes" often, or tiles are masked needlessly
}

// rows_keys(...).may_see rules a key range out only when no row of the range sees one of its keys (the Hopper dQ
// kernel's warpgroups skip such tiles, and take the sink tile's first keys alone when the rest is ruled out).
TEST(Mask, RowsKeysRulesOutOnlyKeysNoRowSees) {
  int ruled_out = 0, seen = 0;
  for (const Case& c : all_cases()) {
    for (int64_t i0 = 0; i0 < c.seq_q; ++i0) {
      for (int64_t i1 = i0 + 1; i1 <= c.seq_q; i1 += 2) {
        const RowsKeys rk = rows_keys(c.mask, i0, i1, c.seq_q, c.seq_k);
        for (int j0 = 0; j0 < int(c.seq_k) + 2; ++j0) {
          for (int wj : {1, 2, 5, 64}) {
            const int j1 = j0 + wj;  // past seq_k too, as a kernel's last tile reaches
            bool sees = false;
            for (int64_t i = i0; i < i1 && !sees; ++i) {
              for (int64_t j = j0; j < std::min<int64_t>(j1, c.seq_k) && !sees; ++j) {
                sees = key_visible(c.mask, i, j, c.seq_q, c.seq_k);
              }
            }
            seen += sees;
            if (rk.may_see(j0, j1)) continue;
            ++ruled_out;
            ASSERT_FALSE(sees) << "rows [" << i0 << ", " << i1 << ") keys [" << j0 << ", " << j1 << ") sq "
                               << c.seq_q << " sk " << c.seq_k << " causal " << c.mask.causal << " window "
                               << c.mask.window_left << "," << c.mask.window_right << " sinks "
                               << c.mask.sink_tokens;
          }
        }
      }
    }
  }
  EXPECT_GT(seen, 10000);
  EXPECT_GT(ruled_out, 10000);  // and it rules ranges out often, or nothing is skipped
  EXPECT_FALSE(rows_keys(MaskParams{}, 3, 3, 8, 8).may_see(0, 8));  // no rows see nothing
}

// The q-block range a backward key block walks (q_blocks_seeing_keys) holds exactly the blocks of bm rows that see
// one of its keys: none is dropped (its gradients would be lost) and none is walked for nothing.
TEST(Mask, QBlocksSeeingKeysIsExactlyTheBlocksThatSeeTheKeys) {
  int empty = 0;
  for (const Case& c : all_cases()) {
    for (int64_t bm : {1, 2, 3, 4, 8}) {
      const int64_t blocks = (c.seq_q + bm - 1) / bm;
      for (int64_t j0 = 0; j0 < c.seq_k; ++j0) {
        for (int64_t wj : {1, 3, 4}) {
          const int64_t j1 = std::min(c.seq_k, j0 + wj);
          const BlockRange r = q_blocks_seeing_keys(c.mask, j0, j1, c.seq_q, c.seq_k, bm);
          ASSERT_LE(r.begin, r.end);
          ASSERT_GE(r.begin, 0);
          ASSERT_LE(r.end, blocks);
          empty += r.begin == r.end;
          for (int64_t blk = 0; blk < blocks; ++blk) {
            bool sees = false;
            for (int64_t i = blk * bm; i < std::min(c.seq_q, blk * bm + bm) && !sees; ++i) {
              for (int64_t j = j0; j < j1 && !sees; ++j) sees = key_visible(c.mask, i, j, c.seq_q, c.seq_k);
            }
            ASSERT_EQ(sees, blk >= r.begin && blk < r.end)
                << "block " << blk << " of " << bm << " rows, keys [" << j0 << ", " << j1 << ") sq " << c.seq_q
                << " sk " << c.seq_k << " causal " << c.mask.causal << " window " << c.mask.window_left << ","
                << c.mask.window_right << " sinks " << c.mask.sink_tokens;
          }
        }
      }
    }
  }
  EXPECT_GT(empty, 1000);  // masks that hide whole key blocks occur, and give an empty walk
}

}  // namespace
}  // namespace flashlite
