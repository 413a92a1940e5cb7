// Hand-worked indexer cases (contract §4, §5) on the reference and the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

class Selection : public ::testing::TestWithParam<Backend> {
protected:
  Backend backend() const { return GetParam(); }

  // index_topk over a batch whose block b scores 128 * value[b] for every head.
  HostTensor select_with_values(const BatchSpec& spec, const MsaConfig& config,
                                const std::vector<float>& value) {
    SyntheticBatch sb(spec);
    fill_block_constants(sb, value);
    HostTensor topk;
    const Status s = run_index_topk(config, sb, {backend()}, &topk);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return topk;
  }

  Status insert_rows(const HostTensor& rows, const HostTensor& slots, const HostTensor& cache) {
    PlanRequest request;
    request.op = OpKind::insert_index_k;
    request.backend = backend();
    request.cache_dtype = cache.view().dtype;
    request.capacities = {1, rows.view().shape[0], 1};
    PlannedOp planned(request);
    if (!planned.status.ok()) return planned.status;
    return insert_index_k(planned.plan, {rows.view(), slots.view(), cache.view()},
                          planned.workspace());
  }

  // select_topk_blocks for one decode token at `position` whose head h scores scores[h][b].
  HostTensor select_from_scores(int64_t position, const MsaConfig& config,
                                const std::vector<std::vector<float>>& scores) {
    BatchSpec spec{{1}, {static_cast<int32_t>(position + 1)}, 1, 1, config.num_index_heads};
    SyntheticBatch sb(spec);
    HostTensor in(DType::f32, {config.num_index_heads, 1, sb.width()});
    for (int h = 0; h < config.num_index_heads; ++h)
      for (int b = 0; b < sb.width(); ++b)
        in.data<float>()[h * sb.width() + b] =
            b < static_cast<int>(scores[h].size()) ? scores[h][b] : -kInf;
    HostTensor topk;
    const Status s = run_select_topk_blocks(config, sb, in, {backend()}, &topk);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return topk;
  }
};

MsaConfig config_with(int k, int local, int init, int heads = 1) {
  MsaConfig c;
  c.top_k = k;
  c.local_blocks = local;
  c.init_blocks = init;
  c.num_index_heads = heads;
  return c;
}

std::vector<float> ascending_values(int n) {
  std::vector<float> v(n);
  for (int b = 0; b < n; ++b) v[b] = static_cast<float>(b + 1);
  return v;
}

TEST_P(Selection, ShortAndBoundaryLengths) {
  std::vector<float> value = ascending_values(17);
  value[3] = -5; // the one block a 17-block row drops
  const MsaConfig config = config_with(16, 1, 0);
  const HostTensor topk =
      select_with_values({{1, 1, 1, 1, 1}, {1, 127, 128, 129, 2049}, 5, 1, 1}, config, value);
  EXPECT_EQ(topk_row(topk, 0, 0), padded({0}, 16));
  EXPECT_EQ(topk_row(topk, 0, 1), padded({0}, 16));
  EXPECT_EQ(topk_row(topk, 0, 2), padded({0}, 16));
  EXPECT_EQ(topk_row(topk, 0, 3), padded({0, 1}, 16));
  EXPECT_EQ(topk_row(topk, 0, 4),
            (std::vector<int32_t>{0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
}

TEST_P(Selection, AllBlocksWhenNoMoreThanK) {
  const HostTensor topk = select_with_values({{1, 1}, {2048, 1000}, 2, 1, 1}, config_with(16, 1, 0),
                                             ascending_values(16));
  EXPECT_EQ(topk_row(topk, 0, 0),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(topk_row(topk, 0, 1), padded({0, 1, 2, 3, 4, 5, 6, 7}, 16));
}

TEST_P(Selection, PaddingRowsSelectNothingAndScoreMinusInfinity) {
  BatchSpec spec{{1, 1, 1}, {0, 300, 0}, 3, 1, 2};
  SyntheticBatch sb(spec);
  sb.fill_index_integers(3, -3, 3);
  const MsaConfig config = config_with(16, 1, 0, 2);
  HostTensor topk, scores;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {backend()}, &topk));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {backend()}, &scores));
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(topk_row(topk, h, 0), padded({}, 16));
    EXPECT_EQ(topk_row(topk, h, 1), padded({0, 1, 2}, 16));
    EXPECT_EQ(topk_row(topk, h, 2), padded({}, 16));
    for (int t : {0, 2})
      for (int b = 0; b < sb.width(); ++b)
        EXPECT_EQ(scores.data<float>()[(h * 3 + t) * sb.width() + b], -kInf);
  }
}

