// The decode attention's host-checkable arithmetic (cuda/attention_math.h). The partials' shared-
// memory layout: every (row, dim) has its own float, and the two access patterns that use it - the
// warps' fragment stores and the merge's float4 loads (kernels/attention_common.cuh, store_partial
// and merge_rows) - meet no bank conflict, which is what the layout is for (bench/NOTES.md s12 r4 /
// r5). The e4m3 path's query scale keeps the largest query inside fp16's range.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cuda/attention_math.h"

namespace m3sa::testing {
namespace {

using cuda::kAttentionRows;
using cuda::PlainPartialLayout;
using cuda::SharedPartialLayout;

constexpr int kBanks = 32; // 4-byte banks

template <typename Layout> void expect_one_float_per_element() {
  std::set<int> offsets;
  for (int row = 0; row < kAttentionRows; ++row)
    for (int dim = 0; dim < 128; ++dim) {
      const int offset = Layout::offset(row, dim);
      ASSERT_GE(offset, 0);
      ASSERT_LT(offset, kAttentionRows * Layout::kRowFloats);
      ASSERT_TRUE(offsets.insert(offset).second) << "row " << row << " dim " << dim;
      // A 16-byte chunk stays whole (float4 loads), 16-byte aligned.
      ASSERT_EQ(offset % 4, dim % 4);
    }
}

TEST(PartialLayout, EveryElementHasItsOwnFloat) {
  expect_one_float_per_element<PlainPartialLayout>();
  expect_one_float_per_element<SharedPartialLayout>();
}

// Banks touched by one shared-memory wavefront: each access is `words` consecutive 4-byte words
// from a float offset; conflict-free when no bank is touched twice.
int worst_bank_load(const std::vector<int>& offsets, int words) {
  std::vector<int> hits(kBanks, 0);
  int worst = 0;
  for (int offset : offsets)
    for (int w = 0; w < words; ++w) worst = std::max(worst, ++hits[(offset + w) % kBanks]);
  return worst;
}

// store_partial: lane (gid, tid) of a warp writes float2 (dims nt * 8 + 2 tid, + 1) of rows gid
// and gid + 8; 64-bit stores go by half-warps (gid 0-3, then 4-7).
template <typename Layout> int worst_fragment_store() {
  int worst = 0;
  for (int nt = 0; nt < 16; ++nt)
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half) {
        std::vector<int> offsets;
        for (int lane = 16 * half; lane < 16 * half + 16; ++lane)
          offsets.push_back(Layout::offset(lane / 4 + 8 * r, nt * 8 + 2 * (lane % 4)));
        worst = std::max(worst, worst_bank_load(offsets, 2));
      }
  return worst;
}

// merge_rows: thread k (0-7) of row `row` loads float4 dims 16 k + 4 d for d = 0..3; 128-bit
// loads go by quarter-warps, which are the 8 threads of one row.
template <typename Layout> int worst_merge_load() {
  int worst = 0;
  for (int row = 0; row < kAttentionRows; ++row)
    for (int d = 0; d < 4; ++d) {
      std::vector<int> offsets;
      for (int k = 0; k < 8; ++k) offsets.push_back(Layout::offset(row, 16 * k + 4 * d));
      worst = std::max(worst, worst_bank_load(offsets, 4));
    }
  return worst;
}

TEST(PartialLayout, SharedLayoutHasNoBankConflicts) {
  EXPECT_EQ(worst_fragment_store<SharedPartialLayout>(), 1);
  EXPECT_EQ(worst_merge_load<SharedPartialLayout>(), 1);
  // What it replaced, for the record: 4-way on both.
  EXPECT_EQ(worst_fragment_store<PlainPartialLayout>(), 4);
  EXPECT_EQ(worst_merge_load<PlainPartialLayout>(), 4);
}

// The e4m3 decode attention's query scale (fp16_query_scale_exponent): 2^e and 2^-e are normal
// floats for every exponent field, the largest |q| lands in [2^14, 2^15) wherever it can, and
// never above 2^15 (fp16's largest finite value is 65504, just under 2^16).
TEST(E4m3QueryScale, KeepsTheLargestQueryInFp16Range) {
  for (int field = 0; field <= 255; ++field) {
    const int e = cuda::fp16_query_scale_exponent(field);
    EXPECT_GE(127 + e, 1) << field;
    EXPECT_LE(127 + e, 254) << field;
    EXPECT_GE(127 - e, 1) << field;
    EXPECT_LE(127 - e, 254) << field;
    if (field == 0 || field == 255) continue; // zero / subnormal, or inf / NaN
    // A normal bf16 of this field lies in [2^(field - 127), 2^(field - 126)).
    const int low = field - 127 + e, high = field - 126 + e;
    EXPECT_LE(high, 15) << field;
    if (field >= 15) {
      EXPECT_EQ(low, 14) << field;
    }
  }
}

} // namespace
} // namespace m3sa::testing
