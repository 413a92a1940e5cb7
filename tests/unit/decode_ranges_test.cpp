// How a decode tile's blocks split over its CTAs and what the publish packs from that
// (blocks_per_split and splits_with_blocks, cuda/kernels/indexer_traits.h): the kernels
// take range y = [y * per_split, min(n, (y + 1) * per_split)) and give each warp a quarter of it;
// the last CTA reads the lists of splits_with_blocks(n, per_split) ranges, each
// min(fill, ceil(per_split / lists)) keys long (publish_and_merge, cuda/kernels/decode_topk.cuh).
// A range the publish does not count, or a warp with more candidates than the packed length,
// would drop keys without a trace, so both are checked for the tile sizes the decode grids meet.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/kernels/indexer_traits.h"

namespace m3sa::testing {
namespace {

using cuda::blocks_per_split;
using cuda::splits_with_blocks;

constexpr int kWarpLists = 4; // the Hopper kernel's lists a range: one a warp

struct Range {
  int begin, end;
};
Range range_of(int y, int n, int per_split) {
  const int begin = y * per_split;
  return {begin, std::min(n, begin + per_split)};
}

TEST(DecodeRanges, EveryBlockInExactlyOneRangeAndTheCountedRangesHoldThemAll) {
  for (int min_per_split : {1, kWarpLists})
    for (int splits : {1, 2, 3, 4, 16, 33, 66, 132, 264})
      for (int n = 0; n <= 2100; n += (n < 300 ? 1 : 37)) {
        SCOPED_TRACE(::testing::Message()
                     << "n " << n << " splits " << splits << " min " << min_per_split);
        const int per_split = blocks_per_split(n, splits, min_per_split);
        ASSERT_GE(per_split, 0);
        if (n > 0) {
          EXPECT_GE(per_split, min_per_split);
        } else {
          EXPECT_EQ(per_split, 0);
        }
        std::vector<int> seen(n, 0);
        int non_empty = 0, last_non_empty = -1;
        for (int y = 0; y < splits; ++y) {
          const Range r = range_of(y, n, per_split);
          if (r.end <= r.begin) continue;
          ++non_empty;
          EXPECT_EQ(last_non_empty, y - 1) << "the ranges with blocks come first";
          last_non_empty = y;
          for (int b = r.begin; b < r.end; ++b) ++seen[b];
        }
        for (int b = 0; b < n; ++b) ASSERT_EQ(seen[b], 1) << "block " << b;
        EXPECT_EQ(splits_with_blocks(n, per_split), non_empty);
      }
}

TEST(DecodeRanges, AWarpNeverHoldsMoreCandidatesThanItsPublishedList) {
  for (int fill : {1, 8, 13, 16, 31, 32})
    for (int splits : {1, 4, 33, 132})
      for (int n = 1; n <= 2100; n += (n < 300 ? 1 : 41)) {
        const int per_split = blocks_per_split(n, splits, kWarpLists);
        const int len = std::min(fill, (per_split + kWarpLists - 1) / kWarpLists);
        for (int y = 0; y < splits; ++y) {
          const Range r = range_of(y, n, per_split);
          const int count = std::max(0, r.end - r.begin);
          const int per_warp = (count + kWarpLists - 1) / kWarpLists;
          for (int w = 0; w < kWarpLists; ++w) {
            const int blocks = std::max(0, std::min(count - w * per_warp, per_warp));
            // A list of `blocks` blocks holds at most min(fill, blocks) keys.
            ASSERT_LE(std::min(fill, blocks), len) << "n " << n << " splits " << splits << " fill "
                                                   << fill << " range " << y << " warp " << w;
          }
        }
      }
}

TEST(DecodeRanges, ShortContextsGiveEveryWarpABlock) {
  // Batch 1 at S = 8K on 132 SMs: 16 ranges of 4 blocks, not 64 of one (bench/NOTES.md s16 r2).
  EXPECT_EQ(blocks_per_split(64, 132, kWarpLists), 4);
  EXPECT_EQ(splits_with_blocks(64, 4), 16);
  // Long contexts split evenly as before.
  EXPECT_EQ(blocks_per_split(1024, 132, kWarpLists), 8);
  EXPECT_EQ(blocks_per_split(8192, 132, kWarpLists), 63);
  EXPECT_EQ(blocks_per_split(0, 132, kWarpLists), 0);
}

} // namespace
} // namespace m3sa::testing