TEST_P(Selection, ShuffledBlockTablesDoNotChangeSelections) {
  const auto run = [](bool shuffled, Backend backend, HostTensor* topk) {
    BatchSpec spec{{1, 1, 5}, {5000, 9000, 7005}, 2, 1, 4};
    spec.shuffle_pages = shuffled;
    spec.extra_columns = 3;
    SyntheticBatch sb(spec);
    sb.fill_index_integers(test_seed(), -4, 4);
    return run_index_topk(config_with(16, 1, 0, 4), sb, {backend}, topk);
  };
  HostTensor results[2], reference;
  for (int shuffled = 0; shuffled < 2; ++shuffled)
    M3SA_ASSERT_OK(run(shuffled == 1, backend(), &results[shuffled]));
  // Integer data, exact scores: the reference on the unshuffled table is the oracle for both.
  M3SA_ASSERT_OK(run(false, Backend::reference, &reference));
  for (const HostTensor& result : results)
    EXPECT_EQ(std::memcmp(reference.data<int32_t>(), result.data<int32_t>(), reference.bytes()), 0)
        << "seed " << test_seed();
}

TEST_P(Selection, CausalMaskInsideTheOwnBlock) {
  // A 10-token prefill chunk starting at block 20. Key 20 * 128 is weak, the later keys of block 20
  // are huge: the first token may only see the weak one, so with no forced local block it must
  // drop block 20, while the second token sees a huge key and must take it.
  BatchSpec spec{{10}, {20 * 128 + 10}, 0, 1, 1};
  SyntheticBatch sb(spec);
  const std::vector<float> value = ascending_values(20);
  sb.fill_index(
      [&](int, int64_t j, int) {
        return j >= 20 * 128 ? (j == 20 * 128 ? -1.f : 1000.f) : value[j / kBlockTokens];
      },
      [](int64_t, int, int) { return 1.f; });
  HostTensor topk;
  M3SA_ASSERT_OK(run_index_topk(config_with(16, 0, 0), sb, {backend()}, &topk));
  EXPECT_EQ(topk_row(topk, 0, 0),
            (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(topk_row(topk, 0, 1),
            (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}));
}

TEST_P(Selection, MtpDecodeQueryLengths2To16) {
  std::vector<float> value(40);
  for (int b = 0; b < 40; ++b) value[b] = static_cast<float>((b * 7) % 40); // distinct, scattered
  for (int q_len = 2; q_len <= 16; ++q_len) {
    BatchSpec spec{{q_len, q_len, q_len}, {3000 + q_len, 2048 + q_len - 1, 4100}, 3, q_len, 2};
    SyntheticBatch sb(spec);
    fill_block_constants(sb, value);
    HostTensor topk;
    M3SA_ASSERT_OK(run_index_topk(config_with(16, 1, 0, 2), sb, {backend()}, &topk));
    for (int64_t t = 0; t < sb.num_tokens(); ++t)
      for (int h = 0; h < 2; ++h)
        ASSERT_EQ(topk_row(topk, h, t), expected_ids(sb.position(t), 16, 1, 0, value))
            << "q_len " << q_len << " token " << t;
  }
}

TEST_P(Selection, MixedDecodeAndPrefillBatch) {
  std::vector<float> value(64);
  for (int b = 0; b < 64; ++b) value[b] = static_cast<float>((b * 13) % 64) - 20;
  BatchSpec spec{{2, 2, 300, 1}, {4000, 2100, 2300, 7}, 2, 2, 3};
  SyntheticBatch sb(spec);
  fill_block_constants(sb, value);
  HostTensor topk;
  M3SA_ASSERT_OK(run_index_topk(config_with(16, 1, 0, 3), sb, {backend()}, &topk));
  for (int64_t t = 0; t < sb.num_tokens(); ++t)
    for (int h = 0; h < 3; ++h)
      ASSERT_EQ(topk_row(topk, h, t), expected_ids(sb.position(t), 16, 1, 0, value))
          << "token " << t;
}

TEST_P(Selection, TiesGoToTheLowerBlockId) {
  std::vector<float> value(40, 2.f); // every block ties
  value[30] = 3.f;
  const HostTensor topk =
      select_with_values({{1}, {40 * 128}, 1, 1, 1}, config_with(16, 1, 0), value);
  EXPECT_EQ(topk_row(topk, 0, 0),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 30, 39}));
}

