// The prefill scorers (cuda.score_blocks / cuda.index_topk: sm80 mma.sync and sm90 wgmma + TMA)
// against the host backends, each implementation forced by name so that both run on a Hopper
// GPU. Integer data: every sum is exact, so selections and scores must match bit for bit.
// Random data (bf16 and e4m3): near-ties only, as for the CPU backend (compare.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/workspace.h"
#include "cuda/indexer.h"
#include "cuda/indexer_params.h"
#include "cuda/kernels/indexer_traits.h"
#include "cuda/launchers.h"
#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"
#include "registry/registry.h"
#include "support/e4m3_data.h"
#include "support/test_util.h"

namespace m3sa::testing {
namespace {

MsaConfig config_of(int heads, int k, int local, int init) {
  MsaConfig c;
  c.num_index_heads = heads, c.top_k = k, c.local_blocks = local, c.init_blocks = init;
  return c;
}

struct PrefillCase {
  const char* name;
  std::vector<int32_t> q_lens, seq_lens; // decode requests (q_len 1) first
  int num_decode;
  MsaConfig config;
  DType dtype;
  bool integers;
  bool use_reference;
};

void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

std::vector<PrefillCase> prefill_cases() {
  const DType bf = DType::bf16, f8 = DType::fp8_e4m3;
  return {
      // Chunk lengths 1 .. 16K after no prefix (causal triangle) and after unaligned prefixes.
      {"SmallChunkLengthsH4",
       {1, 2, 63, 64, 65, 200},
       {1, 300, 63, 128, 1000, 200},
       0,
       config_of(4, 16, 1, 0),
       bf,
       true,
       true},
      {"Chunk16kNoPrefixH1", {16384}, {16384}, 0, config_of(1, 16, 1, 0), bf, true, false},
      {"UnalignedChunkStartsH2K8NoLocal",
       {3000, 77, 513, 129},
       {4000, 10077, 643, 129},
       0,
       config_of(2, 8, 0, 0),
       bf,
       true,
       false},
      {"H16K32Init2Local2",
       {700, 300, 17},
       {9000, 300, 20000},
       0,
       config_of(16, 32, 2, 2),
       bf,
       true,
       false},
      {"H3RowsNotAPowerOfTwo",
       {1000, 85, 86},
       {5000, 85, 300},
       0,
       config_of(3, 16, 1, 1),
       bf,
       true,
       false},
      {"DecodeRowsAndSeveralPrefillsH4Fp8",
       {1, 1, 1, 900, 4096, 1, 5},
       {7000, 129, 0, 30000, 4096, 70000, 0},
       3,
       config_of(4, 16, 1, 0),
       f8,
       true,
       false},
      {"Prefill8kAfter56kH4K32", {8192}, {65536}, 0, config_of(4, 32, 1, 0), bf, true, false},
      {"Prefill4kAfter28kH4RandomData",
       {4096},
       {32768},
       0,
       config_of(4, 16, 1, 0),
       bf,
       false,
       false},
      {"Prefill4kAfter28kH4Fp8RandomData",
       {4096},
       {32768},
       0,
       config_of(4, 16, 1, 0),
       f8,
       false,
       false},
      {"Prefill2kAfter6kH1Fp8RandomData",
       {2048},
       {8192},
       0,
       config_of(1, 16, 1, 0),
       f8,
       false,
       false},
  };
}

BatchSpec spec_of(const PrefillCase& c, uint64_t seed) {
  BatchSpec s;
  s.q_lens = c.q_lens;
  s.seq_lens = c.seq_lens;
  s.num_decode = c.num_decode;
  s.decode_q_len = 1;
  s.index_heads = c.config.num_index_heads;
  s.index_dtype = c.dtype;
  s.seed = seed;
  return s;
}

// A plan of the named implementation, or nothing when it cannot run here (printed; on a Hopper
// GPU every implementation must run).
bool plan_named(const char* name, OpKind op, const MsaConfig& config, const SyntheticBatch& sb,
                CudaRun* run) {
  PlanRequest request = plan_request(op, config, sb, {Backend::cuda});
  request.implementation = name;
  const Status s = make_plan(request, &run->plan);
  if (!s.ok()) {
    std::printf("[ skip %s ] %s\n", name, s.to_string().c_str());
    EXPECT_FALSE(on_hopper()) << name << " must run on compute capability 9.0";
    return false;
  }
  run->workspace = device_workspace(run->plan);
  EXPECT_TRUE(run->workspace.status().ok()) << run->workspace.status().to_string();
  return true;
}

// Plans of cuda.index_topk.<topk_arch> and cuda.score_blocks.<score_arch>, or false where either
// cannot run here.
bool plan_scorers(const std::string& topk_arch, const std::string& score_arch,
                  const MsaConfig& config, const SyntheticBatch& sb, CudaRun* topk_run,
                  CudaRun* score_run) {
  const std::string topk_name = "cuda.index_topk." + topk_arch;
  const std::string score_name = "cuda.score_blocks." + score_arch;
  return plan_named(topk_name.c_str(), OpKind::index_topk, config, sb, topk_run) &&
         plan_named(score_name.c_str(), OpKind::score_blocks, config, sb, score_run);
}

// index_topk on topk_run's plan and score_blocks on score_run's, over db, into fresh outputs
// poisoned first ([H, T, K] ids 0x5a..., [H, T, width] scores NaN); both runs' flags must be 0.
struct ScorerOutputs {
  DeviceBuffer topk, scores;
};
ScorerOutputs run_scorers(const CudaRun& topk_run, const CudaRun& score_run,
                          const MsaConfig& config, const SyntheticBatch& sb,
                          const DeviceBatch& db) {
  const int heads = config.num_index_heads;
  ScorerOutputs out{DeviceBuffer(DType::i32, {heads, sb.num_tokens(), config.top_k}, 0x5a),
                    DeviceBuffer(DType::f32, {heads, sb.num_tokens(), sb.width()}, 0xff)};
  M3SA_EXPECT_OK(index_topk(
      topk_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), out.topk.view()},
      topk_run.workspace.workspace()));
  M3SA_EXPECT_OK(score_blocks(
      score_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), out.scores.view()},
      score_run.workspace.workspace()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_flags(topk_run), 0);
  EXPECT_EQ(device_flags(score_run), 0);
  return out;
}

