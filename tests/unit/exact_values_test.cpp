// Selections on data that is exact in both bf16 and e4m3: every key of logical block b equals
// value(b), index-Q is 1, so every score is 128 * value(b) with no rounding anywhere. bf16 and fp8
// caches must then select the same blocks, and those must be the ones worked out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "support/e4m3_data.h"
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

// The premises of the GPU scorers' e4m3 exactness tests (support/e4m3_data.h), on the host.
BatchSpec adversarial_e4m3_spec() {
  BatchSpec spec;
  spec.q_lens = {1, 1, 32};
  spec.seq_lens = {3000, 2200, 2500};
  spec.num_decode = 2;
  spec.index_heads = 2;
  spec.index_dtype = DType::fp8_e4m3;
  spec.seed = 13;
  return spec;
}
MsaConfig adversarial_e4m3_config() {
  MsaConfig config;
  config.num_index_heads = 2, config.top_k = 8, config.local_blocks = 1, config.init_blocks = 0;
  return config;
}

// Every sum of both data sets is exact: the CPU backend (fp32 sums) scores and selects bit for bit
// as the reference (float64 sums, rounded once).
TEST(E4m3AdversarialData, EverySumIsExact) {
  const MsaConfig config = adversarial_e4m3_config();
  for (const bool dropped : {true, false}) {
    SCOPED_TRACE(dropped ? "dropped products" : "extremes");
    SyntheticBatch sb(adversarial_e4m3_spec());
    M3SA_ASSERT_OK(sb.status());
    if (dropped)
      fill_dropped_products(sb);
    else
      fill_e4m3_extremes(sb, sb.spec().seed);
    HostTensor scores[2], topk[2];
    const Backend backends[2] = {Backend::cpu, Backend::reference};
    for (int i = 0; i < 2; ++i) {
      M3SA_ASSERT_OK(run_score_blocks(config, sb, {backends[i]}, &scores[i]));
      M3SA_ASSERT_OK(run_index_topk(config, sb, {backends[i]}, &topk[i]));
    }
    EXPECT_TRUE(same_bytes(scores[0], scores[1]));
    EXPECT_TRUE(same_bytes(topk[0], topk[1]));
  }
}

// The extremes reach both ends of e4m3: +-448 (a product of two past fp16's 65,504) and the
// smallest subnormal 2^-9, in the queries and in the keys.
TEST(E4m3AdversarialData, ExtremesReachBothEndsOfE4m3) {
  SyntheticBatch sb(adversarial_e4m3_spec());
  M3SA_ASSERT_OK(sb.status());
  fill_e4m3_extremes(sb, sb.spec().seed);
  for (const HostTensor* t : {&sb.index_q, &sb.index_k_cache}) {
    float largest = 0.f, smallest = INFINITY;
    for (int64_t i = 0; i < t->view().numel(); ++i) {
      const float v = std::fabs(load(DType::fp8_e4m3, t->view().data, i));
      largest = std::max(largest, v);
      if (v > 0.f) smallest = std::min(smallest, v);
    }
    EXPECT_EQ(largest, 448.f);
    EXPECT_EQ(smallest, 0x1p-9f);
  }
}

// Dropped products tell an exact sum from an aligned-and-truncated one: exactly, every even block
// (259.75) outranks every odd one (258.75); a sum that drops the small products scores the even
// blocks 256 and selects odd ones first. Every token here has more even blocks before its own than
// the top_k - 1 free slots, so its exact selection is its own block and even blocks only.
TEST(E4m3AdversarialData, DroppedProductsSelectOnlyEvenBlocks) {
  const MsaConfig config = adversarial_e4m3_config();
  SyntheticBatch sb(adversarial_e4m3_spec());
  M3SA_ASSERT_OK(sb.status());
  fill_dropped_products(sb);
  HostTensor topk;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &topk));
  for (int64_t t = 0; t < sb.num_tokens(); ++t) {
    const int64_t own = sb.position(t) / 128;
    ASSERT_GE((own + 1) / 2, config.top_k) << "token " << t << ": too few even blocks";
    for (int h = 0; h < config.num_index_heads; ++h)
      for (const int32_t b : topk_row(topk, h, t))
        EXPECT_TRUE(b == own || b % 2 == 0) << "token " << t << " head " << h << " block " << b;
  }
}

} // namespace
} // namespace m3sa::testing