TEST_P(Selection, NanRanksLastAndInfinitiesOrderAsNumbers) {
  // 20 causal blocks, K = 8, local = 1: block 19 forced; 7 best of blocks 0..18.
  std::vector<float> s(20, kNan);
  s[0] = -kInf, s[1] = 5, s[2] = kInf, s[3] = -kInf, s[4] = 5, s[5] = -0.f, s[6] = 0.f, s[7] = -1,
  s[8] = 1e30f;
  const HostTensor topk = select_from_scores(19 * 128, config_with(8, 1, 0), {s});
  EXPECT_EQ(topk_row(topk, 0, 0), (std::vector<int32_t>{1, 2, 4, 5, 6, 7, 8, 19}));
  // With fewer numbers than slots, -inf blocks come before NaN ones, lower id first.
  std::vector<float> t(20, kNan);
  t[10] = -kInf, t[3] = -kInf, t[12] = 1;
  const HostTensor topk2 = select_from_scores(19 * 128, config_with(8, 1, 0), {t});
  EXPECT_EQ(topk_row(topk2, 0, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 10, 12, 19}));
}

TEST_P(Selection, TopKOf1And8And16And32) {
  std::vector<float> value(50);
  for (int b = 0; b < 50; ++b) value[b] = static_cast<float>((b * 17) % 50);
  for (int k : {1, 8, 16, 32})
    for (int local : {0, 1}) {
      BatchSpec spec{{1, 3}, {50 * 128, 45 * 128}, 1, 1, 1};
      SyntheticBatch sb(spec);
      fill_block_constants(sb, value);
      HostTensor topk;
      M3SA_ASSERT_OK(run_index_topk(config_with(k, local, 0), sb, {backend()}, &topk));
      for (int64_t t = 0; t < sb.num_tokens(); ++t)
        ASSERT_EQ(topk_row(topk, 0, t), expected_ids(sb.position(t), k, local, 0, value))
            << "K " << k << " local " << local;
    }
  const HostTensor one =
      select_with_values({{1}, {50 * 128}, 1, 1, 1}, config_with(1, 1, 0), value);
  EXPECT_EQ(topk_row(one, 0, 0), std::vector<int32_t>{49});
}

TEST_P(Selection, LocalAndInitCombinations) {
  std::vector<float> value(40);
  for (int b = 0; b < 40; ++b) value[b] = static_cast<float>((b * 11) % 40);
  for (auto [local, init] : {std::pair{0, 0}, {1, 0}, {0, 1}, {2, 2}, {3, 1}, {8, 8}, {0, 16}}) {
    BatchSpec spec{{1, 2}, {40 * 128, 30 * 128 + 2}, 1, 1, 1};
    SyntheticBatch sb(spec);
    fill_block_constants(sb, value);
    HostTensor topk;
    M3SA_ASSERT_OK(run_index_topk(config_with(16, local, init), sb, {backend()}, &topk));
    for (int64_t t = 0; t < sb.num_tokens(); ++t)
      ASSERT_EQ(topk_row(topk, 0, t), expected_ids(sb.position(t), 16, local, init, value))
          << "local " << local << " init " << init;
  }
  // Hand-worked: 40 blocks, init 2, local 2, K 6: blocks 0, 1, 38, 39 forced, two best of 2..37.
  std::vector<float> s(40, 0.f);
  s[5] = 9, s[20] = 7, s[21] = 7, s[0] = 100;
  const HostTensor topk = select_from_scores(39 * 128, config_with(6, 2, 2), {s});
  EXPECT_EQ(topk_row(topk, 0, 0), (std::vector<int32_t>{0, 1, 5, 20, 38, 39}));
}