class GpuPrefillScorer : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(GpuPrefillScorer, EveryScorerMatchesTheHostBackend) {
  M3SA_SKIP_WITHOUT_CUDA();
  const PrefillCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SyntheticBatch sb(spec_of(c, seed));
  M3SA_ASSERT_OK(sb.status());
  const IndexerOracle oracle = indexer_oracle(c.config, sb, seed, c.integers, c.use_reference);
  const HostTensor &want_topk = oracle.topk, &want_scores = oracle.scores;
  const DeviceBatch db(sb);
  const SelectionRules rules = selection_rules(c.config, sb);
  const int heads = c.config.num_index_heads;

  for (const char* arch : {"sm80", "sm90", "sm90_qgmma"}) {
    const bool certified = std::string(arch) == "sm90_qgmma"; // e4m3 caches only
    if (certified && c.dtype != DType::fp8_e4m3) continue;
    CudaRun topk_run, score_run;
    if (!plan_scorers(arch, certified ? "sm90" : arch, c.config, sb, &topk_run, &score_run))
      continue;
    SCOPED_TRACE(arch);
    const ScorerOutputs out = run_scorers(topk_run, score_run, c.config, sb, db);
    const HostTensor got_topk = out.topk.download(), got_scores = out.scores.download();

    // Every scorer sums exact products in fp32, or (sm90_qgmma) scores by QGMMA and certifies the
    // selection, rescoring the blocks near each row's K-th score exactly: near-ties only.
    const TopkComparison cmp = compare_topk(want_topk.view(), got_topk.view(),
                                            c.integers ? TensorView{} : want_scores.view(), rules);
    std::printf("[ %s %s ] %s: %s\n", c.name, arch, to_string(oracle.backend),
                describe(cmp).c_str());
    EXPECT_TRUE(cmp.ok()) << arch << ": " << describe(cmp);
    if (c.integers) {
      EXPECT_EQ(cmp.identical_rows, cmp.rows) << arch;
      EXPECT_TRUE(same_bytes(want_scores, got_scores))
          << arch << ": integer-valued scores must be bit-identical";
    }
    // Fused (index_topk) == export (score_blocks) + select_topk_blocks, bit for bit; where
    // sm90_qgmma certifies QGMMA scores (random data), its rescored sums may round apart from the
    // export's by an ulp: near-ties of the export's scores only.
    CudaRun select_run;
    ASSERT_TRUE(plan_named("cuda.select_topk_blocks", OpKind::select_topk_blocks, c.config, sb,
                           &select_run));
    DeviceBuffer selected(DType::i32, {heads, sb.num_tokens(), c.config.top_k}, 0x5a);
    M3SA_ASSERT_OK(select_topk_blocks(select_run.plan,
                                      {out.scores.view(), db.batch(), selected.view()},
                                      select_run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    if (certified && !c.integers) {
      const TopkComparison fused =
          compare_topk(selected.download().view(), got_topk.view(), got_scores.view(), rules);
      EXPECT_TRUE(fused.ok()) << arch << " fused against export + select: " << describe(fused);
    } else {
      EXPECT_TRUE(same_bytes(selected.download(), got_topk)) << arch;
    }
  }
}

// index_q is any [T, H, 128] view with 16-byte aligned rows (an engine's slice of a larger
// projection): padded heads and tokens select exactly as the contiguous tensor, for each scorer,
// with the padding NaN so that a read of it shows. sm90 brings bf16 queries of a power-of-two H
// by TMA (a tensor map over the view's strides) and stages the others (H = 3, e4m3) with loads.
TEST(GpuPrefillScorerSmall, StridedIndexQSelectsAsContiguous) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int64_t kHeadStride = kHeadDim + 64, kTokenPad = 32; // elements
  for (DType dtype : {DType::bf16, DType::fp8_e4m3})
    for (int heads : {1, 3, 4}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " H " + std::to_string(heads));
      const MsaConfig config = config_of(heads, 16, 1, 0);
      PrefillCase c{"", {1, 700, 300}, {5000, 3000, 9000}, 1, config, dtype, true, false};
      SyntheticBatch sb(spec_of(c, seed));
      M3SA_ASSERT_OK(sb.status());
      sb.fill_index_integers(seed, -3, 3);
      const DeviceBatch db(sb);
      const int64_t tokens = sb.num_tokens(), token_stride = heads * kHeadStride + kTokenPad;
      const size_t elem = dtype_size(dtype);
      // The padded copy, built on the host: 0xff (NaN in bf16 and e4m3) between the rows.
      std::vector<uint8_t> padded(static_cast<size_t>(tokens * token_stride) * elem, 0xff);
      const uint8_t* rows = static_cast<const uint8_t*>(sb.index_q.view().data);
      for (int64_t t = 0; t < tokens; ++t)
        for (int h = 0; h < heads; ++h)
          std::memcpy(padded.data() + (t * token_stride + h * kHeadStride) * elem,
                      rows + (t * heads + h) * kHeadDim * elem, kHeadDim * elem);
      DeviceBuffer strided(padded.size());
      M3SA_ASSERT_OK(strided.upload(padded.data(), padded.size()));
      TensorView q = TensorView::contiguous(strided.data(), dtype, {tokens, heads, kHeadDim},
                                            {DeviceKind::cuda, 0});
      q.strides[0] = token_stride, q.strides[1] = kHeadStride;

      for (const char* arch : {"cuda.index_topk.sm80", "cuda.index_topk.sm90"}) {
        CudaRun run;
        if (!plan_named(arch, OpKind::index_topk, config, sb, &run)) continue;
        DeviceBuffer want(DType::i32, {heads, tokens, 16}, 0x5a),
            got(DType::i32, {heads, tokens, 16}, 0x5a);
        M3SA_ASSERT_OK(index_topk(
            run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), want.view()},
            run.workspace.workspace()));
        M3SA_ASSERT_OK(index_topk(run.plan, {q, db.index_k_cache.view(), db.batch(), got.view()},
                                  run.workspace.workspace()));
        M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_TRUE(same_bytes(want.download(), got.download())) << arch;
        EXPECT_EQ(device_flags(run), 0) << arch;
      }
    }
}

