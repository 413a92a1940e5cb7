#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "m3sa/m3sa.h"
#include "testing/compare.h"
#include "testing/host_tensor.h"
#include "testing/run_ops.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

inline std::vector<int32_t> topk_row(const HostTensor& topk, int64_t h, int64_t t) {
  const TensorView v = topk.view();
  std::vector<int32_t> row(v.shape[2]);
  for (int64_t k = 0; k < v.shape[2]; ++k) row[k] = v.ptr<const int32_t>()[v.offset({h, t, k})];
  return row;
}

// Ascending ids padded with -1 to K slots.
inline std::vector<int32_t> padded(std::vector<int32_t> ids, int k) {
  ids.resize(k, -1);
  return ids;
}

// The selection of a token at `position` when block b scores value[b]: worked out the plain way
// (sort by value descending, then id ascending), for data whose scores are exact.
inline std::vector<int32_t> expected_ids(int64_t position, int k, int local, int init,
                                         const std::vector<float>& value) {
  const int n = position < 0 ? 0 : static_cast<int>(position / kBlockTokens + 1);
  std::vector<int32_t> ids;
  if (n <= k) {
    for (int b = 0; b < n; ++b) ids.push_back(b);
    return padded(ids, k);
  }
  std::vector<int32_t> candidates;
  for (int b = init; b < n - local; ++b) candidates.push_back(b);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int a, int b) { return value[a] > value[b]; });
  ids.assign(candidates.begin(), candidates.begin() + (k - local - init));
  for (int b = 0; b < init; ++b) ids.push_back(b);
  for (int b = n - local; b < n; ++b) ids.push_back(b);
  std::sort(ids.begin(), ids.end());
  return padded(ids, k);
}

// Keys of block b all equal value[b], index-Q is 1: scores are 128 * value[b], exactly.
inline void fill_block_constants(SyntheticBatch& sb, const std::vector<float>& value) {
  sb.fill_index([&](int, int64_t j, int) { return value[j / kBlockTokens]; },
                [](int64_t, int, int) { return 1.f; });
}

inline std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return to_string(info.param);
}

// Every op of the public API (include/m3sa/ops.h's OpKind), for the tests that ask each one.
inline constexpr OpKind kEveryOp[] = {OpKind::insert_index_k,     OpKind::score_blocks,
                                      OpKind::select_topk_blocks, OpKind::index_topk,
                                      OpKind::sparse_attention,   OpKind::norm_rope_insert};

// Backends every CPU-side semantic test runs on.
inline const auto kHostBackends = ::testing::Values(Backend::reference, Backend::cpu);

// GTEST_SKIP returns from the enclosing function, so this is a macro used in the test body.
#define M3SA_SKIP_WITHOUT_CUDA()                                                                   \
  do {                                                                                             \
    if (!::m3sa::cuda_backend_built()) GTEST_SKIP() << "m3sa was built without the CUDA backend";  \
    if (::m3sa::cuda_device_count() == 0)                                                          \
      GTEST_SKIP() << "no CUDA device visible (no driver or no device)";                           \
  } while (0)

#define M3SA_ASSERT_OK(expr)                                                                       \
  do {                                                                                             \
    const ::m3sa::Status m3sa_test_status_ = (expr);                                               \
    ASSERT_TRUE(m3sa_test_status_.ok()) << m3sa_test_status_.to_string();                          \
  } while (0)

#define M3SA_EXPECT_OK(expr)                                                                       \
  do {                                                                                             \
    const ::m3sa::Status m3sa_test_status_ = (expr);                                               \
    EXPECT_TRUE(m3sa_test_status_.ok()) << m3sa_test_status_.to_string();                          \
  } while (0)

} // namespace m3sa::testing
