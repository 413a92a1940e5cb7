// The decode attention's host-checkable arithmetic (cuda/attention_math.h). The partials' shared-
// memory layout: every (row, dim) has its own float, and the two access patterns that use it - the
// warps' fragment stores and the merge's float4 loads (kernels/attention_common.cuh, store_partial
// and merge_rows) - meet no bank conflict, which is what the layout is for (bench/NOTES.md s12 r4 /
// r5). The e4m3 path's query scale keeps the largest query inside fp16's range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
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

// The compact partials' row scale: a power of two at or above x, below 2x (x itself when it is
// one) for normal x, the smallest normal power for subnormal x; 1 where x is not a positive
// finite number.
TEST(CompactFixedPoint, RowScaleIsTheNextPowerOfTwo) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.f, 2.f);
  std::uniform_int_distribution<int> exponent(-140, 126);
  const float smallest_normal = std::ldexp(1.f, -126);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    const float a = cuda::power_of_two_at_least(x);
    int e = 0;
    EXPECT_EQ(std::frexp(a, &e), 0.5f) << x; // a power of two
    EXPECT_GE(a, x) << x;
    if (x >= smallest_normal) {
      EXPECT_LT(a, 2 * x) << x;
    } else {
      EXPECT_EQ(a, smallest_normal) << x;
    }
  }
  for (int e = -126; e <= 127; ++e)
    EXPECT_EQ(cuda::power_of_two_at_least(std::ldexp(1.f, e)), std::ldexp(1.f, e));
  EXPECT_EQ(cuda::power_of_two_at_least(0.f), 1.f);
  EXPECT_EQ(cuda::power_of_two_at_least(-2.f), 1.f);
  EXPECT_EQ(cuda::power_of_two_at_least(INFINITY), 1.f);
  EXPECT_EQ(cuda::power_of_two_at_least(NAN), 1.f);
}

// The 16-bit fixed point (the biased-add rounding, no clamp) equals round-to-nearest-even for
// every value of a row's range [-a, a] at scale kFixedLevels / a: the row's extremes land on
// +-32767 (2^15 would not fit in 16 bits), ties go to even.
TEST(CompactFixedPoint, PackIsRoundToNearestEvenWithinTheRowScale) {
  const auto expected = [](float v, float scale) {
    const double q = std::nearbyint(static_cast<double>(v) * scale); // FE_TONEAREST: ties to even
    EXPECT_LE(std::fabs(q), 32767.0) << v << " " << scale;
    return static_cast<uint32_t>(static_cast<int32_t>(q)) & 0xffffu;
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (int i = 0; i < 200000; ++i) {
    const float a = std::ldexp(1.f, exponent(rng)), scale = cuda::kFixedLevels / a;
    const float x = unit(rng) * a, y = unit(rng) * a;
    const uint32_t word = cuda::pack_fixed2(x, y, scale);
    ASSERT_EQ(word & 0xffffu, expected(x, scale)) << x << " " << a;
    ASSERT_EQ(word >> 16, expected(y, scale)) << y << " " << a;
  }
  for (int e = -20; e <= 20; ++e) { // the row's largest value, and the float just below it
    const float a = std::ldexp(1.f, e), scale = cuda::kFixedLevels / a;
    for (const float v : {a, std::nextafter(a, 0.f)}) {
      const uint32_t word = cuda::pack_fixed2(v, -v, scale);
      ASSERT_EQ(word & 0xffffu, 32767u) << v;
      ASSERT_EQ(word >> 16, expected(-v, scale)) << v;
      ASSERT_EQ(word >> 16, 0x8001u) << v; // -32767
    }
  }
  for (int k = -32767; k <= 32767; ++k) { // every integer and every tie k + 0.5, at scale 1
    for (const float v : {static_cast<float>(k), k + 0.5f}) {
      if (std::fabs(v) > 32767.f) continue;
      const uint32_t word = cuda::pack_fixed2(v, -v, 1.f);
      ASSERT_EQ(word & 0xffffu, expected(v, 1.f)) << v;
      ASSERT_EQ(word >> 16, expected(-v, 1.f)) << v;
    }
  }
}

// What the merge reads back: the fixed-point word times a x kFixedStep is within half a step
// (a / 65534) of the value, plus the step's own fp32 rounding, for every value of the row's range.
TEST(CompactFixedPoint, RoundTripIsWithinHalfAStep) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int i = 0; i < 200000; ++i) {
    const float a = std::ldexp(1.f, exponent(rng)), scale = cuda::kFixedLevels / a;
    const float x = i % 1000 == 0 ? (i % 2000 == 0 ? a : -a) : unit(rng) * a;
    const uint32_t word = cuda::pack_fixed2(x, 0.f, scale);
    const float decoded =
        static_cast<float>(static_cast<int16_t>(word & 0xffffu)) * (a * cuda::kFixedStep);
    ASSERT_LE(std::fabs(static_cast<double>(decoded) - x), a / 65534.0 * (1 + 1e-6) + a * 0x1p-23)
        << x << " " << a;
  }
}

} // namespace
} // namespace m3sa::testing
