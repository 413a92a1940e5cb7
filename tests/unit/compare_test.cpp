// The comparators themselves, on hand-made rows: what compare_topk accepts as a near-tie and what
// it must reject, and how compare_attention counts non-finite outputs. Every CPU and GPU
// random-data case is decided by these, so a lenient comparator hides backend bugs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One decode token at position 9 * 128: n = 10 causal blocks, K = 4, local 1 (block 9 forced),
// three ranked slots among blocks 0..8. The table is two blocks wider than n.
constexpr int kK = 4;
constexpr int64_t kPosition = 9 * 128;

struct RowCase {
  std::vector<float> scores;    // blocks 0..11
  std::vector<int32_t> want;    // reference row
  std::vector<int32_t> have;    // backend row
  int64_t position = kPosition; // -1: padding row
};

// The hand-made scores stand for the compared backend's own (ExactTies::bind), unless a test says
// they are another backend's.
TopkComparison compare_one(const RowCase& c, bool with_scores = true,
                           ExactTies ties = ExactTies::bind) {
  HostTensor want(DType::i32, {1, 1, kK}), have(DType::i32, {1, 1, kK}),
      scores(DType::f32, {1, 1, 12});
  for (int i = 0; i < kK; ++i) {
    want.data<int32_t>()[i] = c.want[i];
    have.data<int32_t>()[i] = c.have[i];
  }
  for (int b = 0; b < 12; ++b) scores.data<float>()[b] = c.scores[b];
  SelectionRules rules;
  rules.positions = {c.position};
  rules.local_blocks = 1;
  return compare_topk(want.view(), have.view(), with_scores ? scores.view() : TensorView{}, rules,
                      ties);
}

// Blocks 2, 3, 4 are the best three (9, 8, 7); block 8 (6.99999) is a near-tie of block 4.
const std::vector<float> kScores = {1, 2, 9, 8, 7, 3, 3, 0.5f, 6.99999f, 0, -kInf, -kInf};
const std::vector<int32_t> kWant = {2, 3, 4, 9};

void expect_rejected(const RowCase& c, const char* why_part) {
  const TopkComparison cmp = compare_one(c);
  EXPECT_EQ(cmp.mismatched_rows, 1) << describe(cmp);
  EXPECT_NE(cmp.first_mismatch.find(why_part), std::string::npos) << describe(cmp);
}

TEST(CompareTopk, IdenticalValidRowIsAccepted) {
  const TopkComparison cmp = compare_one({kScores, kWant, kWant});
  EXPECT_EQ(cmp.identical_rows, 1) << describe(cmp);
  EXPECT_TRUE(cmp.ok());
}

TEST(CompareTopk, GenuineNearTieIsAcceptedAndItsGapReported) {
  // Block 8 (6.99999) instead of block 4 (7): a relative gap of 1.4e-6, below kNearTieRelative.
  const TopkComparison cmp = compare_one({kScores, kWant, {2, 3, 8, 9}});
  EXPECT_EQ(cmp.near_tie_rows, 1) << describe(cmp);
  EXPECT_TRUE(cmp.ok());
  EXPECT_NEAR(cmp.largest_near_tie_gap, 1e-5 / 7, 1e-7);
}

TEST(CompareTopk, RightSetInTheWrongOrderIsRejected) {
  expect_rejected({kScores, kWant, {3, 2, 4, 9}}, "got row invalid: ids not ascending");
}

TEST(CompareTopk, PaddingBeforeTheIdsIsRejected) {
  expect_rejected({kScores, kWant, {-1, 2, 3, 9}}, "got row invalid: slot 1 holds 2 after padding");
}

TEST(CompareTopk, DuplicateReplacingTheWeakestBlockIsRejected) {
  expect_rejected({kScores, kWant, {2, 3, 3, 9}}, "got row invalid: ids not ascending and unique");
}

TEST(CompareTopk, TieBrokenToTheHigherIdIsRejected) {
  std::vector<float> s = kScores;
  s[5] = 7; // blocks 4 and 5 tie exactly: block 4 wins
  expect_rejected({s, kWant, {2, 3, 5, 9}}, "tie of blocks 4 and 5");
}