// scores and topk are any non-overlapping [H, T, N] / [H, T, K] views: the exported scores (the
// SM90 scorer's gathered 32-byte runs, the -inf tail), the selection read from them and the
// fused selection land at the view's strides and nowhere else. Block-major views (the block
// stride the largest) must equal the contiguous results element for element, and padded views
// too, with their padding (poisoned) untouched.
TEST(GpuPrefillScorerSmall, StridedScoresAndTopkViews) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kHeads = 4, kTopK = 16;
  const MsaConfig config = config_of(kHeads, kTopK, 1, 0);
  // Strided views of a [H, T, W] tensor over a buffer of `elements` (0xff bytes: a NaN float,
  // an id of -1), and the offset of (h, t, w) in it.
  struct Layout {
    const char* name;
    int64_t strides[3];
    int64_t elements;
    int64_t at(int64_t h, int64_t t, int64_t w) const {
      return h * strides[0] + t * strides[1] + w * strides[2];
    }
  };
  const auto layouts = [](int64_t tokens, int64_t width) {
    return std::vector<Layout>{
        {"block-major", {tokens, 1, kHeads * tokens}, kHeads * tokens * width},
        {"padded", {tokens * (width + 3) + 5, width + 3, 1}, kHeads * (tokens * (width + 3) + 5)}};
  };
  const auto view_of = [](void* data, DType dtype, int64_t tokens, int64_t width,
                          const Layout& layout) {
    TensorView v =
        TensorView::contiguous(data, dtype, {kHeads, tokens, width}, {DeviceKind::cuda, 0});
    for (int d = 0; d < 3; ++d) v.strides[d] = layout.strides[d];
    return v;
  };
  // Every element of the view equals the contiguous tensor's, every other byte is still 0xff.
  const auto expect_view = [](const HostTensor& contiguous, const HostTensor& raw,
                              const Layout& layout, int64_t tokens, int64_t width,
                              const std::string& what) {
    std::vector<bool> in_view(layout.elements, false);
    const uint32_t* want = contiguous.data<uint32_t>();
    const uint32_t* got = raw.data<uint32_t>();
    int64_t wrong = 0, stray = 0;
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t w = 0; w < width; ++w) {
          const int64_t at = layout.at(h, t, w);
          in_view[at] = true;
          wrong += got[at] != want[(h * tokens + t) * width + w];
        }
    for (int64_t i = 0; i < layout.elements; ++i) stray += !in_view[i] && got[i] != 0xffffffffu;
    EXPECT_EQ(wrong, 0) << what << " " << layout.name << ": elements unlike the contiguous run";
    EXPECT_EQ(stray, 0) << what << " " << layout.name << ": writes outside the view";
  };

  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    PrefillCase c{"", {1, 700, 300}, {5000, 3000, 9000}, 1, config, dtype, true, false};
    SyntheticBatch sb(spec_of(c, seed));
    M3SA_ASSERT_OK(sb.status());
    sb.fill_index_integers(seed, -3, 3);
    const DeviceBatch db(sb);
    const int64_t tokens = sb.num_tokens(), width = sb.width();
    for (const char* arch : {"sm80", "sm90"}) {
      CudaRun score_run, select_run, topk_run;
      if (!plan_named((std::string("cuda.score_blocks.") + arch).c_str(), OpKind::score_blocks,
                      config, sb, &score_run) ||
          !plan_named("cuda.select_topk_blocks", OpKind::select_topk_blocks, config, sb,
                      &select_run) ||
          !plan_named((std::string("cuda.index_topk.") + arch).c_str(), OpKind::index_topk, config,
                      sb, &topk_run))
        continue;
      DeviceBuffer scores(DType::f32, {kHeads, tokens, width}, 0xff),
          selected(DType::i32, {kHeads, tokens, kTopK}, 0xff),
          fused(DType::i32, {kHeads, tokens, kTopK}, 0xff);
      M3SA_ASSERT_OK(score_blocks(
          score_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), scores.view()},
          score_run.workspace.workspace()));
      M3SA_ASSERT_OK(select_topk_blocks(select_run.plan,
                                        {scores.view(), db.batch(), selected.view()},
                                        select_run.workspace.workspace()));
      M3SA_ASSERT_OK(index_topk(
          topk_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), fused.view()},
          topk_run.workspace.workspace()));
      M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
      const HostTensor want_scores = scores.download(), want_selected = selected.download(),
                       want_fused = fused.download();
      ASSERT_TRUE(same_bytes(want_selected, want_fused)) << arch;

      const std::vector<Layout> score_layouts = layouts(tokens, width),
                                topk_layouts = layouts(tokens, kTopK);
      for (size_t l = 0; l < score_layouts.size(); ++l) {
        const Layout &sl = score_layouts[l], &tl = topk_layouts[l];
        DeviceBuffer s_buf(static_cast<size_t>(sl.elements) * 4),
            sel_buf(static_cast<size_t>(tl.elements) * 4),
            fused_buf(static_cast<size_t>(tl.elements) * 4);
        for (const DeviceBuffer* b : {&s_buf, &sel_buf, &fused_buf}) M3SA_ASSERT_OK(b->fill(0xff));
        const TensorView s_view = view_of(s_buf.data(), DType::f32, tokens, width, sl);
        const TensorView sel_view = view_of(sel_buf.data(), DType::i32, tokens, kTopK, tl);
        const TensorView fused_view = view_of(fused_buf.data(), DType::i32, tokens, kTopK, tl);
        M3SA_ASSERT_OK(score_blocks(
            score_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), s_view},
            score_run.workspace.workspace()));
        M3SA_ASSERT_OK(select_topk_blocks(select_run.plan, {s_view, db.batch(), sel_view},
                                          select_run.workspace.workspace()));
        M3SA_ASSERT_OK(index_topk(
            topk_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), fused_view},
            topk_run.workspace.workspace()));
        M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
        const auto raw = [](const DeviceBuffer& b, int64_t elements) { // the whole buffer
          HostTensor h(DType::i32, {elements});
          EXPECT_TRUE(b.download(h.view()).ok());
          return h;
        };
        expect_view(want_scores, raw(s_buf, sl.elements), sl, tokens, width,
                    std::string(arch) + " score_blocks");
        expect_view(want_selected, raw(sel_buf, tl.elements), tl, tokens, kTopK,
                    std::string(arch) + " select_topk_blocks");
        expect_view(want_fused, raw(fused_buf, tl.elements), tl, tokens, kTopK,
                    std::string(arch) + " index_topk");
        EXPECT_EQ(device_flags(score_run), 0) << arch;
        EXPECT_EQ(device_flags(select_run), 0) << arch;
        EXPECT_EQ(device_flags(topk_run), 0) << arch;
      }
    }
  }
}

