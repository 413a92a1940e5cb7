#include "testing/compare.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "m3sa/numeric.h"

namespace m3sa::testing {
namespace {

std::vector<int32_t> row_of(const TensorView& t, int64_t h, int64_t token) {
  std::vector<int32_t> row(t.shape[2]);
  for (int64_t k = 0; k < t.shape[2]; ++k) row[k] = t.ptr<const int32_t>()[t.offset({h, token, k})];
  return row;
}

std::string text(const std::vector<int32_t>& row) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < row.size(); ++i) out << (i ? " " : "") << row[i];
  out << "]";
  return out.str();
}

} // namespace

TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, double near_tie_relative) {
  TopkComparison c;
  for (int64_t h = 0; h < expected.shape[0]; ++h)
    for (int64_t t = 0; t < expected.shape[1]; ++t) {
      ++c.rows;
      const auto want = row_of(expected, h, t), have = row_of(got, h, t);
      if (want == have) {
        ++c.identical_rows;
        continue;
      }
      bool near_tie = scores.present();
      double gap = 0;
      if (near_tie) {
        // Same count of valid ids, and every block selected by one side only scores within
        // tolerance of the weakest block the reference selected.
        const auto score = [&](int32_t b) {
          return static_cast<double>(scores.ptr<const float>()[scores.offset({h, t, b})]);
        };
        const auto valid = [](const std::vector<int32_t>& row) {
          return std::count_if(row.begin(), row.end(), [](int32_t b) { return b >= 0; });
        };
        double weakest = INFINITY;
        for (int32_t b : want)
          if (b >= 0) weakest = std::min(weakest, score(b));
        near_tie = valid(want) == valid(have) && std::isfinite(weakest);
        for (const auto* side : {&want, &have})
          for (int32_t b : *side) {
            const auto& other = side == &want ? have : want;
            if (b < 0 || std::find(other.begin(), other.end(), b) != other.end()) continue;
            const double relative = std::abs(score(b) - weakest) / std::max(1.0, std::abs(weakest));
            gap = std::max(gap, relative);
            near_tie = near_tie && relative <= near_tie_relative;
          }
      }
      if (near_tie) {
        ++c.near_tie_rows;
        c.largest_near_tie_gap = std::max(c.largest_near_tie_gap, gap);
      } else {
        if (c.mismatched_rows++ == 0) {
          std::ostringstream out;
          out << "head " << h << " token " << t << ": expected " << text(want) << ", got "
              << text(have);
          c.first_mismatch = out.str();
        }
      }
    }
  return c;
}

AttentionComparison compare_attention(const TensorView& expected_out, const TensorView& got_out,
                                      const TensorView& expected_lse, const TensorView& got_lse) {
  AttentionComparison c;
  double diff2 = 0, ref2 = 0;
  for (int64_t t = 0; t < expected_out.shape[0]; ++t)
    for (int64_t h = 0; h < expected_out.shape[1]; ++h) {
      for (int64_t d = 0; d < expected_out.shape[2]; ++d) {
        const double want =
            bf16_bits_to_float(expected_out.ptr<const uint16_t>()[expected_out.offset({t, h, d})]);
        const double have =
            bf16_bits_to_float(got_out.ptr<const uint16_t>()[got_out.offset({t, h, d})]);
        ++c.elements;
        if (std::isfinite(want) != std::isfinite(have)) {
          ++c.nonfinite_mismatches;
          continue;
        }
        if (!std::isfinite(want)) continue;
        c.max_abs_error = std::max(c.max_abs_error, std::abs(want - have));
        diff2 += (want - have) * (want - have);
        ref2 += want * want;
      }
      if (expected_lse.present() && got_lse.present()) {
        const double want = expected_lse.ptr<const float>()[expected_lse.offset({t, h})];
        const double have = got_lse.ptr<const float>()[got_lse.offset({t, h})];
        if (std::isinf(want) || std::isinf(have) || std::isnan(want) || std::isnan(have)) {
          if (!(want == have)) ++c.lse_inf_mismatches;
        } else {
          c.max_lse_error =
              std::max(c.max_lse_error, std::abs(want - have) / std::max(1.0, std::abs(want)));
        }
      }
    }
  c.relative_l2_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return c;
}

std::string describe(const TopkComparison& c) {
  std::ostringstream out;
  out << c.identical_rows << "/" << c.rows << " rows identical, " << c.near_tie_rows << " near-tie";
  if (c.near_tie_rows) out << " (largest relative gap " << c.largest_near_tie_gap << ")";
  out << ", " << c.mismatched_rows << " mismatched";
  if (!c.first_mismatch.empty()) out << "; first: " << c.first_mismatch;
  return out.str();
}

std::string describe(const AttentionComparison& c) {
  std::ostringstream out;
  out << c.elements << " outputs: relative L2 error " << c.relative_l2_error << ", max abs error "
      << c.max_abs_error << ", non-finite mismatches " << c.nonfinite_mismatches
      << ", max lse error " << c.max_lse_error << ", lse inf mismatches " << c.lse_inf_mismatches;
  return out.str();
}

} // namespace m3sa::testing
