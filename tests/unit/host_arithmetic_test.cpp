// The host arithmetic every plan and argument check rests on: the saturating products and sums
// (src/common/checked_math.h) that keep a caller's huge shapes from wrapping into small byte
// counts, and the workspace carver (src/common/workspace.h) whose measuring pass sizes a plan's
// workspace and whose carving pass must hand out the same regions inside it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/workspace.h"

namespace m3sa::detail {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr size_t kSizeMax = std::numeric_limits<size_t>::max();

TEST(SaturatingMath, SignedProductsAreExactUntilTheySaturateTowardTheirSign) {
  EXPECT_EQ(saturating_mul(int64_t{6}, int64_t{7}), 42);
  EXPECT_EQ(saturating_mul(int64_t{-6}, int64_t{7}), -42);
  EXPECT_EQ(saturating_mul(int64_t{-6}, int64_t{-7}), 42);
  EXPECT_EQ(saturating_mul(kMax, int64_t{1}), kMax);
  EXPECT_EQ(saturating_mul(kMin, int64_t{1}), kMin);
  EXPECT_EQ(saturating_mul(int64_t{1} << 62, int64_t{0}), 0);
  // One past: 2^62 x 2 = 2^63 does not fit.
  EXPECT_EQ(saturating_mul(int64_t{1} << 62, int64_t{2}), kMax);
  EXPECT_EQ(saturating_mul(int64_t{1} << 62, int64_t{-2}), kMin); // -2^63 fits exactly
  EXPECT_EQ(saturating_mul(int64_t{1} << 62, int64_t{-3}), kMin);
  EXPECT_EQ(saturating_mul(int64_t{-3}, int64_t{1} << 62), kMin);
  EXPECT_EQ(saturating_mul(-(int64_t{1} << 62), int64_t{-3}), kMax);
  EXPECT_EQ(saturating_mul(kMin, int64_t{-1}), kMax); // -(-2^63) does not fit
}

TEST(SaturatingMath, SignedSumsAreExactUntilTheySaturateTowardTheirSign) {
  EXPECT_EQ(saturating_add(int64_t{40}, int64_t{2}), 42);
  EXPECT_EQ(saturating_add(int64_t{-40}, int64_t{-2}), -42);
  EXPECT_EQ(saturating_add(kMax, int64_t{-1}), kMax - 1);
  EXPECT_EQ(saturating_add(kMax - 1, int64_t{1}), kMax);
  EXPECT_EQ(saturating_add(kMax, int64_t{1}), kMax);
  EXPECT_EQ(saturating_add(int64_t{1}, kMax), kMax);
  EXPECT_EQ(saturating_add(kMin + 1, int64_t{-1}), kMin);
  EXPECT_EQ(saturating_add(kMin, int64_t{-1}), kMin);
  EXPECT_EQ(saturating_add(int64_t{-1}, kMin), kMin);
  EXPECT_EQ(saturating_add(kMin, kMax), -1);
}

TEST(SaturatingMath, UnsignedProductsAndSumsSaturateAtTheMaximum) {
  EXPECT_EQ(saturating_mul(size_t{6}, size_t{7}), size_t{42});
  EXPECT_EQ(saturating_mul(kSizeMax, size_t{1}), kSizeMax);
  EXPECT_EQ(saturating_mul(kSizeMax / 2 + 1, size_t{2}), kSizeMax); // 2^64 wraps to 0
  EXPECT_EQ(saturating_mul(size_t{1} << 32, size_t{1} << 32), kSizeMax);
  EXPECT_EQ(saturating_add(size_t{40}, size_t{2}), size_t{42});
  EXPECT_EQ(saturating_add(kSizeMax - 1, size_t{1}), kSizeMax);
  EXPECT_EQ(saturating_add(kSizeMax, size_t{1}), kSizeMax); // would wrap to 0
  EXPECT_EQ(saturating_add(size_t{64}, kSizeMax - 10), kSizeMax);
}

// A plan measures its workspace with a carver over no memory and then carves the caller's buffer
// with the same takes: both passes must give the same offsets, each region aligned and inside
// bytes_used, the regions in order and disjoint.
TEST(Workspace, MeasuringAndCarvingPassesAgreeOnAlignedDisjointRegions) {
  const std::vector<size_t> counts = {1, 3, 0, 17, 64, 5, 1000};
  WorkspaceCarver measure;
  for (size_t c : counts) {
    EXPECT_EQ(measure.take<float>(c), nullptr);
    EXPECT_EQ(measure.take<char>(c + 1), nullptr);
  }
  const size_t bytes = measure.bytes_used();
  EXPECT_EQ(bytes % WorkspaceCarver::kAlignment, 0u);

  std::vector<unsigned char> buffer(bytes + WorkspaceCarver::kAlignment);
  // The caller's workspace is aligned (its allocator's); the carver keeps offsets aligned.
  const auto base_address = reinterpret_cast<uintptr_t>(buffer.data());
  char* base = reinterpret_cast<char*>((base_address + WorkspaceCarver::kAlignment - 1) /
                                       WorkspaceCarver::kAlignment * WorkspaceCarver::kAlignment);
  WorkspaceCarver carve(base);
  size_t end_of_previous = 0, expected_bytes = 0;
  for (size_t c : counts) {
    const auto floats = reinterpret_cast<char*>(carve.take<float>(c));
    const auto chars = carve.take<char>(c + 1);
    for (const auto& [region, size] :
         {std::pair{floats, c * sizeof(float)}, std::pair{chars, c + 1}}) {
      const auto offset = static_cast<size_t>(region - base);
      EXPECT_EQ(offset % WorkspaceCarver::kAlignment, 0u) << "count " << c;
      EXPECT_GE(offset, end_of_previous) << "count " << c; // in order, no overlap
      EXPECT_LE(offset + size, bytes) << "count " << c;
      end_of_previous = offset + size;
      expected_bytes = offset + size;
    }
  }
  EXPECT_EQ(carve.bytes_used(), bytes);
  // Rounded up to the alignment, and by less than one alignment unit.
  EXPECT_GE(bytes, expected_bytes);
  EXPECT_LT(bytes - expected_bytes, WorkspaceCarver::kAlignment);
}

TEST(Workspace, ARegionTooLargeToAddressSaturatesTheSize) {
  WorkspaceCarver measure;
  measure.take<double>(16);
  measure.take<double>(kSizeMax / 4); // count x 8 bytes wraps
  // A size no allocation can meet (plans reject it), not a small wrapped-around one.
  EXPECT_GE(measure.bytes_used(), kSizeMax - WorkspaceCarver::kAlignment + 1);
  measure.take<char>(1);
  EXPECT_GE(measure.bytes_used(), kSizeMax - WorkspaceCarver::kAlignment + 1);
}

TEST(Workspace, EmptyTakesStillAlignTheNextRegion) {
  WorkspaceCarver measure;
  EXPECT_EQ(measure.bytes_used(), 0u);
  measure.take<char>(1);
  EXPECT_EQ(measure.bytes_used(), WorkspaceCarver::kAlignment);
  measure.take<char>(0);
  EXPECT_EQ(measure.bytes_used(), WorkspaceCarver::kAlignment);
  measure.take<char>(WorkspaceCarver::kAlignment + 1);
  EXPECT_EQ(measure.bytes_used(), 3 * WorkspaceCarver::kAlignment);
}

} // namespace
} // namespace m3sa::detail
