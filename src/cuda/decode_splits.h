#pragma once
// How the decode rows of sparse_attention split their selections over CTAs (plain host code, no
// CUDA headers, so that the CPU tests check the rule: tests/unit/decode_splits_test.cpp).
//
// Selection ranges per (decode token, KV head) pair, and how they merge: enough CTAs for every
// resident slot when the decode rows are few, one range when they fill the GPU alone.
// In clusters: the largest power of two up to top_k whose clusters, one per pair, the device
// holds at once (batch 1: one selected block per CTA, so that every K/V byte is requested at once;
// a second wave of clusters measured slower than the workspace merge, bench/NOTES.md). Clusters
// of `min_cluster` CTAs or more only: an sm90 plan leaves splits of 2 and 4 to the TMA kernel
// (with clusters of 2 the TMA kernel measured 4-5 us slower than its workspace merge at 128 pairs,
// s9 r3; a cluster launch of it drew synccheck reports, s9 r5).
// The TMA kernel (`otherwise` kMergeByNextKernel): pairs that alone fill 90 % of the SMs take one
// range each, one CTA an SM streaming a whole pair (128 pairs: 44.5 -> 40.8 us against 2 ranges,
// s11 r5); fewer pairs split up to one selected block a range, merged by the next kernel from
// kMinSplitsMergedByKernel ranges and by the last CTA to arrive below that: the merge kernel
// starts only when the grid's last CTA ends, while arrivals merge each pair as soon as its own
// ranges are done (s11 r1: B=32 16/1, 8 ranges, 21.2 -> 17.8 us with the merge kernel; 128 pairs
// of 2 ranges 44.1 -> 45.0-45.5).
// The cp.async kernel without clusters (`otherwise` kMergeByLastArrival): at least two selected
// blocks a range, since the last CTA's merge reads every range's 8 KB partial, and at batch 1 one
// block per range (16 ranges) measured 14.8 us against 13.3 us with two.
#include <algorithm>
#include <cstdint>

#include "common/host_device.h"
#include "cuda/attention_params.h"
#include "cuda/prepared_divisor.h"

namespace m3sa::cuda {

// The cluster merge (kMergeInCluster, sparse_attention_decode.cuh): the splits of a pair are the
// CTAs of one cluster (split == rank). Row `row` of the GQA group is merged by the CTA of rank
// row % splits, which receives split s's partial of that row in its slot (row / splits) * splits +
// s, and waits for exactly cluster_rows_owned(...) * splits slots: a count that differs from the
// slots pushed to it never completes its barrier, so the CPU tests check that the two agree and
// that the slots are distinct and fit, for every group and cluster size.
M3SA_HOST_DEVICE constexpr int cluster_merge_owner(int row, int splits) { return row % splits; }
M3SA_HOST_DEVICE constexpr int cluster_merge_slot(int row, int split, int splits) {
  return row / splits * splits + split;
}
// Rows of a group of `group` that the CTA of rank `split` of `splits` merges: split, split +
// splits, ...
M3SA_HOST_DEVICE constexpr int cluster_rows_owned(int group, int splits, int split) {
  return split < group ? (group - split + splits - 1) / splits : 0;
}
// A CTA's receiving slots: with a power-of-two cluster of at most 16 CTAs (the rule below), a
// CTA's rows times the splits, ceil(group / splits) * splits, never exceed the group's 16 rows.
inline constexpr int kClusterMergeSlots = kAttentionRows;
inline constexpr int kMaxClusterSplits = 16; // the largest (non-portable) cluster on SM90

inline constexpr int kMinSplitsMergedByKernel = 4;

// The selected blocks [begin, end) that range `split` of `splits` attends, of a pair's `count`
// valid ones: count * split / splits onwards, so that the ranges tile [0, count) in order and
// differ by at most one block (a range is empty where count < splits). Both decode kernels take
// the divisor prepared before their PDL wait (PreparedDivisor: a multiply-high after the
// selection instead of a reciprocal sequence, s42 r3).
struct SelectionRange {
  int begin, end;
};
M3SA_HOST_DEVICE SelectionRange split_selection_range(int count, int split,
                                                      const PreparedDivisor& splits) {
  return {splits.quotient(count * split), splits.quotient(count * (split + 1))};
}

struct DecodeSplits {
  int splits;
  SplitMerge merge;
};

// `active_clusters[i]`: clusters of 2^(i+1) CTAs the device holds at once (0: none);
// `resident`: decode CTAs the device holds at once (kAttentionCtasPerSm x SMs).
inline DecodeSplits choose_decode_splits(int64_t decode_pairs, int sm_count, int top_k,
                                         const int32_t (&active_clusters)[4], int min_cluster,
                                         SplitMerge otherwise) {
  const int64_t resident = int64_t{kAttentionCtasPerSm} * sm_count;
  if (decode_pairs <= 0 || decode_pairs * 2 > resident) return {1, otherwise};
  if (otherwise == kMergeByNextKernel && decode_pairs * 10 >= int64_t{sm_count} * 9)
    return {1, otherwise};
  for (int i = 3; i >= 0 && (2 << i) >= min_cluster; --i)
    if ((2 << i) <= top_k && decode_pairs <= active_clusters[i]) return {2 << i, kMergeInCluster};
  const int most = otherwise == kMergeByNextKernel ? top_k : std::max(1, top_k / 2);
  const int splits = static_cast<int>(std::min<int64_t>(most, resident / decode_pairs));
  return {splits, otherwise == kMergeByNextKernel && splits < kMinSplitsMergedByKernel
                      ? kMergeByLastArrival
                      : otherwise};
}

} // namespace m3sa::cuda
