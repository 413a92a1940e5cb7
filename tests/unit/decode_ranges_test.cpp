// How a decode tile's blocks split over its CTAs and warps and what the publish packs from that
// (blocks_per_split, splits_with_blocks, blocks_per_list and lists_with_blocks,
// cuda/kernels/indexer_traits.h): the kernels take range y = [y * per_split, min(n, (y + 1) *
// per_split)) and give warp w of the Hopper kernel blocks_per_list(per_split, warps) blocks from
// the range's start; the last CTA reads the lists of splits_with_blocks(n, per_split) ranges,
// lists_with_blocks(per_split, warps) lists each, min(fill, blocks_per_list(...)) keys long
// (publish_and_merge, cuda/kernels/decode_topk.cuh). A range or a list the publish does not
// count, or a warp with more candidates than the packed length, would drop keys without a trace,
// so all three are checked for the tile sizes the decode grids meet.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/kernels/indexer_traits.h"

namespace m3sa::testing {
namespace {

using cuda::blocks_per_list;
using cuda::blocks_per_split;
using cuda::lists_with_blocks;
using cuda::splits_with_blocks;

constexpr int kMinPerRange = cuda::kDecodeSm90MinBlocksPerRange;

struct Range {
  int begin, end;
};
Range range_of(int y, int n, int per_split) {
  const int begin = y * per_split;
  return {begin, std::min(n, begin + per_split)};
}

TEST(DecodeRanges, EveryBlockInExactlyOneRangeAndTheCountedRangesHoldThemAll) {
  for (int min_per_split : {1, kMinPerRange})
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

TEST(DecodeRanges, EveryBlockOfARangeIsInOnePublishedListThatHoldsItsCandidates) {
  // Both shapes of the kernel's CTA (decode_sm90_warps).
  for (int warps : {cuda::kDecodeSm90NarrowWarps, cuda::kDecodeSm90WideWarps})
    for (int fill : {1, 8, 13, 16, 31, 32})
      for (int splits : {1, 4, 33, 132})
        for (int n = 1; n <= 2100; n += (n < 300 ? 1 : 41)) {
          const int per_split = blocks_per_split(n, splits, kMinPerRange);
          const int per_warp = blocks_per_list(per_split, warps);
          const int lists = lists_with_blocks(per_split, warps);
          const int len = std::min(fill, per_warp);
          ASSERT_LE(lists, warps);
          for (int y = 0; y < splits; ++y) {
            const Range r = range_of(y, n, per_split);
            const int count = std::max(0, r.end - r.begin);
            int covered = 0;
            for (int w = 0; w < warps; ++w) {
              const int blocks = std::max(0, std::min(count - w * per_warp, per_warp));
              covered += blocks;
              if (w >= lists) {
                ASSERT_EQ(blocks, 0)
                    << "a warp past the published lists: warps " << warps << " n " << n
                    << " splits " << splits << " range " << y << " warp " << w;
              }
              // A list of `blocks` blocks holds at most min(fill, blocks) keys.
              ASSERT_LE(std::min(fill, blocks), len)
                  << "warps " << warps << " n " << n << " splits " << splits << " fill " << fill
                  << " range " << y << " warp " << w;
            }
            ASSERT_EQ(covered, count) << "warps " << warps << " n " << n << " range " << y;
          }
        }
}

TEST(DecodeRanges, ShortContextsKeepRangesOfTwoBlocks) {
  // Batch 1 at S = 8K on 132 SMs: 32 ranges of 2 blocks (bench/NOTES.md s31 r5), each range's
  // two lists of one block published (64 lists to merge, as 16 ranges of 4 gave), not 8 of 8
  // (s28 r1); S = 32K: 128 ranges of 2.
  EXPECT_EQ(blocks_per_split(64, 132, kMinPerRange), 2);
  EXPECT_EQ(splits_with_blocks(64, 2), 32);
  EXPECT_EQ(lists_with_blocks(2, 8), 2);
  EXPECT_EQ(lists_with_blocks(2, 4), 2);
  EXPECT_EQ(splits_with_blocks(64, 2) * lists_with_blocks(2, 4),
            splits_with_blocks(64, 4) * lists_with_blocks(4, 4));
  EXPECT_EQ(blocks_per_split(256, 132, kMinPerRange), 2);
  EXPECT_EQ(splits_with_blocks(256, 2), 128);
  // Long contexts split evenly as before.
  EXPECT_EQ(blocks_per_split(1024, 132, kMinPerRange), 8);
  EXPECT_EQ(lists_with_blocks(8, 8), 8);
  EXPECT_EQ(lists_with_blocks(9, 8), 5); // 2 blocks a list
  EXPECT_EQ(blocks_per_split(8192, 132, kMinPerRange), 63);
  EXPECT_EQ(blocks_per_split(0, 132, kMinPerRange), 0);
  EXPECT_EQ(lists_with_blocks(0, 8), 0);
}

TEST(DecodeRanges, PreparedSplitDivisorGivesTheSameRanges) {
  // The Hopper decode kernel divides by its split count with a divisor prepared before its PDL
  // wait (cuda/prepared_divisor.h); the publish and the portable kernel divide plainly. Both must
  // give every tile the same per_split, or the publish would read lists the kernel never wrote.
  for (int min_per_split : {1, kMinPerRange})
    for (int splits = 1; splits <= 300; ++splits) {
      const cuda::PreparedDivisor prepared(splits);
      for (int n = 0; n <= 8200; n += (n < 600 ? 1 : 61))
        ASSERT_EQ(blocks_per_split(n, splits, min_per_split, &prepared),
                  blocks_per_split(n, splits, min_per_split))
            << "n " << n << " splits " << splits << " min " << min_per_split;
    }
}

TEST(DecodeRanges, PublishedListsFillWholeChunksWithinTheWarps) {
  // published_lists: the lists that may hold a block plus one empty list where lists x rows x len
  // is odd, never more lists than the CTA's warps (an even count), each as long as a warp's most
  // candidates.
  for (int warps : {cuda::kDecodeSm90NarrowWarps, cuda::kDecodeSm90WideWarps})
    for (int rows = 1; rows <= cuda::kDecodeSm90MaxRows; ++rows)
      for (int fill : {1, 8, 13, 15, 16, 31, 32})
        for (int per_split = 0; per_split <= 300; ++per_split) {
          const cuda::PublishedLists l = cuda::published_lists(per_split, warps, rows, fill);
          const int with_blocks = lists_with_blocks(per_split, warps);
          ASSERT_EQ(l.len, std::min(fill, blocks_per_list(per_split, warps)));
          ASSERT_TRUE(l.lists == with_blocks || l.lists == with_blocks + 1);
          ASSERT_LE(l.lists, warps);
          ASSERT_EQ(l.packed(rows) % 2, 0) << "whole 16-byte chunks";
        }
}

TEST(DecodeRanges, HopperGridKeepsTheRangesTheLongestRequestCanFill) {
  // decode_sm90_splits: one CTA an SM's worth of ranges, at most the ranges of two blocks the
  // plan's longest request fills (132 SMs).
  EXPECT_EQ(cuda::decode_sm90_splits(132, 64), 32);    // batch 1, S=8K
  EXPECT_EQ(cuda::decode_sm90_splits(132, 256), 128);  // S=32K
  EXPECT_EQ(cuda::decode_sm90_splits(132, 1024), 132); // S=128K
  EXPECT_EQ(cuda::decode_sm90_splits(4, 1024), 4);     // batch 32
  EXPECT_EQ(cuda::decode_sm90_splits(132, 3), 2);
  EXPECT_EQ(cuda::decode_sm90_splits(132, 1), 1);
  EXPECT_EQ(cuda::decode_sm90_splits(132, 0), 1);
  EXPECT_EQ(cuda::decode_sm90_splits(0, 1024), 1);
  for (int64_t sm_splits : {1, 2, 4, 33, 132, 264})
    for (int64_t max_blocks = 0; max_blocks <= 2100; ++max_blocks) {
      const int splits = cuda::decode_sm90_splits(sm_splits, max_blocks);
      ASSERT_GE(splits, 1);
      ASSERT_LE(splits, std::max<int64_t>(sm_splits, 1));
      // The ranges past the grid would have held no block: the same ranges hold blocks.
      const int n = static_cast<int>(max_blocks);
      ASSERT_EQ(
          splits_with_blocks(n, blocks_per_split(n, splits, kMinPerRange)),
          splits_with_blocks(n, blocks_per_split(n, static_cast<int>(sm_splits > 0 ? sm_splits : 1),
                                                 kMinPerRange)))
          << "sm_splits " << sm_splits << " max_blocks " << max_blocks;
    }
}

// decode_sm90_warps: 8 warps of half-page boxes where a request has few ranges (its plan's SMs /
// max_requests: batches 32 and 128 on 132 SMs, where they gained), 4 of whole-page boxes from one
// range past kDecodeSm90WideMaxSplits on (batch 1, where 8 lost; bench/NOTES.md s28 r3).
TEST(DecodeRanges, EightWarpsUpToTheWideSplitLimitFourPastIt) {
  constexpr int kWide = cuda::kDecodeSm90WideMaxSplits;
  if (kWide == 0) GTEST_SKIP() << "a build without the 8-warp shape";
  EXPECT_EQ(cuda::decode_sm90_warps(1), cuda::kDecodeSm90WideWarps);        // batch 128
  EXPECT_EQ(cuda::decode_sm90_warps(132 / 32), cuda::kDecodeSm90WideWarps); // batch 32
  EXPECT_EQ(cuda::decode_sm90_warps(kWide), cuda::kDecodeSm90WideWarps);
  EXPECT_EQ(cuda::decode_sm90_warps(kWide + 1), cuda::kDecodeSm90NarrowWarps);
  EXPECT_EQ(cuda::decode_sm90_warps(132), cuda::kDecodeSm90NarrowWarps); // batch 1
  for (int splits = 1; splits <= 264; ++splits)
    ASSERT_EQ(cuda::decode_sm90_warps(splits),
              splits <= kWide ? cuda::kDecodeSm90WideWarps : cuda::kDecodeSm90NarrowWarps)
        << "splits " << splits;
}

TEST(DecodeRanges, ClusterFinishWhereTheRangesFitOneClusterAndRankZeroReceivesThem) {
  constexpr int kMost = cuda::kDecodeSm90MaxCluster;
  if (kMost < 2) GTEST_SKIP() << "a build without the cluster finish";
  // Batch 1 at S=8K: 32 ranges of 2 become one cluster of 16 ranges of 4; S=4K: 16 of 2.
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(32, 64, 1, 15), 16);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(16, 32, 4, 15), 16);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(10, 20, 2, 15), 10);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(2, 3, 1, 15), 2);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(1, 1, 1, 15), 0); // one range: no merge at all
  // Longer contexts keep every SM's range: S=32K and 128K at batch 1, 26 ranges of batch 5.
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(128, 256, 1, 15), 0);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(132, 1024, 1, 15), 0);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(26, 1024, 1, 15), 0);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(26, 64, 1, 15), 16);
  // Batch 32 (4 ranges of 8-warp CTAs) at S=128K: 4 x 8 lists x 4 rows x 15 keys fit rank 0's
  // 2048; 8 rows a request (MTP) do not.
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(4, 1024, 4, 15), 4);
  EXPECT_EQ(cuda::decode_sm90_cluster_splits(4, 1024, 8, 15), 0);
  for (int splits = 1; splits <= 264; ++splits)
    for (int rows : {1, 2, 4, 8})
      for (int fill : {1, 8, 15, 16, 31, 32})
        for (int max_blocks = 0; max_blocks <= 2100; max_blocks += (max_blocks < 300 ? 1 : 37)) {
          const int c = cuda::decode_sm90_cluster_splits(splits, max_blocks, rows, fill);
          if (c == 0) continue;
          SCOPED_TRACE(::testing::Message() << "splits " << splits << " rows " << rows << " fill "
                                            << fill << " max_blocks " << max_blocks);
          ASSERT_GE(c, 2);
          ASSERT_LE(c, kMost);
          ASSERT_LE(c, splits);
          // Every shorter request of the plan publishes into rank 0's receiving area too (the
          // kernel checks it and takes the workspace otherwise, at no cost but the cluster's).
          const int warps = cuda::decode_sm90_warps(c);
          for (int n = 0; n <= max_blocks; ++n) {
            const int per_split = blocks_per_split(n, c, kMinPerRange);
            ASSERT_LE(int64_t{splits_with_blocks(n, per_split)} *
                          cuda::published_lists(per_split, warps, rows, fill).packed(rows),
                      cuda::kDecodeSm90ReceiveKeys)
                << "n " << n;
          }
        }
}

