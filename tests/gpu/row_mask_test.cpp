// The fused kernels' per-row interval form of the mask (src/cuda/fwd/row_mask.h) against the shared predicate
// (src/common/mask.h), exhaustively on small shapes. Host-only: runs without a GPU.
#include <gtest/gtest.h>

#include "cuda/fwd/row_mask.h"

namespace {

using flashlite::MaskParams;
using flashlite::cuda_fwd::row_keys;
using flashlite::cuda_fwd::row_visible;

TEST(RowMask, IntervalsMatchThePredicateExhaustively) {
  int64_t checked = 0;
  for (bool causal : {false, true})
    for (int wl : {-1, 0, 1, 3, 7})
      for (int wr : {-1, 0, 2, 5})
        for (int sinks : {0, 1, 3, 20}) {
          const MaskParams m{causal, wl, wr, sinks};
          for (int64_t sq = 1; sq <= 12; ++sq)
            for (int64_t sk = 0; sk <= 12; ++sk)
              for (int64_t i = 0; i < sq; ++i) {
                const auto rk = row_keys(m, i, sq, sk);
                for (int64_t j = 0; j < sk + 3; ++j, ++checked) {
                  const bool want = j < sk && flashlite::key_visible(m, i, j, sq, sk);
                  ASSERT_EQ(row_visible(rk, j), want) << "causal " << causal << " wl " << wl << " wr " << wr
                                                      << " sinks " << sinks << " sq " << sq << " sk " << sk
                                                      << " i " << i << " j " << j;
                }
              }
        }
  EXPECT_GT(checked, 100000);
}

}  // namespace