TEST_P(Selection, SelectTopkBlocksRanksTheLastCausalBlockWhenNoneIsForced) {
  // 10 causal blocks, K = 2, no local or init block: the last causal block is a candidate like any
  // other, and here the best; the two heads differ in which block comes second.
  std::vector<float> h0(10, 1.f), h1(10, 1.f);
  h0[9] = 5, h0[4] = 3, h1[9] = 2, h1[0] = 7;
  const HostTensor topk = select_from_scores(9 * 128, config_with(2, 0, 0, 2), {h0, h1});
  EXPECT_EQ(topk_row(topk, 0, 0), (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(topk_row(topk, 1, 0), (std::vector<int32_t>{0, 9}));
}

TEST_P(Selection, MillionTokenRows) {
  // 8192 blocks (1M tokens), one decode token and one index head: 15 scattered strong blocks win.
  std::vector<float> value(8192, 1.f);
  const int strong[15] = {3,    77,   500,  1023, 2048, 3000, 4095, 4096,
                          5000, 6001, 7000, 7777, 8000, 8100, 8190};
  for (int i = 0; i < 15; ++i) value[strong[i]] = static_cast<float>(20 + i);
  const HostTensor topk =
      select_with_values({{1}, {8192 * 128}, 1, 1, 1}, config_with(16, 1, 0), value);
  std::vector<int32_t> want(strong, strong + 15);
  want.push_back(8191);
  EXPECT_EQ(topk_row(topk, 0, 0), want);
  // The same row through select_topk_blocks with scores given directly, K = 32.
  std::vector<float> s(8192);
  for (int b = 0; b < 8192; ++b) s[b] = static_cast<float>((b * 2654435761u) % 100000);
  const HostTensor selected = select_from_scores(8192 * 128 - 1, config_with(32, 1, 0), {s});
  EXPECT_EQ(topk_row(selected, 0, 0), expected_ids(8192 * 128 - 1, 32, 1, 0, s));
}

TEST_P(Selection, ReduceHeadsSelectsOnceFromTheMaxOverHeads) {
  std::vector<float> h0(20, 0.f), h1(20, 0.f);
  h0[2] = 10, h0[4] = 9, h1[7] = 9.5f, h1[9] = 8, h0[11] = kNan,
  h1[11] = 1; // NaN ignored next to a number
  MsaConfig config = config_with(5, 1, 0, 2);
  const HostTensor per_head = select_from_scores(19 * 128, config, {h0, h1});
  EXPECT_EQ(topk_row(per_head, 0, 0), (std::vector<int32_t>{0, 1, 2, 4, 19}));
  EXPECT_EQ(topk_row(per_head, 1, 0), (std::vector<int32_t>{0, 7, 9, 11, 19}));
  config.reduce_heads = true;
  const HostTensor reduced = select_from_scores(19 * 128, config, {h0, h1});
  EXPECT_EQ(topk_row(reduced, 0, 0), (std::vector<int32_t>{2, 4, 7, 9, 19}));
  EXPECT_EQ(topk_row(reduced, 1, 0), topk_row(reduced, 0, 0));
}

TEST_P(Selection, ScoreBlocksExportsScaledMaxAndMinusInfinityBeyondCausalBlocks) {
  BatchSpec spec{{1, 2}, {300, 129}, 1, 1, 1};
  spec.extra_columns = 2;
  SyntheticBatch sb(spec);
  // Key j of request r holds (j % 128) - 64 in dim 0, zero elsewhere; q = 1 in dim 0 only.
  sb.fill_index(
      [](int, int64_t j, int d) { return d == 0 ? static_cast<float>(j % 128) - 64 : 0.f; },
      [](int64_t, int, int d) { return d == 0 ? 1.f : 0.f; });
  MsaConfig config = config_with(16, 1, 0);
  config.score_scale = 0.5f;
  HostTensor scores;
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {backend()}, &scores));
  const int w = sb.width();
  const float* s = scores.data<float>();
  // Token 0: position 299 -> blocks 0, 1 full (max 63), block 2 keys 256..299 (max 299-256-64 =
  // -21).
  EXPECT_EQ(s[0 * w + 0], 31.5f);
  EXPECT_EQ(s[0 * w + 1], 31.5f);
  EXPECT_EQ(s[0 * w + 2], -10.5f);
  for (int b = 3; b < w; ++b) EXPECT_EQ(s[0 * w + b], -kInf);
  // Token 1: position 127 -> block 0 only, whole; token 2: position 128 -> block 1 holds key 128
  // only.
  EXPECT_EQ(s[1 * w + 0], 31.5f);
  EXPECT_EQ(s[1 * w + 1], -kInf);
  EXPECT_EQ(s[2 * w + 1], -32.f);
}

