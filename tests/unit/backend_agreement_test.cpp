// The CPU backend against the reference on fresh random data (seed printed), and the CPU backend
// against itself across thread counts (and that shared result against the reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "support/simd_levels.h"
#include "support/test_util.h"

namespace m3sa::testing {
namespace {

BatchSpec mixed_spec(DType index_dtype, int heads, uint64_t seed) {
  BatchSpec spec;
  spec.q_lens = {1, 1, 1, 1, 37, 150, 1};
  spec.seq_lens = {3000, 129, 0, 20000, 2600, 150, 40};
  spec.num_decode = 4;
  spec.index_heads = heads;
  spec.index_dtype = index_dtype;
  spec.q_heads = heads * 4;
  spec.kv_heads = heads;
  spec.extra_columns = 5;
  spec.seed = seed;
  return spec;
}

MsaConfig config_for(int heads, int k = 16, bool reduce = false, int local = 1, int init = 0) {
  MsaConfig c;
  c.num_index_heads = heads;
  c.top_k = k;
  c.reduce_heads = reduce;
  c.local_blocks = local;
  c.init_blocks = init;
  return c;
}

struct Case {
  const char* name;
  DType dtype;
  int heads;
  int k;
  bool integers;
  bool reduce;
  int local = 1, init = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CpuMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(CpuMatchesReference, IndexTopkAndScores) {
  const Case& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SyntheticBatch sb(mixed_spec(c.dtype, c.heads, seed));
  if (c.integers)
    sb.fill_index_integers(seed, -3, 3);
  else
    sb.fill_index_random(seed);
  const MsaConfig config = config_for(c.heads, c.k, c.reduce, c.local, c.init);
  const SelectionRules rules = selection_rules(config, sb);
  HostTensor ref_topk, cpu_topk, ref_scores, cpu_scores;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &ref_topk));
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::cpu}, &cpu_topk));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {Backend::reference}, &ref_scores));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {Backend::cpu}, &cpu_scores));

  // Every CPU row is a valid contract row on its own (ascending, unique, padded, forced blocks),
  // whatever the comparison with the reference decides.
  for (int h = 0; h < c.heads; ++h)
    for (int64_t t = 0; t < sb.num_tokens(); ++t)
      ASSERT_EQ(selection_row_error(topk_row(cpu_topk, h, t), sb.position(t), rules), "")
          << "head " << h << " token " << t;
  if (c.integers) {
    // Integer data: every partial sum is exact, so selections and scores are identical.
    const TopkComparison cmp = compare_topk(ref_topk.view(), cpu_topk.view(), TensorView{}, rules);
    EXPECT_EQ(cmp.identical_rows, cmp.rows) << describe(cmp);
    EXPECT_EQ(std::memcmp(ref_scores.data<float>(), cpu_scores.data<float>(), ref_scores.bytes()),
              0);
  } else {
    const TopkComparison cmp =
        compare_topk(ref_topk.view(), cpu_topk.view(), ref_scores.view(), rules);
    EXPECT_TRUE(cmp.ok()) << describe(cmp);
    std::printf("[ %s ] seed %llu: %s\n", c.name, static_cast<unsigned long long>(seed),
                describe(cmp).c_str());
    RecordProperty("near_tie_rows", static_cast<int>(cmp.near_tie_rows));
    double worst = 0;
    for (int64_t i = 0; i < ref_scores.view().numel(); ++i) {
      const float a = ref_scores.data<float>()[i], b = cpu_scores.data<float>()[i];
      if (std::isinf(a) || std::isinf(b)) {
        ASSERT_EQ(a, b) << "score " << i;
        continue;
      }
      worst = std::max(worst, std::abs(static_cast<double>(a) - b) /
                                  std::max(1.0, std::abs(static_cast<double>(a))));
    }
    std::printf("[ %s ] largest score error relative to max(|score|, 1): %.3g\n", c.name, worst);
    // Observed at most 1.45e-6 over 12 seeds; kNearTieRelative assumes two scores drift apart by
    // less than itself.
    EXPECT_LE(worst, kNearTieRelative / 2);
  }
  // The two-step path (score_blocks then select_topk_blocks) equals index_topk on each backend.
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    HostTensor two_step;
    M3SA_ASSERT_OK(run_select_topk_blocks(
        config, sb, backend == Backend::cpu ? cpu_scores : ref_scores, {backend}, &two_step));
    const HostTensor& fused = backend == Backend::cpu ? cpu_topk : ref_topk;
    EXPECT_EQ(std::memcmp(two_step.data<int32_t>(), fused.data<int32_t>(), fused.bytes()), 0)
        << to_string(backend);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CpuMatchesReference,
    ::testing::Values(Case{"bf16_integers_h4", DType::bf16, 4, 16, true, false},
                      Case{"fp8_integers_h4", DType::fp8_e4m3, 4, 16, true, false},
                      Case{"bf16_random_h4", DType::bf16, 4, 16, false, false},
                      Case{"fp8_random_h1", DType::fp8_e4m3, 1, 16, false, false},
                      Case{"bf16_random_h2_k32", DType::bf16, 2, 32, false, false},
                      Case{"bf16_integers_h4_k8", DType::bf16, 4, 8, true, false},
                      Case{"bf16_integers_reduce_heads", DType::bf16, 4, 16, true, true},
                      Case{"bf16_integers_init2_local2", DType::bf16, 2, 16, true, false, 2, 2},
                      Case{"fp8_random_init1_local3", DType::fp8_e4m3, 2, 8, false, false, 3, 1}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(CpuMatchesReferenceAttention, RandomMixedBatch) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    BatchSpec spec = mixed_spec(DType::bf16, 2, seed);
    spec.kv_dtype = kv;
    SyntheticBatch sb(spec);
    sb.fill_index_random(seed);
    sb.fill_attention_random(seed + 1);
    const MsaConfig config = config_for(2);
    HostTensor topk, ref_out, ref_lse, cpu_out, cpu_lse;
    M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::cpu}, &topk));
    // K and V scaled apart, so that a backend scaling V by K's scale (or neither) shows.
    RunOptions ref{Backend::reference}, cpu{Backend::cpu};
    ref.k_scale = cpu.k_scale = 0.75f;
    ref.v_scale = cpu.v_scale = 1.25f;
    M3SA_ASSERT_OK(run_sparse_attention(config, sb, topk, ref, &ref_out, &ref_lse));
    M3SA_ASSERT_OK(run_sparse_attention(config, sb, topk, cpu, &cpu_out, &cpu_lse));
    const AttentionComparison c =
        compare_attention(ref_out.view(), cpu_out.view(), ref_lse.view(), cpu_lse.view());
    std::printf("[ attention %s ] seed %llu: %s\n", to_string(kv),
                static_cast<unsigned long long>(seed), describe(c).c_str());
    EXPECT_TRUE(c.ok()) << to_string(kv) << ": " << describe(c);
  }
}