TEST(CompareTopk, ExactTieOfAnotherBackendsScoresIsANearTieOfGapZero) {
  // Another backend's fp32 sums of blocks 4 and 5 rounded to the same float; the compared
  // backend's may round them apart, so taking block 5 is a near-tie either way.
  std::vector<float> s = kScores;
  s[5] = 7;
  const TopkComparison cmp = compare_one({s, kWant, {2, 3, 5, 9}}, true, ExactTies::are_near_ties);
  EXPECT_EQ(cmp.near_tie_rows, 1) << describe(cmp);
  EXPECT_EQ(cmp.largest_near_tie_gap, 0);
  EXPECT_TRUE(cmp.ok());
  // A wrong block is still wrong, and a tie of values no summation order changes still binds.
  EXPECT_EQ(compare_one({s, kWant, {2, 3, 6, 9}}, true, ExactTies::are_near_ties).mismatched_rows,
            1);
  std::vector<float> nan(12, kNan);
  nan[2] = 9, nan[3] = 8, nan[9] = 0;
  EXPECT_EQ(compare_one({nan, {0, 2, 3, 9}, {1, 2, 3, 9}}, true, ExactTies::are_near_ties)
                .mismatched_rows,
            1);
  std::vector<float> empty(12, -kInf);
  empty[2] = 9, empty[3] = 8, empty[9] = 0;
  EXPECT_EQ(compare_one({empty, {0, 2, 3, 9}, {1, 2, 3, 9}}, true, ExactTies::are_near_ties)
                .mismatched_rows,
            1);
}

TEST(CompareTopk, MinusZeroTiesPlusZero) {
  std::vector<float> s = {-1, -1, 9, 8, 0.f, -0.f, -1, -1, -1, -1, -kInf, -kInf};
  expect_rejected({s, kWant, {2, 3, 5, 9}}, "tie of blocks 4 and 5");
}

TEST(CompareTopk, NanTiesNanAndIsNeverNearANumber) {
  std::vector<float> s(12, kNan);
  s[2] = 9, s[3] = 8, s[9] = 0; // blocks 0, 1, 4..8 all NaN: block 0 takes the third slot
  expect_rejected({s, {0, 2, 3, 9}, {1, 2, 3, 9}}, "tie of blocks 0 and 1");
  s[0] = 1e-30f; // a number, the lowest: NaN block 1 may not replace it
  expect_rejected({s, {0, 2, 3, 9}, {1, 2, 3, 9}}, "NaN is never near a number");
}

TEST(CompareTopk, BlockNeitherRowChoseStillBreaksTiesToTheLowerId) {
  std::vector<float> s = kScores;
  s[6] = 6.99999f; // ties block 8 exactly; block 6 has the lower id, so block 8 cannot come first
  expect_rejected({s, kWant, {2, 3, 8, 9}}, "tie of blocks 6 and 8");
}

TEST(CompareTopk, ExchangeBeyondTheTieToleranceIsRejected) {
  expect_rejected({kScores, kWant, {2, 3, 5, 9}}, "relative gap");
  // Just past it: block 8 at 6.9996 for block 4's 7, a gap of 5.7e-5 - above kNearTieRelative
  // (1e-5), below ten times it.
  std::vector<float> s = kScores;
  s[8] = 6.9996f;
  expect_rejected({s, kWant, {2, 3, 8, 9}}, "relative gap");
}

TEST(CompareTopk, MissingForcedLocalBlockIsRejectedWhateverTheScores) {
  std::vector<float> s = kScores;
  s[9] = 7; // the forced block scores like the block taken instead
  expect_rejected({s, kWant, {2, 3, 4, 8}}, "forced local block 9 missing");
}

TEST(CompareTopk, BlocksBeyondTheCausalRangeAreRejected) {
  std::vector<float> s = kScores;
  s[10] = 7; // a score in the table past n, as a buggy backend could read
  expect_rejected({s, kWant, {2, 3, 9, 10}}, "block 10 beyond the 10 causal blocks");
}