TEST_P(Selection, ScoreBlocksWritesMinusInfinityInColumnsPastTheBlockTable) {
  // Scores may be wider than the block table (N >= its width): the columns past it are past every
  // row's causal blocks, so -inf (contract §4), and the others as with N = the width.
  BatchSpec spec{{1, 2}, {300, 129}, 1, 1, 2};
  SyntheticBatch sb(spec);
  sb.fill_index_integers(test_seed(), -3, 3);
  const MsaConfig config = config_with(16, 1, 0, 2);
  HostTensor narrow;
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {backend()}, &narrow));
  const int64_t w = sb.width(), wide = w + 3, tokens = sb.num_tokens();
  HostTensor scores(DType::f32, {2, tokens, wide});
  for (int64_t i = 0; i < scores.view().numel(); ++i) scores.data<float>()[i] = kNan;
  PlannedOp planned(plan_request(OpKind::score_blocks, config, sb, {backend()}));
  M3SA_ASSERT_OK(planned.status);
  M3SA_ASSERT_OK(score_blocks(
      planned.plan, {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), scores.view()},
      planned.workspace()));
  for (int64_t row = 0; row < 2 * tokens; ++row)
    for (int64_t b = 0; b < wide; ++b) {
      const float got = scores.data<float>()[row * wide + b];
      if (b < w)
        EXPECT_EQ(got, narrow.data<float>()[row * w + b]) << "row " << row << " column " << b;
      else
        EXPECT_EQ(got, -kInf) << "row " << row << " column " << b;
    }
}

TEST_P(Selection, InsertIndexKRoundsOnceAndSkipsPaddingSlots) {
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    HostTensor cache(dtype, {3, kBlockTokens, kHeadDim});
    cache.fill_bytes(0x11); // sentinel
    HostTensor rows(DType::f32, {3, kHeadDim});
    for (int i = 0; i < 3 * kHeadDim; ++i)
      rows.data<float>()[i] = 0.7f * static_cast<float>(i % 97) - 30.3f + (i == 5 ? 1e6f : 0.f);
    HostTensor slots(DType::i64, {3});
    slots.data<int64_t>()[0] = 2 * 128 + 5, slots.data<int64_t>()[1] = -1,
    slots.data<int64_t>()[2] = 7;
    M3SA_ASSERT_OK(insert_rows(rows, slots, cache));
    const size_t elem = dtype_size(dtype);
    const auto* bytes = cache.data<uint8_t>();
    for (int64_t i = 0; i < cache.view().numel(); ++i) {
      const int64_t slot = i / kHeadDim, d = i % kHeadDim;
      const int row = slot == 2 * 128 + 5 ? 0 : (slot == 7 ? 2 : -1);
      if (row < 0) {
        for (size_t b = 0; b < elem; ++b)
          ASSERT_EQ(bytes[i * elem + b], 0x11) << "slot " << slot << " written";
        continue;
      }
      const float x = rows.data<float>()[row * kHeadDim + d];
      if (dtype == DType::bf16)
        ASSERT_EQ(cache.data<uint16_t>()[i], float_to_bf16_bits(x));
      else
        ASSERT_EQ(cache.data<uint8_t>()[i], float_to_e4m3_bits(x));
    }
    if (dtype == DType::fp8_e4m3) {
      EXPECT_EQ(cache.data<uint8_t>()[(2 * 128 + 5) * kHeadDim + 5], 0x7e); // 1e6 saturates
    }
  }
}

