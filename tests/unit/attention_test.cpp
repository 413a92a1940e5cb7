// Sparse attention (contract §6) against a dense masked softmax written here, independently of the
// library: every cached key is considered, and the mask keeps only the selected blocks' keys at or
// before the query position.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

struct Dense {
  HostTensor out, lse;
};

float kv_value(const SyntheticBatch& sb, const HostTensor& cache, int r, int64_t j, int g, int d,
               float scale) {
  const int64_t page = sb.kv_block_table.data<int32_t>()[r * sb.width() + j / kBlockTokens];
  const int64_t i =
      ((page * kBlockTokens + j % kBlockTokens) * sb.spec().kv_heads + g) * kHeadDim + d;
  return load(sb.spec().kv_dtype, cache.view().data, i) * scale;
}

Dense dense_masked_attention(const SyntheticBatch& sb, const HostTensor& topk, float k_scale,
                             float v_scale) {
  const int hq = sb.spec().q_heads, hkv = sb.spec().kv_heads, group = hq / hkv,
            k = static_cast<int>(topk.view().shape[2]);
  Dense d;
  d.out.reset(DType::bf16, {sb.num_tokens(), hq, kHeadDim});
  d.lse.reset(DType::f32, {sb.num_tokens(), hq});
  for (int64_t t = 0; t < sb.num_tokens(); ++t) {
    const int r = sb.request_of(t);
    const int64_t p = sb.position(t), seq_len = sb.spec().seq_lens[r];
    for (int qh = 0; qh < hq; ++qh) {
      const int g = qh / group;
      std::vector<double> logit(seq_len, -INFINITY);
      for (int64_t j = 0; j < seq_len; ++j) {
        bool selected = false;
        for (int s = 0; s < k; ++s)
          selected |= topk.data<int32_t>()[(g * sb.num_tokens() + t) * k + s] == j / kBlockTokens;
        if (!selected || j > p) continue;
        double dot = 0;
        for (int i = 0; i < kHeadDim; ++i)
          dot += static_cast<double>(
                     load(DType::bf16, sb.q.view().data, (t * hq + qh) * kHeadDim + i)) *
                 kv_value(sb, sb.k_cache, r, j, g, i, k_scale);
        logit[j] = dot / std::sqrt(128.0);
      }
      double m = -INFINITY;
      for (double x : logit) m = std::max(m, x);
      double sum = 0;
      for (double x : logit) sum += std::isinf(x) ? 0 : std::exp(x - m);
      for (int i = 0; i < kHeadDim; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < seq_len; ++j)
          if (!std::isinf(logit[j]))
            acc += std::exp(logit[j] - m) * kv_value(sb, sb.v_cache, r, j, g, i, v_scale);
        store(DType::bf16, d.out.view().data, (t * hq + qh) * kHeadDim + i,
              sum > 0 ? static_cast<float>(acc / sum) : 0.f);
      }
      d.lse.data<float>()[t * hq + qh] =
          sum > 0 ? static_cast<float>(m + std::log(sum)) : -INFINITY;
    }
  }
  return d;
}

// Random valid selections: ascending causal block ids, sometimes without the own block, some rows
// empty.
HostTensor random_selections(const SyntheticBatch& sb, int heads, int k, uint64_t seed) {
  Rng rng(seed);
  HostTensor topk(DType::i32, {heads, sb.num_tokens(), k});
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < sb.num_tokens(); ++t) {
      const int64_t n = sb.position(t) < 0 ? 0 : sb.position(t) / kBlockTokens + 1;
      int slot = 0;
      const bool empty_row = rng.uniform() < 0.05;
      for (int64_t b = 0; b < n && slot < k && !empty_row; ++b)
        if (b == n - 1 ? rng.uniform() < 0.8 : rng.uniform() < 0.5)
          topk.data<int32_t>()[(h * sb.num_tokens() + t) * k + slot++] = static_cast<int32_t>(b);
      for (; slot < k; ++slot) topk.data<int32_t>()[(h * sb.num_tokens() + t) * k + slot] = -1;
    }
  return topk;
}

class Attention : public ::testing::TestWithParam<Backend> {
protected:
  void check(BatchSpec spec, MsaConfig config, float k_scale, float v_scale, bool use_kv_table) {
    const uint64_t seed = test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    spec.seed = seed;
    SyntheticBatch sb(spec);
    sb.fill_attention_random(seed + 1);
    const HostTensor topk = random_selections(sb, spec.kv_heads, config.top_k, seed + 2);
    const Dense dense = dense_masked_attention(sb, topk, k_scale, v_scale);
    PlannedOp planned(plan_request(OpKind::sparse_attention, config, sb, {GetParam()}));
    M3SA_ASSERT_OK(planned.status);
    HostTensor out(DType::bf16, {sb.num_tokens(), spec.q_heads, kHeadDim}),
        lse(DType::f32, {sb.num_tokens(), spec.q_heads});
    out.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    SparseAttentionArgs args = attention_args(sb, topk, out, lse, use_kv_table);
    args.k_scale = k_scale;
    args.v_scale = v_scale;
    M3SA_ASSERT_OK(sparse_attention(planned.plan, args, planned.workspace()));
    const AttentionComparison c =
        compare_attention(dense.out.view(), out.view(), dense.lse.view(), lse.view());
    EXPECT_TRUE(c.ok(GetParam() == Backend::reference ? 1e-6 : 1e-3)) << describe(c);
    EXPECT_LE(c.max_lse_error, 1e-5) << describe(c);
    for (int64_t i = 0; i < out.view().numel(); ++i)
      ASSERT_FALSE(std::isnan(load(DType::bf16, out.view().data, i))) << i;
  }
};