// The CPU backend's selections, block scores and attention of one batch.
struct CpuOutputs {
  HostTensor topk, scores, out, lse;
};
void run_cpu_ops(const MsaConfig& config, const SyntheticBatch& sb, const RunOptions& options,
                 CpuOutputs* o) {
  M3SA_ASSERT_OK(run_index_topk(config, sb, options, &o->topk));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, options, &o->scores));
  M3SA_ASSERT_OK(run_sparse_attention(config, sb, o->topk, options, &o->out, &o->lse));
}

void expect_same_bytes(const CpuOutputs& a, const CpuOutputs& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.topk, b.topk)) << what;
  EXPECT_TRUE(same_bytes(a.scores, b.scores)) << what;
  EXPECT_TRUE(same_bytes(a.out, b.out)) << what;
  EXPECT_TRUE(same_bytes(a.lse, b.lse)) << what;
}

// The reference's selections and block scores of a batch, which each CPU run is judged against.
struct ReferenceSelections {
  HostTensor topk, scores;
};
void run_reference_selections(const MsaConfig& config, const SyntheticBatch& sb,
                              ReferenceSelections* ref) {
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &ref->topk));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {Backend::reference}, &ref->scores));
}

// The outputs are also the reference's (up to near-ties and fp32 rounding): invariance of a wrong
// answer would pass a comparison of the CPU backend with itself. The attention is the
// reference's over the CPU's own selections.
void expect_matches_reference(const MsaConfig& config, const SyntheticBatch& sb,
                              const ReferenceSelections& ref, const CpuOutputs& o) {
  const TopkComparison selections =
      compare_topk(ref.topk.view(), o.topk.view(), ref.scores.view(), selection_rules(config, sb));
  EXPECT_TRUE(selections.ok()) << describe(selections);
  HostTensor ref_out, ref_lse;
  M3SA_ASSERT_OK(
      run_sparse_attention(config, sb, o.topk, {Backend::reference}, &ref_out, &ref_lse));
  const AttentionComparison attention =
      compare_attention(ref_out.view(), o.out.view(), ref_lse.view(), o.lse.view());
  EXPECT_TRUE(attention.ok()) << describe(attention);
}