TEST_P(Selection, InsertIndexKWritesEveryLiveTokenUpToTheLast) {
  // 1 token (the last is the first), 130 tokens over two pages and 256 filling both, slots in
  // reverse order: the 256th token lands in slot 0, the first row of page 0.
  for (int64_t tokens : {1, 130, 256}) {
    HostTensor cache(DType::bf16, {2, kBlockTokens, kHeadDim});
    cache.fill_bytes(0x11);
    HostTensor rows(DType::f32, {tokens, kHeadDim}), slots(DType::i64, {tokens});
    for (int64_t i = 0; i < tokens * kHeadDim; ++i)
      rows.data<float>()[i] = static_cast<float>(i % 251) * 0.25f - 30.f;
    for (int64_t t = 0; t < tokens; ++t) slots.data<int64_t>()[t] = 2 * kBlockTokens - 1 - t;
    M3SA_ASSERT_OK(insert_rows(rows, slots, cache));
    for (int64_t t = 0; t < tokens; ++t)
      for (int d = 0; d < kHeadDim; ++d)
        ASSERT_EQ(cache.data<uint16_t>()[(2 * kBlockTokens - 1 - t) * kHeadDim + d],
                  float_to_bf16_bits(rows.data<float>()[t * kHeadDim + d]))
            << tokens << " tokens: token " << t << " dim " << d;
  }
}

TEST_P(Selection, NanKeysMakeTheirBlockScoreNanOnceVisible) {
  // Two tokens at positions 510 and 511 over 4 blocks of keys scoring 128 each. A NaN key as the
  // first of block 1 and the last of block 2 (both orders against a finite max) poisons those
  // blocks; the NaN key 511 in block 3 is visible to the second token only.
  BatchSpec spec{{2}, {4 * kBlockTokens}, 0, 1, 1};
  SyntheticBatch sb(spec);
  const auto nan_key = [](int64_t j) { return j == 128 || j == 2 * 128 + 127 || j == 511; };
  sb.fill_index(
      [&](int, int64_t j, int d) { return d == 3 && nan_key(j) ? kNan : 1.f; },
      [](int64_t, int, int) { return 1.f; });
  HostTensor scores;
  M3SA_ASSERT_OK(run_score_blocks(config_with(16, 1, 0), sb, {backend()}, &scores));
  const int w = sb.width();
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(scores.data<float>()[t * w + 0], 128.f) << "token " << t;
    EXPECT_TRUE(std::isnan(scores.data<float>()[t * w + 1])) << "token " << t;
    EXPECT_TRUE(std::isnan(scores.data<float>()[t * w + 2])) << "token " << t;
  }
  EXPECT_EQ(scores.data<float>()[0 * w + 3], 128.f);
  EXPECT_TRUE(std::isnan(scores.data<float>()[1 * w + 3]));
  // index_topk on the same data ranks the NaN blocks last: K = 2, local 1 leaves one slot.
  HostTensor topk;
  M3SA_ASSERT_OK(run_index_topk(config_with(2, 1, 0), sb, {backend()}, &topk));
  EXPECT_EQ(topk_row(topk, 0, 1), (std::vector<int32_t>{0, 3}));
}

