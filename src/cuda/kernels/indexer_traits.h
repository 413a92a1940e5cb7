#pragma once
// Constants the indexer kernels (score_blocks.cuh, decode_topk.cuh) and their host launchers
// (cuda/indexer.cu) must agree on. Plain C++: included by .cu and .cpp alike.
#include <algorithm>

#include "common/host_device.h"
#include "cuda/prepared_divisor.h"

namespace m3sa::cuda {

// Query rows (tokens x index heads of one request) one scoring CTA holds: 64 / H tokens a tile.
inline constexpr int kTileRows = 64;
inline constexpr int kScoreThreads = 128;
// Scoring and decode CTAs resident per SM, the basis of the plan's block splits: 3 x SMs /
// max_requests ranges per row tile fill the GPU in one wave. Residency needs <= 168 registers per
// thread (65536 / (3 x 128), today 144..166 on sm_90a) and 3 x kScoreSmemBytes of shared memory
// (static_assert in score_blocks.cuh). Not enforced with __launch_bounds__(kScoreThreads, 3): that
// changes the register allocation of three of the six kernels (fp8 scoring 144 -> 150, decode
// bf16 166 -> 168, decode fp8 k16 160 -> 158, ptxas -v), i.e. codegen; check `-Xptxas -v` after a
// kernel edit instead.
inline constexpr int kScoringCtasPerSm = 3;

inline int tile_tokens(int heads) { return std::max(1, kTileRows / heads); }

// The Hopper decode kernel (decode_topk_sm90.cuh): requests of at most this many rows (q_len x H:
// one n8 MMA tile), one CTA per SM (its ring takes most of the shared memory).
inline constexpr int kDecodeSm90MaxRows = 8;
// Diagnostic builds only: 2 = two CTAs an SM, each with half the ring (its boxes half as long), so
// that with more ranges than CTA slots (M3SA_DECODE_SM90_SPLIT_MULTIPLIER, indexer.cu) an SM's
// other CTA streams while one restarts - the hardware's hand-out of ranges to the SMs that finish
// first, without s27 r3's idle restarts. Two 8-warp CTAs do not fit an SM: build it with
// M3SA_DECODE_SM90_WIDE_MAX_SPLITS=0.
#ifndef M3SA_DECODE_SM90_CTAS_PER_SM
#define M3SA_DECODE_SM90_CTAS_PER_SM 1
#endif
inline constexpr int kDecodeSm90CtasPerSm = M3SA_DECODE_SM90_CTAS_PER_SM;
// Boxes in flight or being read, a CTA (192 KB an SM).
inline constexpr int kDecodeSm90RingBytes = 192 * 1024 / kDecodeSm90CtasPerSm;
// Two shapes of its CTA, 3 boxes a warp either way: 4 warps streaming whole-page boxes (128
// tokens x 128 B) or 8 warps streaming half-page boxes (64 tokens). With 8, each scheduler holds
// two warps, so one warp's maxima, list insertions and ldmatrix / MMA issue hide behind the
// other's: e4m3 B=32 S=32K 44.9 -> 41.9 us, B=128 S=8K 42.0 -> 40.1, bf16 B=32 S=32K 72.3 ->
// 70.7 (bench/NOTES.md s28 r3). At batch 1 it lost (bf16 S=8K 7.9 -> 8.4 us, e4m3 7.3 -> 7.7:
// a bf16 page is four half boxes there, one more than a warp's ring, and half the warps of a
// 4-block range idle), so the plan takes 8 warps only for batches of few splits a request.
inline constexpr int kDecodeSm90NarrowWarps = 4;
inline constexpr int kDecodeSm90WideWarps = 8;
inline constexpr int kDecodeSm90BoxesPerWarp = 3;
// The boxes of every warp fill the ring: 128 tokens (4 warps) or 64 (8 warps) at one CTA an SM.
constexpr int decode_sm90_box_tokens(int warps) {
  return kDecodeSm90RingBytes / (warps * kDecodeSm90BoxesPerWarp * 128);
}
#ifndef M3SA_DECODE_SM90_WIDE_MAX_SPLITS // diagnostic builds only: 0 = never 8 warps
#define M3SA_DECODE_SM90_WIDE_MAX_SPLITS 8
#endif
inline constexpr int kDecodeSm90WideMaxSplits = M3SA_DECODE_SM90_WIDE_MAX_SPLITS;
static_assert(kDecodeSm90CtasPerSm == 1 || kDecodeSm90WideMaxSplits == 0,
              "two 8-warp CTAs do not fit an SM's shared memory");
// The warps of a launch with `splits` ranges a request (its plan's SMs / max_requests): 8 from
// 17 requests on 132 SMs (measured at 32 and 128; batch 1 keeps 4).
inline int decode_sm90_warps(int splits) {
  return splits <= kDecodeSm90WideMaxSplits ? kDecodeSm90WideWarps : kDecodeSm90NarrowWarps;
}
// Its ranges hold at least this many blocks, so that a short context is not spread over more
// lists than blocks. Since the publish packs only the warp lists that may hold a block, 2 gives
// the last CTA as many lists to merge as 4 did, from twice the SMs: batch 1 bf16 S=32K 11.1 ->
// 10.4 us, S=8K 7.78 -> 7.6, e4m3 level (s31 r5; per SM, a bf16 stream is bound near 60 GB/s,
// s24 r3). Fewer SMs lose (8 ranges of 8 at S=8K: 9.1 us against 7.9 with 16 of 4, s28 r1). With
// more warps than blocks, the last warps of a range hold none.
inline constexpr int kDecodeSm90MinBlocksPerRange = 2;

// A tile's `n` causal blocks over its `splits` CTAs (blockIdx.y): ranges of this many consecutive
// blocks, at least `min_per_split` (the Hopper decode kernel: kDecodeSm90MinBlocksPerRange), so the
// last ranges may hold none; 0 when there is no block. The kernels' split_block_range and the
// publish's list packing (publish_and_merge) both derive from it; the CPU tests check that they
// agree (tests/unit/decode_ranges_test.cpp). `prepared`: `splits` as a PreparedDivisor (a
// multiply-high in place of the division, for a kernel that prepared it before its PDL wait), or
// null.
M3SA_HOST_DEVICE int blocks_per_split(int n, int splits, int min_per_split,
                                      const PreparedDivisor* prepared = nullptr) {
  const int even = prepared ? prepared->quotient(n + splits - 1) : (n + splits - 1) / splits;
  return n <= 0 ? 0 : even > min_per_split ? even : min_per_split;
}
// The ranges of blocks_per_split(n, ...) = per_split blocks that hold at least one block.
M3SA_HOST_DEVICE int splits_with_blocks(int n, int per_split) {
  return per_split == 0 ? 0 : (n + per_split - 1) / per_split;
}
// A range's `lists` warps (the Hopper decode kernel) take this many consecutive blocks each, from
// the range's start (one count for every range, so that a shorter last range leaves its last
// warps without blocks rather than more warps with fewer).
M3SA_HOST_DEVICE int blocks_per_list(int per_split, int lists) {
  return (per_split + lists - 1) / lists;
}
// The warp lists of a range that may hold a block: the publish packs only these, so that warps
// left without blocks (ranges shorter than the warps) cost the last CTA's merge nothing.
M3SA_HOST_DEVICE int lists_with_blocks(int per_split, int lists) {
  return splits_with_blocks(per_split, blocks_per_list(per_split, lists));
}

// The warp lists a range of the Hopper decode kernel publishes, and their length: the lists that
// may hold a block (lists_with_blocks), each as long as its most candidates, plus one empty list
// where lists x rows x len is odd, so that a range's packed keys fill whole 16-byte chunks.
struct PublishedLists {
  int lists, len;
  M3SA_HOST_DEVICE int packed(int rows) const { return lists * rows * len; }
};
M3SA_HOST_DEVICE PublishedLists published_lists(int per_split, int warps, int rows, int fill) {
  PublishedLists out{lists_with_blocks(per_split, warps), fill < blocks_per_list(per_split, warps)
                                                              ? fill
                                                              : blocks_per_list(per_split, warps)};
  out.lists += out.lists * rows * out.len % 2;
  return out;
}

// The Hopper decode kernel's finish in a thread-block cluster: where a tile's ranges are the CTAs
// of one cluster (grid y, rank = range), each pushes its packed lists into the shared memory of
// rank 0 (st.async, counted down one mbarrier), which merges them - no publish to the workspace,
// no arrival atomic and no staging back from L2, the three round trips of the workspace finish
// (publish + arrival ~2.2K cycles, staging ~1.1K at batch 1: bench/NOTES.md s16 r1, s38).
// Clusters of up to this many CTAs (16: the non-portable SM90 limit; diagnostic builds: 0 = never).
#ifndef M3SA_DECODE_SM90_MAX_CLUSTER
#define M3SA_DECODE_SM90_MAX_CLUSTER 16
#endif
inline constexpr int kDecodeSm90MaxCluster =
    kDecodeSm90CtasPerSm == 1 ? M3SA_DECODE_SM90_MAX_CLUSTER : 0;
// Rank 0's receiving area, in keys: 16 KB beside the ring (whose lists and merge scratch it would
// otherwise be, but the peers push while rank 0 may still stream). A tile whose ranges publish more
// keys than this finishes through the workspace, cluster or not.
inline constexpr int kDecodeSm90ReceiveKeys = kDecodeSm90MaxCluster > 0 ? 2048 : 0;

// The decode workspace's candidate lists, in (tile, range) slots: the plan's `plan_tiles` x
// `plan_splits`, and at least one request's `request_tiles` x `one_request_ranges` (the ranges a
// call of one decode request takes), since a call sizes its grid by its own decode requests.
inline int64_t decode_list_slots(int64_t plan_tiles, int64_t plan_splits, int64_t request_tiles,
                                 int64_t one_request_ranges) {
  return std::max(plan_tiles * std::max<int64_t>(plan_splits, 1),
                  request_tiles * one_request_ranges);
}
// A decode call's ranges a tile (launch_decode_topk): `ranges`, one CTA an SM's worth over the
// call's decode requests, at least 1 and at most what `slots` list slots hold for its `tiles`.
inline int decode_call_splits(int64_t ranges, int64_t tiles, int64_t slots) {
  const int64_t most = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
  return static_cast<int>(std::clamp<int64_t>(ranges, 1, most));
}

// The Hopper decode kernel's grid along y, before clusters: one CTA an SM's worth of ranges a
// request (`sm_splits`, at most the workspace's), but no more than the ranges of
// kDecodeSm90MinBlocksPerRange blocks the plan's longest request can fill - the CTAs past those
// only add arrivals (batch 1 S=8K: 32 ranges, not 132).
inline int decode_sm90_splits(int64_t sm_splits, int64_t max_blocks) {
  const int64_t useful =
      (max_blocks + kDecodeSm90MinBlocksPerRange - 1) / kDecodeSm90MinBlocksPerRange;
  return static_cast<int>(std::clamp<int64_t>(sm_splits, 1, std::max<int64_t>(useful, 1)));
}

// The cluster a tile of `splits` ranges (decode_sm90_splits) would take, 0 for none: the ranges
// themselves where they are 2..kDecodeSm90MaxCluster; 16 where ranges of twice
// kDecodeSm90MinBlocksPerRange blocks hold the longest request in 16 (batch 1 S=8K: 16 ranges of 4
// blocks instead of 32 of 2, measured 0.18 us apart on the workspace finish, s31 r5, against the
// ~1.9 us of round trips the cluster finish removes). And only where the most keys the ranges can
// publish (`rows` a tile, `fill` ranked slots a row) fit rank 0's receiving area. The plan takes it
// where the device holds a cluster for every tile at once (cudaOccupancyMaxActiveClusters).
inline int decode_sm90_cluster_splits(int splits, int64_t max_blocks, int rows, int fill) {
  constexpr int kMost = kDecodeSm90MaxCluster;
  int cluster = 0;
  if (splits >= 2 && splits <= kMost)
    cluster = splits;
  else if (splits > kMost && kMost >= 2 &&
           (max_blocks + 2 * kDecodeSm90MinBlocksPerRange - 1) /
                   (2 * kDecodeSm90MinBlocksPerRange) <=
               kMost)
    cluster = kMost;
  if (cluster == 0 || max_blocks > int64_t{1} << 30) return 0;
  const int n = static_cast<int>(max_blocks);
  const int per_split = blocks_per_split(n, cluster, kDecodeSm90MinBlocksPerRange);
  const int64_t keys =
      int64_t{splits_with_blocks(n, per_split)} *
      published_lists(per_split, decode_sm90_warps(cluster), rows, fill).packed(rows);
  return keys <= kDecodeSm90ReceiveKeys ? cluster : 0;
}

// The SM90 scorer (score_blocks_sm90.cuh): 256 query rows a tile, 256 / H tokens.
inline constexpr int kSm90TileRows = 256;
inline int sm90_tile_tokens(int heads) { return std::max(1, kSm90TileRows / heads); }

// Bounds of the SM90 scorer's range length R (blocks a work unit): a unit stages its 256 query
// rows once, so shorter ranges re-stage too often; longer ones balance too coarsely over the
// persistent CTAs.
inline constexpr int kMinBlocksPerRange = 4;
inline constexpr int kMaxBlocksPerRange = 32;
inline constexpr int kRangeChoices = kMaxBlocksPerRange - kMinBlocksPerRange + 1;
// What staging a unit's queries costs, in page steps (a synchronous global round trip of 64 KB
// for each consumer warpgroup, about one page's MMAs).
inline constexpr int kUnitOverheadBlocks = 1;

// A tile of `blocks` causal blocks makes this many units of R blocks (its range 0 always: the
// tile's flags and the export's tail).
M3SA_HOST_DEVICE int units_of_tile(int blocks, int range) {
  const int units = (blocks + range - 1) / range;
  return units > 1 ? units : 1;
}

struct RangeChoice {
  int blocks_per_range; // R
  int ranges;           // ceil(max_blocks / R), >= 1
  int units;            // the batch's units with R
};

// The schedule kernel's R: units_for[c] units with R = kMinBlocksPerRange + c, the longest tile
// max_blocks blocks. R minimises the largest share of a CTA, ceil(units / CTAs) x (R +
// kUnitOverheadBlocks) page steps - with causal tiles a staircase in R, not a monotone function -
// among the R whose units and ranges fit the capacities; ties go to the longer R (fewer units);
// more ranges than `cheap_ranges` (the kernel's shared-memory counters) only when no R fits them.
// The capacities are sized for R = kMinBlocksPerRange, so some R always fits when the tiles'
// blocks stay within the table; otherwise the longest R, clamped to the capacities.
// What the choice minimises for choice c (R = kMinBlocksPerRange + c, units with that R): the
// cost above, then the shorter R (ties go to the longer R) in the low bits; kUnfitRangeChoice
// when its units or ranges exceed the capacities. The schedule kernel takes the minimum over a
// warp, one choice a lane; choose_blocks_per_range over a loop (the CPU tests).
inline constexpr unsigned long long kUnfitRangeChoice = ~0ull;
M3SA_HOST_DEVICE unsigned long long range_choice_key(int units, int c, int max_blocks,
                                                     int unit_capacity, int range_capacity,
                                                     int persistent_ctas, int cheap_ranges) {
  const int r = kMinBlocksPerRange + c;
  const int n_ranges = units_of_tile(max_blocks, r);
  if (units > unit_capacity || n_ranges > range_capacity) return kUnfitRangeChoice;
  const int ctas = persistent_ctas > 0 ? persistent_ctas : 1;
  // A 32-bit division: a 64-bit one is a ~100-instruction call (29 of them in a row took the
  // schedule kernel 4.5 us, s19 r5).
  const int share = (units + persistent_ctas - 1) / ctas;
  const long long cost = static_cast<long long>(share) * (r + kUnitOverheadBlocks) +
                         (n_ranges > cheap_ranges ? (1ll << 40) : 0);
  return (static_cast<unsigned long long>(cost) << 6) |
         static_cast<unsigned>(kRangeChoices - 1 - c);
}
static_assert(kRangeChoices <= 64);

// The choice whose key is smallest (`best`: the last when none fits), clamped to the capacities.
M3SA_HOST_DEVICE RangeChoice range_choice(int best, const int* units_for, int max_blocks,
                                          int unit_capacity, int range_capacity) {
  const int r = kMinBlocksPerRange + best;
  const int n_ranges = units_of_tile(max_blocks, r);
  return {r, n_ranges < range_capacity ? n_ranges : range_capacity,
          units_for[best] < unit_capacity ? units_for[best] : unit_capacity};
}

M3SA_HOST_DEVICE RangeChoice choose_blocks_per_range(const int* units_for, int max_blocks,
                                                     int unit_capacity, int range_capacity,
                                                     int persistent_ctas, int cheap_ranges) {
  int best = kRangeChoices - 1;
  unsigned long long best_key = kUnfitRangeChoice;
  for (int c = 0; c < kRangeChoices; ++c) {
    const unsigned long long key = range_choice_key(units_for[c], c, max_blocks, unit_capacity,
                                                    range_capacity, persistent_ctas, cheap_ranges);
    if (key < best_key) best = c, best_key = key;
  }
  return range_choice(best, units_for, max_blocks, unit_capacity, range_capacity);
}

// The error model of the QGMMA prefill scores (certify_selection.cuh), measured on the H200 (s18
// r2, GPU test QgmmaScoresStayWithinTheCertificationBound): a k32 step adds its 32 exact e4m3
// products to the fp32 accumulator after aligning every term to the largest magnitude among them,
// the accumulator included, and truncating each to 13 bits below that magnitude's leading bit. So
// each term loses less than 2^-13 of the largest: one product of 256 followed by 127 products of
// 0.94 or 0.5 of 2^-5 (the unit of the last kept bit at 256) lost every small product, an error of
// 0.0144 or 0.0077 of |q| |k| (session 17 had assumed 2^-9 = 0.00195 of |q| |k| from random data,
// which those rows exceed 7x). Step j's error is then below kQgmmaStepTerms 2^-13 M_j, where the
// largest term M_j is at most sum over the dims up to step j's end of |q_d k_d|, at most
// |q_{<=j}| |k_{<=j}| (Cauchy-Schwarz over that prefix of the dims). Summed over the 4 steps, with
// |k_{<=j}| the largest over the block's keys, it bounds every key's error, hence the block
// maximum's.
inline constexpr float kQgmmaTermError = 0x1p-13f;
inline constexpr int kQgmmaSteps = 4; // k32 steps over the 128 dims
// 32 products and the accumulator, plus 3 in case the tensor core aligns each k8 group of a step
// separately (each with the running sum as a term).
inline constexpr int kQgmmaStepTerms = 36;
// The roundings the model leaves out: the sum's conversion to fp32, the norms' and the bound's own
// fp32 arithmetic, the rescore's fp32 sum (each a few units of 2^-24 relative).
inline constexpr float kQgmmaBoundMargin = 1.0625f;
// The bound's factor per step and unit of |scale| |q_{<=j}| |k_{<=j}|.
inline constexpr float kQgmmaStepError = kQgmmaStepTerms * kQgmmaTermError * kQgmmaBoundMargin;

} // namespace m3sa::cuda
