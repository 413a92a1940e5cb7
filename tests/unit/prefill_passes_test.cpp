// The prefill's pass rules (prefill_pass_capacity / prefill_pass_tokens /
// prefill_sorts_by_counting, cuda/attention_params.h), checked on the host: how many tokens a pass
// may hold within the partials' budget, how the prefill rows of a call split into passes, and
// which passes sort their entries by counting. The kernels of each pass are checked on the GPU
// (CudaAttention.PrefillTwoPassesK32 runs two; CudaAttentionSort both sorts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/attention_params.h"

namespace m3sa::testing {
namespace {

using cuda::kCompactPartialBytes;
using cuda::kPrefillPartialBudget;
using cuda::prefill_pass_capacity;
using cuda::prefill_pass_tokens;
using cuda::prefill_sorts_by_counting;

TEST(PrefillPasses, CapacityKeepsThePartialsWithinTheBudget) {
  // M3 at TP1 (4 KV heads, top_k 16): an 8K chunk in two passes.
  EXPECT_EQ(prefill_pass_capacity(4, 16, 1 << 20), 4401);
  EXPECT_EQ(prefill_pass_capacity(4, 32, 1 << 20), 2200);
  // TP4 (one KV head): the plan's max_tokens bounds it first.
  EXPECT_EQ(prefill_pass_capacity(1, 16, 8192), 8192);
  EXPECT_EQ(prefill_pass_capacity(1, 16, 1 << 20), 17606);
  // At least one token, whatever the plan says, and where one token's partials alone exceed the
  // budget (more KV heads x top_k than any model has: the plan still runs, one token a pass).
  EXPECT_EQ(prefill_pass_capacity(4, 16, 0), 1);
  EXPECT_EQ(prefill_pass_capacity(int64_t{1} << 20, 32, 8192), 1);
  for (int heads : {1, 2, 4, 8, 16})
    for (int top_k : {1, 8, 16, 32}) {
      const int64_t cap = prefill_pass_capacity(heads, top_k, int64_t{1} << 30);
      EXPECT_LE(cap * heads * top_k * kCompactPartialBytes, kPrefillPartialBudget);
      EXPECT_GT((cap + 1) * heads * top_k * kCompactPartialBytes, kPrefillPartialBudget);
    }
}

TEST(PrefillPasses, RowsSplitEvenlyIntoTheFewestPassesOfWholeTiles) {
  EXPECT_EQ(prefill_pass_tokens(8192, 4401), 4096);
  EXPECT_EQ(prefill_pass_tokens(3001, 2200), 1504); // 1,501 rounded up to whole union tiles
  EXPECT_EQ(prefill_pass_tokens(700, 4401), 704);   // one pass: the bound is not reached
  EXPECT_EQ(prefill_pass_tokens(4401, 4401), 4401); // never past the capacity
  EXPECT_EQ(prefill_pass_tokens(1, 1), 1);
  for (int32_t capacity : {1, 2, 3, 7, 64, 1956, 2200, 4401})
    for (int64_t rows = 1; rows <= 3 * int64_t{capacity} + 5; rows += (rows < 50 ? 1 : 37)) {
      const int32_t per_pass = prefill_pass_tokens(rows, capacity);
      ASSERT_GE(per_pass, 1);
      ASSERT_LE(per_pass, capacity) << rows << " rows";
      // The attention's loop: passes of per_pass rows, the last one shorter.
      int64_t passes = 0, shortest = rows;
      for (int64_t begin = 0; begin < rows; begin += per_pass, ++passes)
        shortest = std::min<int64_t>(shortest, std::min<int64_t>(per_pass, rows - begin));
      EXPECT_EQ(passes, (rows + capacity - 1) / capacity) << rows << " rows";
      // Even: no pass is more than a union tile a pass shorter than the others.
      EXPECT_GE(shortest + int64_t{cuda::kUnionTokens} * passes, per_pass) << rows << " rows";
      // Whole union tiles, unless the capacity is the bound.
      if (per_pass < capacity) {
        EXPECT_EQ(per_pass % cuda::kUnionTokens, 0) << rows << " rows";
      }
    }
}

TEST(PrefillPasses, CountingSortOnTheWgmmaAttendWithFewKeys) {
  // The bench's single requests: 16/1 S=8K (64 keys) to 64/4 S=128K (4,096 keys, 4,096-token
  // passes) sort by counting; never on the mma.sync attend.
  EXPECT_TRUE(prefill_sorts_by_counting(true, 1, 64, 8192));
  EXPECT_TRUE(prefill_sorts_by_counting(true, 4, 1024, 4096));
  EXPECT_FALSE(prefill_sorts_by_counting(false, 1, 64, 8192));
  // The key bound, at its edge.
  EXPECT_TRUE(prefill_sorts_by_counting(true, 4, cuda::kCountingSortBins / 4, 32));
  EXPECT_FALSE(prefill_sorts_by_counting(true, 4, cuda::kCountingSortBins / 4 + 1, 32));
  EXPECT_FALSE(prefill_sorts_by_counting(true, 1, 0, 8192));
  // The bitmaps' bound: keys x 32-token words, at its edge (16,384 keys x 128 words).
  EXPECT_TRUE(prefill_sorts_by_counting(true, 4, 4096, 128 * 32));
  EXPECT_FALSE(prefill_sorts_by_counting(true, 4, 4096, 128 * 32 + 1));
  // A single head's pass of 17,606 tokens (its capacity at top_k 16): up to 3,806 pages.
  const int64_t words = (17606 + 31) / 32;
  EXPECT_TRUE(prefill_sorts_by_counting(true, 1, cuda::kCountingSortWords / words, 17606));
  EXPECT_FALSE(prefill_sorts_by_counting(true, 1, cuda::kCountingSortWords / words + 1, 17606));
}

} // namespace
} // namespace m3sa::testing