// One e4m3 prefill chunk of q_len tokens ending at seq_len, `heads` index heads, the test's seed.
BatchSpec fp8_chunk_spec(int32_t q_len, int32_t seq_len, int heads) {
  BatchSpec spec;
  spec.q_lens = {q_len};
  spec.seq_lens = {seq_len};
  spec.index_heads = heads;
  spec.index_dtype = DType::fp8_e4m3;
  spec.seed = test_seed();
  return spec;
}

// cuda.index_topk.sm90_qgmma scores e4m3 caches by QGMMA, whose sums are not exact, and certifies
// each row's selection. Data built against it, every sum exact in fp32 (so every row must be
// identical to the CPU backend's): every block a copy of one (exact ties everywhere: every block is
// in doubt and rescored); copies whose scores step by 2^-9 (one dimension, ~1e-5 of the scores:
// below QGMMA's error, which orders them by chance, above the comparison's near-tie bound); and
// blocks that QGMMA orders the wrong way round by far more than random data shows: even blocks
// score 256 + 127 x 0.0295 = 259.75 from one large product and 127 small ones, each of which the
// aligned sum drops (QGMMA: 256), odd blocks 256 + 2.75 = 258.75 from two products it keeps. The
// exact selection takes the even blocks; session 17's bound of 2^-9 |q| |k| (about 0.5 here)
// would make the odd ones sure (their lower bound, 258.0, above the even ones' upper, 256.5).
TEST(GpuPrefillScorerSmall, CertifiedFp8SelectionsAreExactOnAdversarialData) {
  M3SA_SKIP_WITHOUT_CUDA();
  const MsaConfig config = config_of(4, 16, 1, 0);
  // A multiple of 0.25 in [-2, 2] (exact in e4m3) from a hash of (a, b).
  const auto quarter = [](uint64_t a, uint64_t b) {
    return static_cast<float>(static_cast<int>(mix(a, b) % 17) - 8) * 0.25f;
  };
  const char* const kinds[] = {"tied", "stepped", "dropped products"};
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kinds[kind]);
    SyntheticBatch sb(fp8_chunk_spec(512, 16384, config.num_index_heads));
    M3SA_ASSERT_OK(sb.status());
    const int last = kHeadDim - 1;
    const bool stepped = kind == 1;
    if (kind == 2) {
      fill_dropped_products(sb);
    } else {
      sb.fill_index(
          [&](int, int64_t j, int d) {
            return stepped && d == last ? static_cast<float>((j / 128) % 8) * 0x1p-9f
                                        : quarter(j % 128, d);
          },
          [&](int64_t t, int h, int d) {
            return stepped && d == last ? 1.f : quarter(1000 + t * 4 + h, d);
          });
    }
    HostTensor want, want_scores;
    M3SA_ASSERT_OK(run_index_topk(config, sb, RunOptions{Backend::cpu}, &want));
    M3SA_ASSERT_OK(run_score_blocks(config, sb, RunOptions{Backend::cpu}, &want_scores));
    CudaRun run;
    if (!plan_named("cuda.index_topk.sm90_qgmma", OpKind::index_topk, config, sb, &run)) return;
    const DeviceBatch db(sb);
    DeviceBuffer topk(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k}, 0x5a);
    M3SA_ASSERT_OK(index_topk(run.plan,
                              {db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()},
                              run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(device_flags(run), 0);
    const TopkComparison cmp = compare_topk(want.view(), topk.download().view(), want_scores.view(),
                                            selection_rules(config, sb));
    std::printf("[ certified e4m3, %s ] %s\n", kinds[kind], describe(cmp).c_str());
    EXPECT_EQ(cmp.identical_rows, cmp.rows) << describe(cmp);
  }
}

