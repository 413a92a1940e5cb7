// Selections on data that is exact in both bf16 and e4m3: every key of logical block b equals
// value(b), index-Q is 1, so every score is 128 * value(b) with no rounding anywhere. bf16 and fp8
// caches must then select the same blocks, and those must be the ones worked out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

std::vector<float> exact_values() {
  std::vector<float> v;
  for (int x = 1; x <= 16; ++x) v.push_back(static_cast<float>(x));
  for (int x = 18; x <= 32; x += 2) v.push_back(static_cast<float>(x));
  for (int x = 36; x <= 64; x += 4) v.push_back(static_cast<float>(x));
  for (int x = 72; x <= 128; x += 8) v.push_back(static_cast<float>(x));
  return v;
}

// value(b) for b < 40: the exact values in a seeded order, so the best blocks are scattered.
std::vector<float> block_values(uint64_t seed) {
  std::vector<float> values = exact_values();
  Rng rng(seed);
  for (int i = static_cast<int>(values.size()) - 1; i > 0; --i)
    std::swap(values[i], values[rng.uniform_int(0, i)]);
  return values;
}

void check_case(Backend backend, BatchSpec spec) {
  const std::vector<float> value = block_values(spec.seed);
  for (int local : {0, 1}) {
    MsaConfig config;
    config.local_blocks = local;
    config.init_blocks = 0;
    config.num_index_heads = spec.index_heads;
    HostTensor selections[2];
    for (int i = 0; i < 2; ++i) {
      spec.index_dtype = i == 0 ? DType::bf16 : DType::fp8_e4m3;
      SyntheticBatch sb(spec);
      fill_block_constants(sb, value);
      M3SA_ASSERT_OK(run_index_topk(config, sb, {backend}, &selections[i]));
      for (int64_t t = 0; t < sb.num_tokens(); ++t)
        for (int h = 0; h < spec.index_heads; ++h)
          ASSERT_EQ(topk_row(selections[i], h, t),
                    expected_ids(sb.position(t), config.top_k, local, 0, value))
              << to_string(spec.index_dtype) << " local " << local << " token " << t << " head "
              << h;
    }
    ASSERT_EQ(std::memcmp(selections[0].data<int32_t>(), selections[1].data<int32_t>(),
                          selections[0].bytes()),
              0);
  }
}

class ExactValues : public ::testing::TestWithParam<Backend> {};

TEST_P(ExactValues, PrefillChunksAfterPrefixes) {
  BatchSpec spec;
  spec.q_lens = {4, 3};
  spec.seq_lens = {2048 + 4, 2560 + 3};
  spec.seed = 11;
  check_case(GetParam(), spec);
}

TEST_P(ExactValues, DecodeRequests) {
  BatchSpec spec;
  spec.q_lens = {1, 1, 1};
  spec.seq_lens = {2049, 3000, 4096};
  spec.num_decode = 3;
  spec.seed = 12;
  check_case(GetParam(), spec);
}

INSTANTIATE_TEST_SUITE_P(Backends, ExactValues, kHostBackends, backend_name);

} // namespace
} // namespace m3sa::testing