void expect_identical_for_thread_counts(DType dtype, uint64_t seed) {
  SyntheticBatch sb(mixed_spec(dtype, 4, seed));
  sb.fill_index_random(seed);
  sb.fill_attention_random(seed + 1);
  const MsaConfig config = config_for(4);
  CpuOutputs at[4];
  const int threads[4] = {1, 2, 3, 8};
  for (int i = 0; i < 4; ++i) {
    run_cpu_ops(config, sb, {Backend::cpu, threads[i]}, &at[i]);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int i = 1; i < 4; ++i) expect_same_bytes(at[0], at[i], std::to_string(threads[i]));
  ReferenceSelections ref;
  run_reference_selections(config, sb, &ref);
  if (!::testing::Test::HasFatalFailure()) expect_matches_reference(config, sb, ref, at[0]);
}

// The CPU indexer scores a wave of segments in block ranges sized by the thread count (a long
// decode row's blocks spread over the threads), so the count must not change a bit.
TEST(CpuThreads, ResultsAreIdenticalFor1And2And3And8Threads) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    expect_identical_for_thread_counts(dtype, seed);
  }
}

TEST(CpuThreads, RunUsesNoMoreThreadsThanPlanned) {
  SyntheticBatch sb(mixed_spec(DType::bf16, 1, 3));
  sb.fill_index_integers(3, -3, 3);
  PlanRequest request = plan_request(OpKind::index_topk, config_for(1), sb, {Backend::cpu, 1});
  PlannedOp planned(request);
  M3SA_ASSERT_OK(planned.status);
  HostTensor topk(DType::i32, {1, sb.num_tokens(), 16});
  // Asking for more threads than the workspace was sized for must stay within the plan's. Threads
  // past the plan's would take scratch past the workspace's end: the buffer holds the planned
  // bytes and then 8 times as many guard bytes, which must come back untouched (without the
  // guard, such writes land in the heap and only sometimes crash the process).
  const size_t planned_bytes = planned.plan.workspace_bytes;
  ASSERT_GT(planned_bytes, 0u);
  const size_t guard_bytes = 8 * planned_bytes;
  HostTensor buffer(DType::i32, {static_cast<int64_t>((planned_bytes + guard_bytes + 3) / 4)});
  uint8_t* bytes = static_cast<uint8_t*>(buffer.view().data);
  std::fill_n(bytes + planned_bytes, guard_bytes, uint8_t{0x5a});
  M3SA_ASSERT_OK(index_topk(planned.plan,
                            {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()},
                            Workspace{bytes, planned_bytes}, ExecContext{8, nullptr}));
  EXPECT_EQ(std::count(bytes + planned_bytes, bytes + planned_bytes + guard_bytes, uint8_t{0x5a}),
            static_cast<std::ptrdiff_t>(guard_bytes))
      << "a run wrote past the plan's workspace";
  HostTensor ref;
  M3SA_ASSERT_OK(run_index_topk(config_for(1), sb, {Backend::reference}, &ref));
  const TopkComparison cmp =
      compare_topk(ref.view(), topk.view(), TensorView{}, selection_rules(config_for(1), sb));
  EXPECT_EQ(cmp.identical_rows, cmp.rows) << describe(cmp);
}

// The CPU ops at each instruction-set level of the row kernels: AVX-512 and AVX2 write the same
// bytes (the kernels' lanes carry the same FMA chains), and every level - the portable SSE2 one
// too, which an AVX2 host never picks on its own - agrees with the reference.
TEST(CpuSimdLevels, OpsWriteTheSameBytesAtAvx2AndAvx512AndMatchTheReferenceAtEveryLevel) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    SyntheticBatch sb(mixed_spec(dtype, 4, seed));
    sb.fill_index_random(seed);
    sb.fill_attention_random(seed + 1);
    const MsaConfig config = config_for(4);
    ReferenceSelections ref;
    run_reference_selections(config, sb, &ref);
    if (HasFatalFailure()) return;
    std::vector<std::pair<cpu::SimdLevel, CpuOutputs>> at;
    for (cpu::SimdLevel level : runnable_simd_levels()) {
      SCOPED_TRACE(cpu::to_string(level));
      ScopedSimdLevel scope(level);
      CpuOutputs o;
      run_cpu_ops(config, sb, {Backend::cpu}, &o);
      if (HasFatalFailure()) return;
      expect_matches_reference(config, sb, ref, o);
      at.emplace_back(level, std::move(o));
    }
    if (at.back().first != cpu::SimdLevel::avx512) continue; // nothing to compare bitwise
    expect_same_bytes(at[at.size() - 2].second, at.back().second, "avx2 against avx512");
  }
}

} // namespace
} // namespace m3sa::testing