// Every scorer that widens e4m3 (sm80 to bf16, sm90 to fp16) multiplies exact values and sums
// exact products in fp32, so at e4m3's extremes (fill_e4m3_extremes: products past fp16's range
// and down to 2^-18, every sum exact) its selections and scores are the CPU backend's, bit for bit.
TEST(GpuPrefillScorerSmall, WidenedFp8SumsAreExactAtTheE4m3Extremes) {
  M3SA_SKIP_WITHOUT_CUDA();
  const MsaConfig config = config_of(4, 16, 1, 0);
  SyntheticBatch sb(fp8_chunk_spec(512, 8192, config.num_index_heads));
  M3SA_ASSERT_OK(sb.status());
  SCOPED_TRACE("seed " + std::to_string(sb.spec().seed));
  fill_e4m3_extremes(sb, sb.spec().seed);
  HostTensor want, want_scores;
  M3SA_ASSERT_OK(run_index_topk(config, sb, RunOptions{Backend::cpu}, &want));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, RunOptions{Backend::cpu}, &want_scores));
  const DeviceBatch db(sb);
  for (const char* arch : {"sm80", "sm90"}) {
    SCOPED_TRACE(arch);
    CudaRun topk_run, score_run;
    if (!plan_scorers(arch, arch, config, sb, &topk_run, &score_run)) continue;
    const ScorerOutputs out = run_scorers(topk_run, score_run, config, sb, db);
    const TopkComparison cmp = compare_topk(want.view(), out.topk.download().view(), TensorView{},
                                            selection_rules(config, sb));
    std::printf("[ e4m3 extremes %s ] %s\n", arch, describe(cmp).c_str());
    EXPECT_EQ(cmp.identical_rows, cmp.rows) << describe(cmp);
    EXPECT_TRUE(same_bytes(want_scores, out.scores.download())) << "scores must be bit-identical";
  }
}

