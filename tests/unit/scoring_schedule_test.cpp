// The SM90 scorer's range length (choose_blocks_per_range, cuda/kernels/indexer_traits.h), the
// host-testable half of its schedule: the unit list itself is checked on the GPU
// (GpuPrefillScorerSmall.Sm90ScheduleListsEachUnitOnceRangeMajor).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cuda/kernels/indexer_traits.h"

namespace m3sa::testing {
namespace {

using cuda::choose_blocks_per_range;
using cuda::kMaxBlocksPerRange;
using cuda::kMinBlocksPerRange;
using cuda::kRangeChoices;
using cuda::kUnfitRangeChoice;
using cuda::kUnitOverheadBlocks;
using cuda::range_choice_key;
using cuda::units_of_tile;

// The unit counts of a batch of tiles for every R, and its longest tile.
struct Tiles {
  std::vector<int> units_for = std::vector<int>(kRangeChoices, 0);
  int max_blocks = 0;

  explicit Tiles(const std::vector<int>& blocks) {
    for (int b : blocks) {
      max_blocks = std::max(max_blocks, b);
      for (int c = 0; c < kRangeChoices; ++c)
        units_for[c] += units_of_tile(b, kMinBlocksPerRange + c);
    }
  }
};

// A prefill chunk of `tokens` after `prefix` tokens, in tiles of 256 / heads tokens.
std::vector<int> causal_tiles(int tokens, int prefix, int heads) {
  std::vector<int> blocks;
  const int tile = 256 / heads;
  for (int t = 0; t < tokens; t += tile) blocks.push_back((prefix + t + tile - 1) / 128 + 1);
  return blocks;
}

long long largest_share(const Tiles& tiles, int r, int ctas) {
  const int units = tiles.units_for[r - kMinBlocksPerRange];
  return (units + ctas - 1) / ctas * static_cast<long long>(r + kUnitOverheadBlocks);
}

TEST(ScoringSchedule, UnitsOfATileAlwaysIncludeRangeZero) {
  EXPECT_EQ(units_of_tile(0, 4), 1);
  EXPECT_EQ(units_of_tile(1, 4), 1);
  EXPECT_EQ(units_of_tile(4, 4), 1);
  EXPECT_EQ(units_of_tile(5, 4), 2);
  EXPECT_EQ(units_of_tile(64, 7), 10);
}

// R minimises the largest share among every R that fits, ties to the longer R; the chosen counts
// are the batch's for that R.
TEST(ScoringSchedule, RangeMinimisesTheLargestShare) {
  struct Case {
    int tokens, prefix, heads, ctas;
  };
  for (const Case c : {Case{8192, 0, 4, 132}, Case{8192, 0, 1, 132}, Case{8192, 24576, 4, 132},
                       Case{8192, 122880, 4, 132}, Case{16384, 1032192, 4, 132},
                       Case{300, 5000, 16, 7}, Case{64, 0, 4, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.tokens << " after " << c.prefix << " H " << c.heads << " ctas " << c.ctas);
    const Tiles tiles(causal_tiles(c.tokens, c.prefix, c.heads));
    const auto choice = choose_blocks_per_range(tiles.units_for.data(), tiles.max_blocks, 1 << 30,
                                                1 << 30, c.ctas, 1 << 30);
    ASSERT_GE(choice.blocks_per_range, kMinBlocksPerRange);
    ASSERT_LE(choice.blocks_per_range, kMaxBlocksPerRange);
    EXPECT_EQ(choice.units, tiles.units_for[choice.blocks_per_range - kMinBlocksPerRange]);
    EXPECT_EQ(choice.ranges, std::max(1, (tiles.max_blocks + choice.blocks_per_range - 1) /
                                             choice.blocks_per_range));
    const long long chosen = largest_share(tiles, choice.blocks_per_range, c.ctas);
    for (int r = kMinBlocksPerRange; r <= kMaxBlocksPerRange; ++r) {
      EXPECT_LE(chosen, largest_share(tiles, r, c.ctas)) << "R " << r;
      if (r > choice.blocks_per_range) {
        EXPECT_LT(chosen, largest_share(tiles, r, c.ctas)) << "R " << r;
      }
    }
  }
  // The case the unit list was built for (bench/NOTES.md s10 r2: C=8K at S=8K, H=4, 132 CTAs):
  // the old schedule's R = 16 left a largest share of 3 units (64 page steps, the mean is 31.5);
  // R = 9 makes it 4 units of 9 (520 units over 132 CTAs: 36 page steps + 4 stagings).
  const Tiles s8k(causal_tiles(8192, 0, 4));
  EXPECT_EQ(
      choose_blocks_per_range(s8k.units_for.data(), s8k.max_blocks, 1 << 30, 1 << 30, 132, 1 << 30)
          .blocks_per_range,
      9);
  EXPECT_EQ(largest_share(s8k, 9, 132), 40);
}

// Capacities: an R whose units or ranges do not fit is never chosen while one fits; ranges over
// the cheap (shared-memory) count only when no R stays under it; nothing fits: the longest R,
// clamped.
TEST(ScoringSchedule, RangeRespectsTheCapacities) {
  const Tiles tiles(causal_tiles(8192, 0, 4));
  const int* units_for = tiles.units_for.data();
  const int best =
      choose_blocks_per_range(units_for, tiles.max_blocks, 1 << 30, 1 << 30, 132, 1 << 30)
          .blocks_per_range;
  const int best_units = tiles.units_for[best - kMinBlocksPerRange];
  auto choice =
      choose_blocks_per_range(units_for, tiles.max_blocks, best_units - 1, 1 << 30, 132, 1 << 30);
  EXPECT_GT(choice.blocks_per_range, best);
  EXPECT_LE(choice.units, best_units - 1);
  // At most 4 ranges of the longest tile (64 blocks): R >= 16.
  choice = choose_blocks_per_range(units_for, tiles.max_blocks, 1 << 30, 4, 132, 1 << 30);
  EXPECT_GE(choice.blocks_per_range, 16);
  EXPECT_LE(choice.ranges, 4);
  // At most 3 cheap ranges: only R >= 22 keeps under them, and some R does.
  choice = choose_blocks_per_range(units_for, tiles.max_blocks, 1 << 30, 1 << 30, 132, 3);
  EXPECT_GE(choice.blocks_per_range, 22);
  // Nothing fits: the longest R, its counts clamped to the capacities.
  choice = choose_blocks_per_range(units_for, tiles.max_blocks, 10, 1, 132, 1 << 30);
  EXPECT_EQ(choice.blocks_per_range, kMaxBlocksPerRange);
  EXPECT_EQ(choice.units, 10);
  EXPECT_EQ(choice.ranges, 1);
}

// The schedule kernel takes the smallest range_choice_key across a warp, in no particular order:
// the keys must order like (largest share, then the longer R first) for any counts, with no two
// choices equal, and an unfit choice above every fit one.
TEST(ScoringSchedule, RangeChoiceKeysOrderLikeTheShareThenTheLongerRange) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 2000; ++trial) {
    const int ctas = 1 + static_cast<int>(rng() % 264);
    const int max_blocks = 1 + static_cast<int>(rng() % 8192);
    const int cap = trial % 3 == 0 ? static_cast<int>(rng() % 100000) : (1 << 30);
    std::vector<int> units(kRangeChoices);
    for (int& u : units) u = static_cast<int>(rng() % (trial % 2 ? 200000 : 600));
    for (int a = 0; a < kRangeChoices; ++a)
      for (int b = 0; b < kRangeChoices; ++b) {
        if (a == b) continue;
        const unsigned long long ka =
            range_choice_key(units[a], a, max_blocks, cap, 1 << 30, ctas, 1 << 30);
        const unsigned long long kb =
            range_choice_key(units[b], b, max_blocks, cap, 1 << 30, ctas, 1 << 30);
        const bool fit_a = units[a] <= cap, fit_b = units[b] <= cap;
        ASSERT_EQ(ka == kUnfitRangeChoice, !fit_a);
        if (!fit_a || !fit_b) {
          if (fit_a != fit_b) {
            ASSERT_EQ(ka < kb, fit_a);
          }
          continue;
        }
        const long long share_a =
            (units[a] + ctas - 1) / ctas *
            static_cast<long long>(kMinBlocksPerRange + a + kUnitOverheadBlocks);
        const long long share_b =
            (units[b] + ctas - 1) / ctas *
            static_cast<long long>(kMinBlocksPerRange + b + kUnitOverheadBlocks);
        ASSERT_NE(ka, kb);
        ASSERT_EQ(ka < kb, share_a < share_b || (share_a == share_b && a > b))
            << "choices " << a << ", " << b << " of trial " << trial;
      }
  }
}

} // namespace
} // namespace m3sa::testing
