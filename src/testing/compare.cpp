#include "testing/compare.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <sstream>
#include <vector>

#include "common/check.h"
#include "m3sa/numeric.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {
namespace {

std::vector<int32_t> row_of(const TensorView& t, int64_t h, int64_t token) {
  std::vector<int32_t> row(t.shape[2]);
  for (int64_t k = 0; k < t.shape[2]; ++k) row[k] = t.ptr<const int32_t>()[t.offset({h, token, k})];
  return row;
}

constexpr int64_t kNoPosition = -2; // rules without positions: check the format only

int64_t causal_blocks(int64_t position) { return position < 0 ? 0 : position / kBlockTokens + 1; }

std::string text(const std::vector<int32_t>& row) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < row.size(); ++i) out << (i ? " " : "") << row[i];
  out << "]";
  return out.str();
}

} // namespace

SelectionRules selection_rules(const MsaConfig& config, const SyntheticBatch& sb) {
  SelectionRules rules;
  rules.local_blocks = config.local_blocks;
  rules.init_blocks = config.init_blocks;
  for (int64_t t = 0; t < sb.num_tokens(); ++t) rules.positions.push_back(sb.position(t));
  return rules;
}

std::string selection_row_error(const std::vector<int32_t>& row, int64_t position,
                                const SelectionRules& rules) {
  const int64_t k = static_cast<int64_t>(row.size());
  int64_t valid = 0;
  while (valid < k && row[valid] >= 0) ++valid;
  for (int64_t i = valid; i < k; ++i)
    if (row[i] != -1) return detail::concat("slot ", i, " holds ", row[i], " after padding");
  for (int64_t i = 1; i < valid; ++i)
    if (row[i] <= row[i - 1]) return detail::concat("ids not ascending and unique at slot ", i);
  if (position == kNoPosition) return "";
  const int64_t n = causal_blocks(position);
  if (valid != std::min(n, k))
    return detail::concat(valid, " valid ids, expected min(n = ", n, ", K) = ", std::min(n, k));
  if (valid > 0 && row[valid - 1] >= n)
    return detail::concat("block ", row[valid - 1], " beyond the ", n, " causal blocks");
  if (n <= k) return ""; // then the row is 0..n-1, implied by the checks above
  const auto present = [&](int64_t b) {
    return std::binary_search(row.begin(), row.begin() + valid, b);
  };
  for (int64_t b = 0; b < rules.init_blocks; ++b)
    if (!present(b)) return detail::concat("forced init block ", b, " missing");
  for (int64_t b = n - rules.local_blocks; b < n; ++b)
    if (!present(b)) return detail::concat("forced local block ", b, " missing");
  return "";
}