// The certification's premise, on the kernel itself: every QGMMA block score that
// cuda.index_topk.sm90_qgmma leaves in its workspace is within the bound E of the exact one
// (cuda.score_blocks.sm90, widened): E = kQgmmaStepError |scale| sum_j |q_{<=j}| key_norm[j], with
// the prefix key norms the certification used (indexer_traits.h gives the error model). Data:
// uniform in [-2, 2); magnitudes over 2^-6 .. 2^7; one product of 256 and 31 of 2^-6 in every 32
// dims, all of one sign; one product of 256 and then 127 products just below, or at half of, the
// unit of the last bit the aligned sum keeps at 256 (each one dropped: the worst case of the model,
// 0.0144 / 0.0077 of |q| |k|, 7x / 4x session 17's bound of 2^-9 |q| |k|). Prints, for each, the
// largest error over E and over |scale| |q| |k|.
TEST(GpuPrefillScorerSmall, QgmmaScoresStayWithinTheCertificationBound) {
  M3SA_SKIP_WITHOUT_CUDA();
  const MsaConfig config = config_of(4, 16, 1, 0);
  // +-(1 + m / 8) 2^e, e in [lo, hi]: exact in e4m3.
  const auto spread = [&](uint64_t a, uint64_t b, int lo, int hi) {
    const uint64_t x = mix(a, b);
    const int e = lo + static_cast<int>(x % static_cast<uint64_t>(hi - lo + 1));
    const float v = std::ldexp(1.f + static_cast<float>((x >> 8) % 8) / 8.f, e);
    return (x >> 16) % 2 ? -v : v;
  };
  const char* const kinds[] = {"uniform", "wide range", "one large product",
                               "one large product, then 127 at 0.94 of its ulp",
                               "one large product, then 127 at half its ulp"};
  for (int kind = 0; kind < 5; ++kind) {
    const char* name = kinds[kind];
    SCOPED_TRACE(name);
    const BatchSpec spec = fp8_chunk_spec(1024, 8192, config.num_index_heads);
    SyntheticBatch sb(spec);
    M3SA_ASSERT_OK(sb.status());
    if (kind == 0) {
      sb.fill_index_random(spec.seed);
    } else if (kind == 1) {
      sb.fill_index(
          [&](int, int64_t j, int d) { return spread(spec.seed + j, d, -6, 7); },
          [&](int64_t t, int h, int d) { return spread(~spec.seed + t * 4 + h, d, -6, 4); });
    } else if (kind >= 3) {
      // One product of 256 (dim 0), then 127 of v^2 all adding up: v^2 = 0.94 or 0.5 ulp of 256
      // (2^-5 at 14 significant bits). A sum that aligns every product to the largest term
      // (the accumulator after step 0) drops each of them: an error of 127 v^2 against
      // |q| |k| = 256 + 127 v^2 (ratio 0.0144 or 0.0077 if all are dropped).
      const float v = kind == 3 ? 0.171875f : 0.125f;
      sb.fill_index([&](int, int64_t, int d) { return d == 0 ? 16.f : v; },
                    [&](int64_t, int, int d) { return d == 0 ? 16.f : v; });
    } else {
      // q: 16 on dim 0 of each 32, 2^-3 with a per-row sign pattern elsewhere; k: 16, and 2^-3
      // with the query's sign times a per-key sign (mostly +) so the small products mostly add.
      const auto sign = [&](uint64_t a, int d) { return mix(a, d) % 8 == 0 ? -1.f : 1.f; };
      sb.fill_index([&](int, int64_t j, int d) { return d % 32 == 0 ? 16.f : 0.125f * sign(j, d); },
                    [&](int64_t, int, int d) { return d % 32 == 0 ? 16.f : 0.125f; });
    }
    CudaRun topk_run, score_run;
    if (!plan_scorers("sm90_qgmma", "sm90", config, sb, &topk_run, &score_run)) return;
    const DeviceBatch db(sb);
    const int heads = config.num_index_heads;
    const ScorerOutputs exact = run_scorers(topk_run, score_run, config, sb, db);
    // The QGMMA scores and the key norms, where the run left them in its workspace.
    const auto info = detail::load_plan_info<cuda::ScoringPlanInfo>(topk_run.plan);
    detail::WorkspaceCarver carver(topk_run.workspace.data());
    const cuda::IndexerLayout l =
        cuda::carve_indexer(topk_run.plan.request, info, carver, false, true);
    const Capacities& cap = topk_run.plan.request.capacities;
    std::vector<float> approx(
        static_cast<size_t>(heads * cap.max_tokens * cap.max_blocks_per_request));
    std::vector<float4> norms(static_cast<size_t>(cap.max_requests * cap.max_blocks_per_request));
    M3SA_CUDA_ASSERT(
        cudaMemcpy(approx.data(), l.scores, approx.size() * sizeof(float), cudaMemcpyDeviceToHost));
    M3SA_CUDA_ASSERT(cudaMemcpy(norms.data(), l.key_norms, norms.size() * sizeof(float4),
                                cudaMemcpyDeviceToHost));
    const HostTensor want = exact.scores.download();
    const float scale = std::fabs(config.score_scale);
    double worst = 0.0, worst_relative = 0.0; // error / E, error / (|scale| |q| |k|)
    int64_t compared = 0;
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < sb.num_tokens(); ++t) {
        double prefix[cuda::kQgmmaSteps] = {}, q2 = 0.0; // |q_{<=j}|^2
        for (int d = 0; d < kHeadDim; ++d) {
          const double v = load(DType::fp8_e4m3, sb.index_q.view().data,
                                (int64_t{t} * heads + h) * kHeadDim + d);
          q2 += v * v;
          if (d % 32 == 31) prefix[d / 32] = q2;
        }
        const int n = static_cast<int>(sb.position(t) / 128 + 1);
        for (int b = 0; b < n; ++b) {
          const float a =
              approx[(int64_t{h} * cap.max_tokens + t) * cap.max_blocks_per_request + b];
          const float e = want.data<float>()[(int64_t{h} * sb.num_tokens() + t) * sb.width() + b];
          const float4 kn = norms[b]; // one request: row 0 of norms
          const double key_norm[cuda::kQgmmaSteps] = {kn.x, kn.y, kn.z, kn.w};
          double bound = 0.0;
          for (int j = 0; j < cuda::kQgmmaSteps; ++j) bound += std::sqrt(prefix[j]) * key_norm[j];
          bound *= double{cuda::kQgmmaStepError} * scale;
          const double error = std::fabs(double{a} - e);
          if (bound > 0.0) worst = std::max(worst, error / bound);
          if (q2 > 0.0 && kn.w > 0.f)
            worst_relative = std::max(worst_relative, error / (scale * std::sqrt(q2) * kn.w));
          ++compared;
        }
      }
    std::printf("[ QGMMA error, %s ] %lld block scores: largest error / bound %.3g, largest "
                "error / (|scale| |q| |k|) %.3g\n",
                name, static_cast<long long>(compared), worst, worst_relative);
    EXPECT_LE(worst, 1.0) << name;
  }
}