TEST(CompareTopk, ShortAndPaddingRowsMustHoldExactlyTheirCausalBlocks) {
  expect_rejected({kScores, {0, 1, 2, -1}, {0, 1, -1, -1}, 2 * 128}, "2 valid ids, expected");
  expect_rejected({kScores, {-1, -1, -1, -1}, {0, -1, -1, -1}, -1}, "1 valid ids, expected");
  // The row rule on its own (the comparison above also sees the rows differ): a row one id short
  // of its min(n, K) blocks is invalid even when the reference row is the same.
  SelectionRules rules;
  rules.local_blocks = 1;
  EXPECT_EQ(selection_row_error({0, 1, 2, -1}, 2 * 128, rules), "");
  EXPECT_EQ(selection_row_error({0, 1, -1, -1}, 2 * 128, rules),
            "2 valid ids, expected min(n = 3, K) = 3");
  EXPECT_EQ(selection_row_error({2, 3, 9, -1}, kPosition, rules),
            "3 valid ids, expected min(n = 10, K) = 4");
}

TEST(CompareTopk, InvalidReferenceRowsAreReportedNotTrusted) {
  expect_rejected({kScores, {3, 2, 4, 9}, {3, 2, 4, 9}}, "expected row invalid");
  std::vector<float> s = kScores;
  s[5] = 7;
  expect_rejected({s, {2, 3, 5, 9}, kWant}, "broken to the higher id by the expected row");
}

TEST(CompareTopk, DifferingRowsWithoutScoresAreMismatches) {
  const TopkComparison cmp = compare_one({kScores, kWant, {2, 3, 8, 9}}, false);
  EXPECT_EQ(cmp.mismatched_rows, 1) << describe(cmp);
}

TEST(CompareTopk, WithoutPositionsTheFormatIsStillChecked) {
  HostTensor want(DType::i32, {1, 1, kK}), have(DType::i32, {1, 1, kK});
  for (int i = 0; i < kK; ++i) want.data<int32_t>()[i] = have.data<int32_t>()[i] = kWant[i];
  std::swap(have.data<int32_t>()[0], have.data<int32_t>()[1]);
  const TopkComparison cmp = compare_topk(want.view(), have.view(), TensorView{});
  EXPECT_EQ(cmp.invalid_rows, 1) << describe(cmp);
}

// out [1, 1, 128] bf16 pairs that differ in element 0 only.
AttentionComparison compare_first_element(float want, float have) {
  HostTensor a(DType::bf16, {1, 1, kHeadDim}), b(DType::bf16, {1, 1, kHeadDim});
  for (int d = 0; d < kHeadDim; ++d) store(DType::bf16, a.view().data, d, 1.f);
  for (int d = 0; d < kHeadDim; ++d) store(DType::bf16, b.view().data, d, 1.f);
  store(DType::bf16, a.view().data, 0, want);
  store(DType::bf16, b.view().data, 0, have);
  return compare_attention(a.view(), b.view(), TensorView{}, TensorView{});
}

TEST(CompareAttention, NonFiniteOutputsMustMatchExactly) {
  EXPECT_EQ(compare_first_element(kNan, kInf).nonfinite_mismatches, 1);
  EXPECT_EQ(compare_first_element(kInf, kNan).nonfinite_mismatches, 1);
  EXPECT_EQ(compare_first_element(kInf, -kInf).nonfinite_mismatches, 1);
  EXPECT_EQ(compare_first_element(2.f, kInf).nonfinite_mismatches, 1);
  EXPECT_FALSE(compare_first_element(kNan, kInf).ok());
  EXPECT_EQ(compare_first_element(kNan, kNan).nonfinite_mismatches, 0);
  EXPECT_EQ(compare_first_element(-kInf, -kInf).nonfinite_mismatches, 0);
  EXPECT_TRUE(compare_first_element(-kInf, -kInf).ok());
}

TEST(CompareAttention, OneBf16UlpInOneRowOf128ExceedsTheTolerance) {
  // A 1-ulp change (2^-7 at 1) in one element: relative L2 2^-7 / sqrt(128) = 6.9e-4, above
  // kAttentionRelativeL2: the bound allows only rare 1-ulp rounding differences.
  const AttentionComparison c = compare_first_element(1.f, 1.f + 0x1p-7f);
  EXPECT_NEAR(c.relative_l2_error, 0x1p-7 / std::sqrt(128.0), 1e-9);
  EXPECT_FALSE(c.ok()) << describe(c);
}

} // namespace
} // namespace m3sa::testing