namespace {

// Why a pair of valid rows that differ is not explained by near-ties of the reference `score`
// (of the row's blocks), or "" (then *gap is the largest relative gap of an exchange).
std::string unexplained_exchange(const std::vector<int32_t>& want, const std::vector<int32_t>& have,
                                 const std::function<float(int32_t)>& score, int64_t position,
                                 const SelectionRules& rules, ExactTies ties, double tolerance,
                                 double* gap) {
  const auto ids = [](const std::vector<int32_t>& row) {
    std::vector<int32_t> out;
    for (int32_t b : row)
      if (b >= 0) out.push_back(b);
    return out;
  };
  const std::vector<int32_t> w = ids(want), g = ids(have);
  if (w.size() != g.size()) return detail::concat(g.size(), " valid ids, expected ", w.size());
  std::vector<int32_t> added, unselected; // selected by `have` only; not selected by `have`
  std::set_difference(g.begin(), g.end(), w.begin(), w.end(), std::back_inserter(added));
  std::set_difference(w.begin(), w.end(), g.begin(), g.end(), std::back_inserter(unselected));
  // With a position, every candidate `have` left out can compete, not only the dropped ones.
  if (position != kNoPosition)
    for (int64_t b = rules.init_blocks; b < causal_blocks(position) - rules.local_blocks; ++b)
      if (!std::binary_search(g.begin(), g.end(), b) && !std::binary_search(w.begin(), w.end(), b))
        unselected.push_back(static_cast<int32_t>(b));
  const auto dropped = static_cast<int64_t>(w.size()) -
                       static_cast<int64_t>(std::count_if(w.begin(), w.end(), [&](int32_t b) {
                         return std::binary_search(g.begin(), g.end(), b);
                       }));
  for (int32_t a : added)
    for (int64_t i = 0; i < static_cast<int64_t>(unselected.size()); ++i) {
      const int32_t x = unselected[i];
      const bool reference_chose_x = i < dropped; // else x is a candidate neither side chose
      const float sa = score(a), sx = score(x);
      const bool exact_tie = sa == sx || (std::isnan(sa) && std::isnan(sx));
      const bool x_ranks_first =
          (std::isnan(sa) && !std::isnan(sx)) || sx > sa || (exact_tie && x < a);
      if (!reference_chose_x && !x_ranks_first) continue; // leaving x out is right
      const bool binding_tie =
          exact_tie && (ties == ExactTies::bind || !std::isfinite(sa) || !std::isfinite(sx));
      if (binding_tie)
        return detail::concat("tie of blocks ", std::min(a, x), " and ", std::max(a, x), " (score ",
                              sa, ") broken to the higher id by the ", x < a ? "got" : "expected",
                              " row");
      if (std::isnan(sa) || std::isnan(sx))
        return detail::concat("block ", a, " (score ", sa, ") taken instead of block ", x,
                              " (score ", sx, "): NaN is never near a number");
      const double relative =
          std::abs(double{sa} - sx) / std::max({1.0, std::abs(double{sa}), std::abs(double{sx})});
      if (relative > tolerance)
        return detail::concat("block ", a, " (score ", sa, ") taken instead of block ", x,
                              " (score ", sx, "): relative gap ", relative, " > ", tolerance);
      *gap = std::max(*gap, relative);
    }
  return "";
}

} // namespace

TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, const SelectionRules& rules, ExactTies ties,
                            double near_tie_relative) {
  TopkComparison c;
  for (int64_t h = 0; h < expected.shape[0]; ++h)
    for (int64_t t = 0; t < expected.shape[1]; ++t) {
      ++c.rows;
      const auto want = row_of(expected, h, t), have = row_of(got, h, t);
      const int64_t position = rules.positions.empty() ? kNoPosition : rules.positions[t];
      std::string why = selection_row_error(want, position, rules);
      if (!why.empty()) why = "expected row invalid: " + why;
      if (why.empty()) {
        why = selection_row_error(have, position, rules);
        if (!why.empty()) why = "got row invalid: " + why;
      }
      if (why.empty() && want == have) {
        ++c.identical_rows;
        continue;
      }
      double gap = 0;
      if (!why.empty()) {
        ++c.invalid_rows;
      } else if (!scores.present()) {
        why = "rows differ and no scores were given to explain it";
      } else {
        const auto score = [&](int32_t b) {
          return scores.ptr<const float>()[scores.offset({h, t, b})];
        };
        why =
            unexplained_exchange(want, have, score, position, rules, ties, near_tie_relative, &gap);
      }
      if (why.empty()) {
        ++c.near_tie_rows;
        c.largest_near_tie_gap = std::max(c.largest_near_tie_gap, gap);
      } else if (c.mismatched_rows++ == 0) {
        c.first_mismatch = detail::concat("head ", h, " token ", t, ": expected ", text(want),
                                          ", got ", text(have), " (", why, ")");
      }
    }
  return c;
}

TopkComparison compare_topk(const TensorView& expected, const TensorView& got,
                            const TensorView& scores, ExactTies ties, double near_tie_relative) {
  return compare_topk(expected, got, scores, SelectionRules{}, ties, near_tie_relative);
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
        if (!std::isfinite(want) || !std::isfinite(have)) {
          // Non-finite on either side must be matched by the same non-finite value: NaN against
          // inf, or +inf against -inf, is a mismatch.
          if (!(want == have || (std::isnan(want) && std::isnan(have)))) ++c.nonfinite_mismatches;
          continue;
        }
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
  out << ", " << c.mismatched_rows << " mismatched (" << c.invalid_rows << " invalid)";
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