// Prefill metadata a scorer cannot serve is flagged by every scorer and never read (the name holds
// "Small": compute-sanitizer's memcheck runs it, so a read of the bad page would show): a page id
// out of range (bit 1), then a seq_len beyond the block table (bit 2).
TEST(GpuPrefillScorerSmall, BadMetadataIsFlaggedNotReadByEveryScorer) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    const PrefillCase c{"", {300, 200}, {3000, 200}, 0, config_of(2, 16, 1, 0), dtype, true, false};
    SyntheticBatch sb(spec_of(c, test_seed()));
    M3SA_ASSERT_OK(sb.status());
    sb.fill_index_integers(1, -2, 2);
    for (const char* arch : {"sm80", "sm90", "sm90_qgmma"}) {
      const bool certified = std::string(arch) == "sm90_qgmma"; // e4m3 caches only
      if (certified && dtype != DType::fp8_e4m3) continue;
      SCOPED_TRACE(std::string(arch) + (dtype == DType::bf16 ? " bf16" : " e4m3"));
      const std::string topk_name = std::string("cuda.index_topk.") + arch;
      const std::string score_name =
          std::string("cuda.score_blocks.") + (certified ? "sm90" : arch);
      CudaRun topk_run, score_run;
      if (!plan_named(topk_name.c_str(), OpKind::index_topk, c.config, sb, &topk_run) ||
          !plan_named(score_name.c_str(), OpKind::score_blocks, c.config, sb, &score_run))
        continue;
      const DeviceBatch db(sb);
      DeviceBuffer topk(DType::i32, {2, sb.num_tokens(), 16}, 0x5a);
      DeviceBuffer scores(DType::f32, {2, sb.num_tokens(), sb.width()}, 0xff);
      const auto flags = [&] {
        M3SA_EXPECT_OK(index_topk(
            topk_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()},
            topk_run.workspace.workspace()));
        M3SA_EXPECT_OK(score_blocks(
            score_run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), scores.view()},
            score_run.workspace.workspace()));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return std::make_pair(device_flags(topk_run), device_flags(score_run));
      };
      HostTensor table = db.block_table.download();
      table.data<int32_t>()[5] = 1 << 20; // request 0, block 5
      M3SA_ASSERT_OK(db.block_table.upload(table));
      EXPECT_EQ(flags(), std::make_pair(1, 1));
      M3SA_ASSERT_OK(db.block_table.upload(sb.block_table));
      HostTensor lens = db.seq_lens.download();
      lens.data<int32_t>()[1] = static_cast<int32_t>(sb.width()) * 128 + 1;
      M3SA_ASSERT_OK(db.seq_lens.upload(lens));
      EXPECT_EQ(flags(), std::make_pair(2, 2));
    }
  }
}

