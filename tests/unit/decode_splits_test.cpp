// The decode attention's split rule (choose_decode_splits, cuda/decode_splits.h), checked on the
// host: which pairs split, into how many ranges, merged how. The kernels behind each choice are
// checked on the GPU (CudaAttention cases of 1, 4, 12, 20 and 40 requests).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/decode_splits.h"

namespace m3sa::testing {
namespace {

using cuda::choose_decode_splits;
using cuda::kMergeByLastArrival;
using cuda::kMergeByNextKernel;
using cuda::kMergeInCluster;
using cuda::SplitMerge;

constexpr int kH200Sms = 132;
// Clusters of 2, 4, 8 and 16 CTAs an H200 holds at once (the cp.async kernel, two CTAs an SM;
// CudaAttentionSmall.DecodeClustersFitOnHopper prints them).
constexpr int32_t kH200Clusters[4] = {132, 62, 30, 14};
constexpr int32_t kNoClusters[4] = {0, 0, 0, 0};

// An sm90 plan: clusters of 8 or more, the TMA kernel otherwise.
cuda::DecodeSplits sm90(int64_t pairs, int top_k = 16,
                        const int32_t (&clusters)[4] = kH200Clusters) {
  return choose_decode_splits(pairs, kH200Sms, top_k, clusters, 8, kMergeByNextKernel);
}
// An sm80 plan (or views TMA cannot address): any cluster, the cp.async kernel otherwise.
cuda::DecodeSplits sm80(int64_t pairs, int top_k = 16,
                        const int32_t (&clusters)[4] = kH200Clusters) {
  return choose_decode_splits(pairs, kH200Sms, top_k, clusters, 2, kMergeByLastArrival);
}

void expect_splits(cuda::DecodeSplits got, int splits, SplitMerge merge, const char* what) {
  EXPECT_EQ(got.splits, splits) << what;
  EXPECT_EQ(got.merge, merge) << what;
}

TEST(DecodeSplits, BatchOneTakesTheLargestClusterThatFits) {
  expect_splits(sm90(1), 16, kMergeInCluster, "16/1, one pair: clusters of 16");
  expect_splits(sm90(4), 16, kMergeInCluster, "64/4, four pairs");
  expect_splits(sm90(14), 16, kMergeInCluster, "14 pairs: as many 16-clusters as fit");
  expect_splits(sm90(15), 8, kMergeInCluster, "15 pairs: clusters of 8");
  expect_splits(sm90(30), 8, kMergeInCluster, "30 pairs");
  expect_splits(sm90(1, 8), 8, kMergeInCluster, "top_k 8 caps the cluster");
  // top_k 4: an sm90 plan takes no cluster below 8 CTAs, so the TMA kernel with 4 ranges.
  expect_splits(sm90(1, 4), 4, kMergeByNextKernel, "top_k 4");
  expect_splits(sm80(1, 4), 4, kMergeInCluster, "sm80 plan: clusters of 4");
  expect_splits(sm80(40), 4, kMergeInCluster, "sm80 plan: 40 pairs in clusters of 4");
}

TEST(DecodeSplits, TheTmaKernelMergesManyRangesByKernelAndFewByArrival) {
  expect_splits(sm90(32), 8, kMergeByNextKernel, "B=32 16/1");
  expect_splits(sm90(48), 5, kMergeByNextKernel, "12 requests x 4 KV heads");
  expect_splits(sm90(66), 4, kMergeByNextKernel, "66 pairs");
  expect_splits(sm90(67), 3, kMergeByLastArrival, "67 pairs");
  expect_splits(sm90(80), 3, kMergeByLastArrival, "20 requests x 4 KV heads");
  expect_splits(sm90(118), 2, kMergeByLastArrival, "below 90 % of the SMs");
  expect_splits(sm90(1, 16, kNoClusters), 16, kMergeByNextKernel,
                "no cluster fits: one selected block a range");
}

TEST(DecodeSplits, PairsThatFillTheGpuTakeOneRange) {
  expect_splits(sm90(119), 1, kMergeByNextKernel, "90 % of the SMs");
  expect_splits(sm90(128), 1, kMergeByNextKernel, "B=32 64/4 and B=128 16/1");
  expect_splits(sm90(512), 1, kMergeByNextKernel, "B=128 64/4");
  expect_splits(sm80(128), 2, kMergeInCluster, "an sm80 plan still splits, in clusters of 2");
  expect_splits(sm80(128, 16, kNoClusters), 2, kMergeByLastArrival, "or merged by arrivals");
  expect_splits(sm80(133), 1, kMergeByLastArrival, "more pairs than half the resident CTAs");
  expect_splits(sm90(0), 1, kMergeByNextKernel, "no decode rows");
}

TEST(DecodeSplits, TheCpAsyncKernelKeepsTwoBlocksARange) {
  expect_splits(sm80(32, 16, kNoClusters), 8, kMergeByLastArrival, "B=32 16/1 without clusters");
  expect_splits(sm80(1, 16, kNoClusters), 8, kMergeByLastArrival, "batch 1 without clusters");
  expect_splits(sm80(1, 1, kNoClusters), 1, kMergeByLastArrival, "top_k 1");
}

// Whatever the pairs and top_k: at least one range and at most top_k, never more CTAs than the
// resident ones (the workspace holds that many partials), and a cluster only of a size that fits.
TEST(DecodeSplits, EveryChoiceFitsTheWorkspaceAndTheSelection) {
  for (const bool tma : {true, false})
    for (int top_k = 1; top_k <= 32; ++top_k)
      for (int64_t pairs = 1; pairs <= 600; ++pairs) {
        const cuda::DecodeSplits s = tma ? sm90(pairs, top_k) : sm80(pairs, top_k);
        ASSERT_GE(s.splits, 1) << pairs << " " << top_k;
        ASSERT_LE(s.splits, top_k) << pairs << " " << top_k;
        if (s.splits > 1) {
          ASSERT_LE(pairs * s.splits, int64_t{cuda::kAttentionCtasPerSm} * kH200Sms)
              << pairs << " " << top_k;
        }
        if (s.merge == kMergeInCluster) {
          const int i = __builtin_ctz(static_cast<unsigned>(s.splits)) - 1;
          ASSERT_EQ(s.splits & (s.splits - 1), 0) << pairs << " " << top_k;
          ASSERT_LE(pairs, kH200Clusters[i]) << pairs << " " << top_k;
          ASSERT_GE(s.splits, tma ? 8 : 2) << pairs << " " << top_k;
        }
        if (s.merge == kMergeByNextKernel && s.splits > 1) {
          ASSERT_GE(s.splits, cuda::kMinSplitsMergedByKernel) << pairs << " " << top_k;
        }
      }
}

// The cluster merge's bookkeeping (decode_splits.h), for every group and every cluster size the
// rule can pick: each row goes to exactly one CTA and one slot, the slots of a CTA are distinct
// and fit its receiving area, and the slots a CTA waits for are exactly those pushed to it (one
// from each split for each of its rows) - a count that differs would leave its barrier waiting.
TEST(DecodeSplits, ClusterMergeSlotsAreDistinctFitAndMatchTheWait) {
  using cuda::cluster_merge_owner;
  using cuda::cluster_merge_slot;
  using cuda::cluster_rows_owned;
  for (int splits = 2; splits <= cuda::kMaxClusterSplits; splits *= 2)
    for (int group = 1; group <= cuda::kAttentionRows; ++group) {
      std::vector<std::vector<int>> pushed(splits); // slots pushed into each CTA
      for (int split = 0; split < splits; ++split)
        for (int row = 0; row < group; ++row) {
          const int owner = cluster_merge_owner(row, splits);
          ASSERT_GE(owner, 0);
          ASSERT_LT(owner, splits);
          pushed[owner].push_back(cluster_merge_slot(row, split, splits));
        }
      int rows = 0;
      for (int cta = 0; cta < splits; ++cta) {
        std::vector<int>& slots = pushed[cta];
        std::sort(slots.begin(), slots.end());
        EXPECT_EQ(std::adjacent_find(slots.begin(), slots.end()), slots.end())
            << "a slot pushed twice: group " << group << " splits " << splits << " CTA " << cta;
        if (!slots.empty()) {
          EXPECT_GE(slots.front(), 0);
          EXPECT_LT(slots.back(), cuda::kClusterMergeSlots)
              << "group " << group << " splits " << splits << " CTA " << cta;
        }
        const int owned = cluster_rows_owned(group, splits, cta);
        EXPECT_EQ(static_cast<int>(slots.size()), owned * splits)
            << "group " << group << " splits " << splits << " CTA " << cta;
        // The receiver reads row split + i * splits from slots cluster_merge_slot(row,
        // 0..splits-1).
        for (int row = cta; row < group; row += splits)
          for (int split = 0; split < splits; ++split)
            EXPECT_TRUE(std::binary_search(slots.begin(), slots.end(),
                                           cluster_merge_slot(row, split, splits)));
        rows += owned;
      }
      EXPECT_EQ(rows, group) << "every row merged once: splits " << splits;
    }
}

// Every split count a plan makes (1 .. top_k, top_k up to kMaxSelection = 32 and beyond) and
// every selection length a pair can have (0 .. top_k): the ranges tile [0, count) in order, differ
// by at most one block, and are the plain divisions' (the kernels' prepared divisor is exact).
TEST(DecodeSplits, SelectionRangesTileTheSelectionEvenly) {
  for (int splits = 1; splits <= 64; ++splits) {
    const cuda::PreparedDivisor divisor(splits);
    for (int count = 0; count <= 64; ++count) {
      int next = 0, smallest = count, largest = 0;
      for (int split = 0; split < splits; ++split) {
        const cuda::SelectionRange r = cuda::split_selection_range(count, split, divisor);
        ASSERT_EQ(r.begin, count * split / splits) << "count " << count << " splits " << splits;
        ASSERT_EQ(r.end, count * (split + 1) / splits) << "count " << count << " splits " << splits;
        ASSERT_EQ(r.begin, next) << "count " << count << " splits " << splits << " split " << split;
        ASSERT_LE(r.begin, r.end);
        smallest = std::min(smallest, r.end - r.begin);
        largest = std::max(largest, r.end - r.begin);
        next = r.end;
      }
      EXPECT_EQ(next, count) << "splits " << splits;
      EXPECT_LE(largest - smallest, 1) << "count " << count << " splits " << splits;
    }
  }
}

} // namespace
} // namespace m3sa::testing
