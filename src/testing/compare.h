#pragma once
// Comparisons used by the tests and by `m3sa demo` to check a backend against the reference.
// docs/testing.md says what each one tolerates and why.
#include <cstdint>
#include <string>
#include <vector>

#include "m3sa/config.h"
#include "m3sa/tensor_view.h"

namespace m3sa::testing {

class SyntheticBatch;

// Near-tie tolerance for selections, relative to max(|score|, 1) of the two exchanged blocks.
// The reference rounds its double-accumulated score once to fp32 (error <= 2^-24 relative); a
// backend summing 128 products in fp32 in another order errs by up to ~127 * 2^-24 of the sum of
// |products| (Higham's gamma_127). Observed CPU vs reference on random bf16 data over 12 seeds:
// at most 1.45e-6 of max(|score|, 1) (fp8 data: 0, its sums are exact in fp32). Two scores can
// drift apart by twice that, 2.9e-6; 1e-5 (~80 fp32 ulps) is 3.4x above, far below the gaps of
// distinct scores on integer data (>= 1).
inline constexpr double kNearTieRelative = 1e-5;

// What the contract fixes about a row independently of its scores (§5): the causal block count
// n = position / 128 + 1 and the forced blocks. Without positions only the format is checked.
struct SelectionRules {
  std::vector<int64_t> positions; // per token, -1 for padding rows
  int local_blocks = 0, init_blocks = 0;
};
SelectionRules selection_rules(const MsaConfig& config, const SyntheticBatch& sb);

// Why `row` (K slots) is not a valid contract row for a token at `position` (no position: -2),
// or "" if it is: ids ascending and unique, -1 only after the last valid id, ids in [0, n),
// min(n, K) valid ids, the first `init` and last `local` blocks present when n > K.
std::string selection_row_error(const std::vector<int32_t>& row, int64_t position,
                                const SelectionRules& rules);

struct TopkComparison {
  int64_t rows = 0;
  int64_t identical_rows = 0;
  int64_t near_tie_rows = 0; // valid rows differing only by exchanges of near-tied blocks
  int64_t invalid_rows = 0;  // rows (of either side) breaking the format; counted as mismatched
  int64_t mismatched_rows = 0;
  double largest_near_tie_gap = 0; // relative score gap of the worst accepted exchange
  std::string first_mismatch;      // "head h token t: expected [...], got [...] (why)"
  bool ok() const { return mismatched_rows == 0; }
};

// Whether two equal finite numbers in the explaining scores bind the compared row to the lower id.
// They do where the compared backend's sums are these very floats: its own scores, or integer data
// (every partial sum exact, so every backend's scores are bit-identical). They do not where another
// backend's rounding made them equal: on random data the compared backend, summing in another
// order, may round the two blocks apart, and either order is then a near-tie of gap 0 (contract
// §4; seen in s27 r1: CPU 50.3349 for both blocks, exact sums 50.334905 and 50.334910, and the GPU
// kernels took the exactly larger one). NaN with NaN and -inf with -inf bind either way: no
// summation order changes them.
enum class ExactTies { bind, are_near_ties };

// expected/got: [H, T, K] i32; scores: [H, T, N] f32 scores that explain differences, or absent
// (then rows must be identical). A differing row is accepted only if both rows are valid contract
// rows and every block selected by one side only is exchanged with blocks whose scores are within
// near_tie_relative of its own, an exact tie going to the lower id as `ties` says.
TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, const SelectionRules& rules,
                            ExactTies ties = ExactTies::are_near_ties,
                            double near_tie_relative = kNearTieRelative);
// The same without positions: the causal range and forced blocks are not checked.
TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, ExactTies ties = ExactTies::are_near_ties,
                            double near_tie_relative = kNearTieRelative);

// Attention tolerances for the CPU backend against the reference (both fp32 or better, one bf16
// rounding at the end). Observed over 12 seeds (bf16 and e4m3 KV): relative L2 <= 6.0e-5 (outputs
// rounding to neighbouring bf16 values), lse <= 4.3e-7 (fp32 vs double log-sum-exp); the bounds
// are about 4x that.
inline constexpr double kAttentionRelativeL2 = 2.5e-4;
inline constexpr double kAttentionLse = 2e-6;
// The CUDA kernels against the host backends (issue 11's bound): their P·V rounds P to a bf16
// pair (~16 bits) and the prefill's partials to 16-bit fixed point, so after the bf16 rounding of
// both outputs they differ more (observed rel. L2 <= 2.2e-4 with fp32 partials; lse <= 6e-7).
inline constexpr double kGpuAttentionRelativeL2 = 1e-3;
inline constexpr double kGpuAttentionLse = 1e-4;

struct AttentionComparison {
  int64_t elements = 0;
  double max_abs_error = 0;
  double relative_l2_error = 0;     // ||got - expected|| / ||expected||
  int64_t nonfinite_mismatches = 0; // one side non-finite and the other not its equal (NaN vs inf)
  double max_lse_error = 0;
  int64_t lse_inf_mismatches = 0;
  bool ok(double relative_tolerance = kAttentionRelativeL2,
          double lse_tolerance = kAttentionLse) const {
    return nonfinite_mismatches == 0 && lse_inf_mismatches == 0 &&
           relative_l2_error <= relative_tolerance && max_lse_error <= lse_tolerance;
  }
};

// out: [T, Hq, 128] bf16; lse: [T, Hq] f32 (both lse views may be absent).
AttentionComparison compare_attention(const TensorView& expected_out, const TensorView& got_out,
                                      const TensorView& expected_lse, const TensorView& got_lse);

std::string describe(const TopkComparison& c);
std::string describe(const AttentionComparison& c);

} // namespace m3sa::testing