// The SM90 scorer's unit list (schedule_tiles.cu), on every case's batch (several prefills,
// padding and decode rows) and on 4200 one-token requests (tiles past the schedule's shared-memory
// cache), for persistent grids of 1, 7 and 132 CTAs: R within [4, 32], units
// range-major, each (tile, range) once, and a tile's ranges exactly 0 .. max(1, ceil(blocks / R))
// - 1 - a missing range would leave scores unwritten, an extra one would score blocks twice.
TEST(GpuPrefillScorerSmall, Sm90ScheduleListsEachUnitOnceRangeMajor) {
  M3SA_SKIP_WITHOUT_CUDA();
  std::vector<PrefillCase> cases = prefill_cases();
  // More tiles than the schedule keeps in shared memory (4096) and more requests than it lists at
  // a time (512): 4200 requests of one token, every seventh empty (a prefill q_len of 0 is valid).
  PrefillCase many{"FourThousand200Requests", {},          {},   0,
                   config_of(4, 16, 1, 0),    DType::bf16, true, false};
  for (int i = 0; i < 4200; ++i) {
    many.q_lens.push_back(i % 7 == 3 ? 0 : 1);
    many.seq_lens.push_back(1 + (i * 37) % 200);
  }
  cases.push_back(many);
  for (const PrefillCase& c : cases)
    for (const int ctas : {1, 7, 132}) {
      SCOPED_TRACE(std::string(c.name) + " ctas " + std::to_string(ctas));
      SyntheticBatch sb(spec_of(c, test_seed()));
      M3SA_ASSERT_OK(sb.status());
      const DeviceBatch db(sb);
      const int heads = c.config.num_index_heads;
      const int requests = static_cast<int>(c.q_lens.size());
      const int64_t width = sb.width();
      const int64_t tile_capacity =
          (sb.num_tokens() + cuda::sm90_tile_tokens(heads) - 1) / cuda::sm90_tile_tokens(heads) +
          requests;
      const int64_t range_capacity =
          (width + cuda::kMinBlocksPerRange - 1) / cuda::kMinBlocksPerRange;
      DeviceBuffer tiles(DType::i32, {tile_capacity, 4}, 0x5a);
      DeviceBuffer schedule(DType::i32, {4}, 0x5a);
      DeviceBuffer units(DType::i32, {tile_capacity * range_capacity, 2}, 0x5a);
      DeviceBuffer range_starts(DType::i32, {range_capacity}, 0x5a);
      cuda::ScheduleParams s{};
      s.cu_q_lens = db.batch().cu_q_lens.ptr<const int32_t>();
      s.seq_lens = db.batch().seq_lens.ptr<const int32_t>();
      s.first_request = c.num_decode;
      s.num_requests = requests;
      s.tile_tokens = cuda::sm90_tile_tokens(heads);
      s.tile_capacity = static_cast<int32_t>(tile_capacity);
      s.tiles = tiles.data_as<cuda::RowTile>();
      s.num_tiles = schedule.data_as<int32_t>();
      s.schedule = schedule.data_as<cuda::ScoringSchedule>();
      s.units = units.data_as<cuda::ScoringUnit>();
      s.range_starts = range_starts.data_as<int32_t>();
      s.unit_capacity = static_cast<int32_t>(tile_capacity * range_capacity);
      s.range_capacity = static_cast<int32_t>(range_capacity);
      s.table_width = static_cast<int32_t>(width);
      s.persistent_ctas = ctas;
      M3SA_CUDA_ASSERT(cuda::launch_schedule_tiles(s, nullptr));
      M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
      const HostTensor got_schedule = schedule.download(), got_tiles = tiles.download(),
                       got_units = units.download();
      const int32_t* sch = got_schedule.data<int32_t>();
      const int num_tiles = sch[0], range = sch[1], num_units = sch[3];
      ASSERT_GE(range, cuda::kMinBlocksPerRange);
      ASSERT_LE(range, cuda::kMaxBlocksPerRange);
      ASSERT_GT(num_tiles, 0);
      ASSERT_LE(num_units, s.unit_capacity);
      // The tiles: each scheduled request's tokens in order, tile_tokens at a time.
      const int tile_tokens = cuda::sm90_tile_tokens(heads);
      std::vector<std::array<int, 3>> want_tiles; // request, first token, tokens
      for (int r = 0, begin = 0; r < requests; begin += c.q_lens[r], ++r)
        for (int t = 0; r >= c.num_decode && t < c.q_lens[r]; t += tile_tokens)
          want_tiles.push_back({r, begin + t, std::min(tile_tokens, c.q_lens[r] - t)});
      ASSERT_EQ(num_tiles, static_cast<int>(want_tiles.size()));
      for (int t = 0; t < num_tiles; ++t) {
        const int32_t* tile = got_tiles.data<int32_t>() + 4 * t;
        ASSERT_EQ((std::array<int, 3>{tile[0], tile[1], tile[2]}), want_tiles[t]) << "tile " << t;
      }
      // A tile's expected ranges, from its rows' last position (as the contract's causality).
      std::vector<int> want_ranges(num_tiles);
      int want_units = 0;
      for (int t = 0; t < num_tiles; ++t) {
        const int32_t* tile = got_tiles.data<int32_t>() + 4 * t; // request, begin, count
        const int r = tile[0];
        int q_begin = 0;
        for (int i = 0; i < r; ++i) q_begin += c.q_lens[i];
        const int seq = c.seq_lens[r], q_len = c.q_lens[r];
        const int last = seq - q_len + (tile[1] - q_begin) + tile[2] - 1;
        const int blocks = seq == 0 ? 0 : last / 128 + 1;
        want_ranges[t] = std::max(1, (blocks + range - 1) / range);
        want_units += want_ranges[t];
      }
      ASSERT_EQ(num_units, want_units);
      std::vector<std::vector<int>> seen(num_tiles);
      int previous_range = 0;
      for (int u = 0; u < num_units; ++u) {
        const int tile = got_units.data<int32_t>()[2 * u], r = got_units.data<int32_t>()[2 * u + 1];
        ASSERT_TRUE(tile >= 0 && tile < num_tiles) << "unit " << u;
        EXPECT_GE(r, previous_range) << "unit " << u << ": not range-major";
        previous_range = r;
        seen[tile].push_back(r);
      }
      for (int t = 0; t < num_tiles; ++t) {
        std::sort(seen[t].begin(), seen[t].end());
        std::vector<int> want(want_ranges[t]);
        for (int r = 0; r < want_ranges[t]; ++r) want[r] = r;
        EXPECT_EQ(seen[t], want) << "tile " << t;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuPrefillScorer, ::testing::ValuesIn(prefill_cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

} // namespace
} // namespace m3sa::testing
