// The prefill's pass rule (prefill_pass_capacity / prefill_pass_tokens, cuda/attention_params.h),
// checked on the host: how many tokens a pass may hold within the partials' budget, and how the
// prefill rows of a call split into passes. The kernels of each pass are checked on the GPU
// (CudaAttention.PrefillTwoPassesK32 runs two).
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

TEST(PrefillPasses, CapacityKeepsThePartialsWithinTheBudget) {
  // M3 at TP1 (4 KV heads, top_k 16): an 8K chunk in two passes.
  EXPECT_EQ(prefill_pass_capacity(4, 16, 1 << 20), 4401);
  EXPECT_EQ(prefill_pass_capacity(4, 32, 1 << 20), 2200);
  // TP4 (one KV head): the plan's max_tokens bounds it first.
  EXPECT_EQ(prefill_pass_capacity(1, 16, 8192), 8192);
  EXPECT_EQ(prefill_pass_capacity(1, 16, 1 << 20), 17606);
  // At least one token, whatever the plan says.
  EXPECT_EQ(prefill_pass_capacity(4, 16, 0), 1);
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

} // namespace
} // namespace m3sa::testing