TEST_P(Selection, ReduceHeadsNanLosesToANumberAndStaysNanOnlyWhenEveryHeadIsNan) {
  // 20 blocks, K = 5, local 1: four ranked slots. Block 11 is NaN on head 0 and 100 on head 1;
  // block 0 is NaN on both heads and so ranks below the -inf blocks 1 and 3.
  std::vector<float> h0(20, -kInf), h1(20, -kInf);
  h0[2] = 10, h0[11] = kNan, h1[11] = 100, h0[0] = kNan, h1[0] = kNan;
  MsaConfig config = config_with(5, 1, 0, 2);
  config.reduce_heads = true;
  const HostTensor reduced = select_from_scores(19 * 128, config, {h0, h1});
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(topk_row(reduced, h, 0), (std::vector<int32_t>{1, 2, 3, 11, 19})) << "head " << h;
}

TEST_P(Selection, MinusZeroTiesPlusZeroSoTheLowerIdWins) {
  // 10 blocks, K = 2, local 1: one ranked slot, contested by a -0 and a +0 block in both orders.
  for (const bool minus_first : {true, false}) {
    std::vector<float> s(10, -1.f);
    s[3] = minus_first ? -0.f : 0.f;
    s[6] = minus_first ? 0.f : -0.f;
    const HostTensor topk = select_from_scores(9 * 128, config_with(2, 1, 0), {s});
    EXPECT_EQ(topk_row(topk, 0, 0), (std::vector<int32_t>{3, 9})) << "-0 first: " << minus_first;
  }
}

// The layout tests' batch: two decode rows and a 40-token chunk after a 2,600-token prefix, two
// index heads, 4 / 2 attention heads; integer index data, so that every backend selects alike.
const BatchSpec kLayoutBatch{{1, 1, 40}, {3000, 129, 2600}, 2, 1, 2, DType::bf16, 4,
                             2,          DType::bf16};
void fill_layout_batch(SyntheticBatch& sb) {
  sb.fill_index_integers(test_seed(), -3, 3);
  sb.fill_attention_random(test_seed() + 1);
}

TEST_P(Selection, TokenMajorTopkViewHoldsTheSameSelectionsForIndexerAndAttention) {
  // Strides are free (contract §5): a [T, H, K] buffer seen as [H, T, K] by swapping strides.
  SyntheticBatch sb(kLayoutBatch);
  fill_layout_batch(sb);
  const MsaConfig config = config_with(8, 1, 0, 2);
  HostTensor head_major;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {backend()}, &head_major));
  HostTensor token_major(DType::i32, {sb.num_tokens(), 2, 8});
  token_major.fill_bytes(0x5a);
  TensorView view = token_major.view();
  std::swap(view.shape[0], view.shape[1]);
  std::swap(view.strides[0], view.strides[1]);
  PlannedOp indexer(plan_request(OpKind::index_topk, config, sb, {backend()}));
  M3SA_ASSERT_OK(indexer.status);
  M3SA_ASSERT_OK(index_topk(indexer.plan, {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(),
                                           view}, indexer.workspace()));
  for (int h = 0; h < 2; ++h)
    for (int64_t t = 0; t < sb.num_tokens(); ++t)
      for (int k = 0; k < 8; ++k)
        ASSERT_EQ(view.ptr<int32_t>()[view.offset({h, t, k})], topk_row(head_major, h, t)[k])
            << "head " << h << " token " << t << " slot " << k;
  // sparse_attention reads the token-major view as it reads the head-major buffer.
  HostTensor want_out, want_lse, out(DType::bf16, {sb.num_tokens(), 4, kHeadDim}),
      lse(DType::f32, {sb.num_tokens(), 4});
  M3SA_ASSERT_OK(run_sparse_attention(config, sb, head_major, {backend()}, &want_out, &want_lse));
  PlannedOp attention(plan_request(OpKind::sparse_attention, config, sb, {backend()}));
  M3SA_ASSERT_OK(attention.status);
  SparseAttentionArgs args = attention_args(sb, head_major, out, lse, true);
  args.topk = view;
  M3SA_ASSERT_OK(sparse_attention(attention.plan, args, attention.workspace()));
  EXPECT_EQ(std::memcmp(want_out.view().data, out.view().data, out.bytes()), 0);
  EXPECT_EQ(std::memcmp(want_lse.view().data, lse.view().data, lse.bytes()), 0);
}

