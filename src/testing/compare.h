#pragma once
// Comparisons used by the tests and by `m3sa demo` to check a backend against the reference.
#include <cstdint>
#include <string>

#include "m3sa/tensor_view.h"

namespace m3sa::testing {

struct TopkComparison {
  int64_t rows = 0;
  int64_t identical_rows = 0;
  int64_t near_tie_rows = 0; // differ only in blocks whose reference scores tie within tolerance
  int64_t mismatched_rows = 0;
  double largest_near_tie_gap = 0; // relative score gap of the worst near-tie
  std::string first_mismatch;      // "head h token t: expected [...], got [...]"
  bool ok() const { return mismatched_rows == 0; }
};

// expected/got: [H, T, K] i32. scores ([H, T, N] f32 reference scores) may be absent: then every
TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, double near_tie_relative = 1e-5);

struct AttentionComparison {
  int64_t elements = 0;
  double max_abs_error = 0;
  double relative_l2_error = 0; // ||got - expected|| / ||expected||
  int64_t nonfinite_mismatches = 0;
  double max_lse_error = 0;
  int64_t lse_inf_mismatches = 0;
  bool ok(double relative_tolerance = 1e-3) const {
    return nonfinite_mismatches == 0 && lse_inf_mismatches == 0 &&
           relative_l2_error <= relative_tolerance && max_lse_error <= 1e-3;
  }
};

// out: [T, Hq, 128] bf16; lse: [T, Hq] f32 (both lse views may be absent).
AttentionComparison compare_attention(const TensorView& expected_out, const TensorView& got_out,
                                      const TensorView& expected_lse, const TensorView& got_lse);

std::string describe(const TopkComparison& c);
std::string describe(const AttentionComparison& c);

} // namespace m3sa::testing