MsaConfig attention_config(int heads, int k) {
  MsaConfig c;
  c.num_index_heads = heads;
  c.top_k = k;
  return c;
}

TEST_P(Attention, MixedBatchBf16WithSeparateKvTable) {
  check({{1, 1, 200}, {1500, 40, 700}, 2, 1, 2, DType::bf16, 8, 2, DType::bf16},
        attention_config(2, 4), 1.f, 1.f, true);
}

TEST_P(Attention, MtpDecodeFp8CacheWithScales) {
  check({{3, 3}, {900, 3}, 2, 3, 1, DType::bf16, 16, 1, DType::fp8_e4m3}, attention_config(1, 8),
        0.5f, 2.f, true);
}

TEST_P(Attention, SharedBlockTableAndPaddingRows) {
  BatchSpec spec{{1, 1, 1}, {0, 333, 0}, 3, 1, 4, DType::bf16, 4, 4, DType::bf16};
  spec.separate_kv_table = false;
  check(spec, attention_config(4, 16), 1.f, 1.f, false);
}

TEST_P(Attention, PrefillChunksWithPaddingRequests) {
  check({{5, 6, 3, 11}, {0, 300, 0, 2000}, 0, 1, 1, DType::bf16, 16, 1, DType::bf16},
        attention_config(1, 16), 1.f, 1.f, true);
}

TEST_P(Attention, RowsWithoutKeysGiveZerosAndMinusInfinity) {
  BatchSpec spec{{1, 2}, {0, 300}, 1, 1, 1, DType::bf16, 2, 1, DType::bf16};
  SyntheticBatch sb(spec);
  sb.fill_attention_random(5);
  HostTensor topk(DType::i32, {1, 3, 16});
  topk.fill_bytes(0xff);            // every row: no selected block
  topk.data<int32_t>()[2 * 16] = 2; // token 2 (position 299): block 2 only
  HostTensor out, lse;
  M3SA_ASSERT_OK(run_sparse_attention(attention_config(1, 16), sb, topk, {GetParam()}, &out, &lse));
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(lse.data<float>()[t * 2 + h], -INFINITY);
      for (int d = 0; d < kHeadDim; ++d)
        EXPECT_EQ(out.data<uint16_t>()[(t * 2 + h) * kHeadDim + d], 0) << t << " " << h;
    }
  EXPECT_TRUE(std::isfinite(lse.data<float>()[2 * 2]));
}

// Logits thousands away from 0, both signs (q = +-16, K rows -32, -16, -24): each head's softmax
// must shift by its own largest logit, the one that leaves the others e^-1448 = 0 behind even in
// double. Head 0's logits are all far below 0 (a max started at 0 would leave every weight
// e^-2896 = 0: a 0 / 0 output), head 1's far above (unshifted, they overflow). The output is
// then exactly the dominant key's V row, and lse its logit, 181.02 x k (16 x 128 / sqrt(128)).
TEST_P(Attention, SoftmaxShiftsByEachHeadsLargestLogit) {
  BatchSpec spec{{1}, {3}, 1, 1, 1, DType::bf16, 2, 1, DType::bf16};
  SyntheticBatch sb(spec);
  const float key_value[3] = {-32.f, -16.f, -24.f}; // K rows of keys 0, 1, 2
  const auto v_value = [](int64_t j, int d) {
    return static_cast<float>((j + 1) * (d % 8 + 1) * (d < 64 ? 1 : -1));
  };
  const int64_t page = sb.kv_block_table.data<int32_t>()[0];
  for (int64_t j = 0; j < 3; ++j)
    for (int d = 0; d < kHeadDim; ++d) {
      const int64_t i = (page * kBlockTokens + j) * kHeadDim + d; // one KV head
      store(DType::bf16, sb.k_cache.view().data, i, key_value[j]);
      store(DType::bf16, sb.v_cache.view().data, i, v_value(j, d));
    }
  for (int h = 0; h < 2; ++h)
    for (int d = 0; d < kHeadDim; ++d)
      store(DType::bf16, sb.q.view().data, h * kHeadDim + d, h == 0 ? 16.f : -16.f);
  HostTensor topk(DType::i32, {1, 1, 16});
  topk.fill_bytes(0xff);
  topk.data<int32_t>()[0] = 0; // block 0: keys 0, 1, 2 (position 2)
  HostTensor out, lse;
  M3SA_ASSERT_OK(run_sparse_attention(attention_config(1, 16), sb, topk, {GetParam()}, &out, &lse));
  const double unit = 16.0 * kHeadDim / std::sqrt(128.0); // logit of q = 16, k = 1
  const int64_t dominant[2] = {1, 0};                     // head 0: k = -16; head 1: k = -32
  for (int h = 0; h < 2; ++h) {
    const double logit = (h == 0 ? 1 : -1) * unit * key_value[dominant[h]];
    EXPECT_NEAR(lse.data<float>()[h], logit, 1e-6 * std::fabs(logit)) << h;
    for (int d = 0; d < kHeadDim; ++d)
      EXPECT_EQ(load(DType::bf16, out.view().data, h * kHeadDim + d), v_value(dominant[h], d))
          << h << " " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Attention, kHostBackends, backend_name);

} // namespace
} // namespace m3sa::testing