// `v` (i32, rank 1) in every `gap`-th int32 of `buffer`, -7 between.
TensorView spread(const TensorView& v, int64_t gap, HostTensor* buffer) {
  buffer->reset(DType::i32, {v.shape[0] * gap});
  for (int64_t i = 0; i < v.shape[0] * gap; ++i) buffer->data<int32_t>()[i] = -7;
  TensorView out = v;
  out.data = buffer->view().data;
  out.strides[0] = gap;
  for (int64_t i = 0; i < v.shape[0]; ++i)
    out.ptr<int32_t>()[i * gap] = v.ptr<const int32_t>()[v.offset({i})];
  return out;
}

// `v` (i32, rank 2) stored column-major in `buffer`.
TensorView column_major(const TensorView& v, HostTensor* buffer) {
  buffer->reset(DType::i32, {v.shape[1], v.shape[0]});
  TensorView out = v;
  out.data = buffer->view().data;
  out.strides[0] = 1;
  out.strides[1] = v.shape[0];
  for (int64_t r = 0; r < v.shape[0]; ++r)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      out.ptr<int32_t>()[out.offset({r, b})] = v.ptr<const int32_t>()[v.offset({r, b})];
  return out;
}

// The batch metadata's strides are free as well (check_tensor asks cu_q_lens, seq_lens and the
// block tables for no contiguous rows): cu_q_lens and seq_lens in every other / third int32 of
// their buffers and both block tables column-major select and attend exactly as the packed batch.
TEST_P(Selection, StridedBatchMetadataReadsAsThePackedOne) {
  SyntheticBatch sb(kLayoutBatch);
  fill_layout_batch(sb);
  const MsaConfig config = config_with(8, 1, 0, 2);
  HostTensor want_topk, want_out, want_lse;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {backend()}, &want_topk));
  M3SA_ASSERT_OK(run_sparse_attention(config, sb, want_topk, {backend()}, &want_out, &want_lse));

  HostTensor cu_q_lens, seq_lens, block_table, kv_block_table;
  BatchMetadata strided = sb.batch();
  strided.cu_q_lens = spread(strided.cu_q_lens, 2, &cu_q_lens);
  strided.seq_lens = spread(strided.seq_lens, 3, &seq_lens);
  strided.block_table = column_major(strided.block_table, &block_table);
  ASSERT_GT(strided.block_table.shape[1], 1);

  HostTensor topk = HostTensor::shaped_like(want_topk.view());
  PlannedOp indexer(plan_request(OpKind::index_topk, config, sb, {backend()}));
  M3SA_ASSERT_OK(indexer.status);
  M3SA_ASSERT_OK(index_topk(indexer.plan,
                            {sb.index_q.view(), sb.index_k_cache.view(), strided, topk.view()},
                            indexer.workspace()));
  EXPECT_EQ(std::memcmp(want_topk.view().data, topk.view().data, topk.bytes()), 0);

  HostTensor out = HostTensor::shaped_like(want_out.view()),
             lse = HostTensor::shaped_like(want_lse.view());
  PlannedOp attention(plan_request(OpKind::sparse_attention, config, sb, {backend()}));
  M3SA_ASSERT_OK(attention.status);
  SparseAttentionArgs args = attention_args(sb, want_topk, out, lse, true);
  args.batch = strided;
  args.kv_block_table = column_major(args.kv_block_table, &kv_block_table);
  M3SA_ASSERT_OK(sparse_attention(attention.plan, args, attention.workspace()));
  EXPECT_EQ(std::memcmp(want_out.view().data, out.view().data, out.bytes()), 0);
  EXPECT_EQ(std::memcmp(want_lse.view().data, lse.view().data, lse.bytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, Selection, kHostBackends, backend_name);

} // namespace
} // namespace m3sa::testing