// A decode call's grid (launch_decode_topk): its ranges a tile come from its own decode requests -
// one CTA an SM's worth of ranges over them, for the Hopper kernel (kDecodeSm90CtasPerSm an SM) and
// the portable one (kScoringCtasPerSm) - never from the plan's capacity, and the workspace's list
// slots (sized at plan time for max_requests) hold them for every call the plan accepts: no call
// is clamped below an SM's worth, and none writes past the slots. Before, a plan for 256 requests
// ran batch 1 as one CTA a request (bench/NOTES.md s59 r6: 13x slower at S=128K).
TEST(DecodeRanges, CallGridFollowsItsDecodeRequestsWithinThePlansWorkspace) {
  for (int sm : {1, 16, 78, 114, 132, 144})
    for (int64_t capacity : {1, 2, 3, 7, 8, 31, 32, 100, 131, 132, 133, 256, 1000})
      for (int64_t plan_tiles_a_request : {1, 2, 4, 16}) {
        // The plan's ranges a tile (plan_scoring's block_splits) and its list slots.
        const int64_t portable_one = int64_t{cuda::kScoringCtasPerSm} * sm;
        const int64_t hopper_one = int64_t{cuda::kDecodeSm90CtasPerSm} * sm;
        const int64_t block_splits =
            std::max<int64_t>({1, portable_one / capacity, hopper_one / capacity});
        const int64_t slots =
            cuda::decode_list_slots(capacity * plan_tiles_a_request, block_splits,
                                    plan_tiles_a_request, std::max(portable_one, hopper_one));
        for (int64_t requests = 1; requests <= capacity; requests += requests < 40 ? 1 : 37)
          for (int64_t tiles_a_request = 1; tiles_a_request <= plan_tiles_a_request;
               tiles_a_request *= 2) {
            const int64_t tiles = requests * tiles_a_request;
            for (int64_t one : {portable_one, hopper_one}) {
              const int splits = cuda::decode_call_splits(one / requests, tiles, slots);
              ASSERT_EQ(splits, std::max<int64_t>(1, one / requests))
                  << "sm " << sm << " capacity " << capacity << " requests " << requests;
              ASSERT_LE(tiles * splits, slots)
                  << "sm " << sm << " capacity " << capacity << " requests " << requests;
            }
          }
      }
  // Batch 1 on a plan for 256 requests (132 SMs): 132 Hopper ranges, as a plan for 1 request.
  const int64_t slots = cuda::decode_list_slots(256, 1, 1, 3 * 132);
  EXPECT_EQ(cuda::decode_call_splits(132 / 1, 1, slots), 132);
  EXPECT_EQ(cuda::decode_call_splits(132 / 256, 256, slots), 1);
  // A call beyond what the slots hold is clamped, never past them.
  EXPECT_EQ(cuda::decode_call_splits(1000, 2, 100), 50);
  EXPECT_EQ(cuda::decode_call_splits(0, 0, 0), 1);
}

} // namespace
} // namespace m3sa::testing
