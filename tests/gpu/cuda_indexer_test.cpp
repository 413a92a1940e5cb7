// The CUDA indexer against the host backends. Small cases compare with the reference; large ones
// with the CPU backend, which the cpu suite holds to the reference (identical selections on
// integer data, near-ties only on random data). Every device output is poisoned before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/indexer.h"
#include "cuda/launchers.h"
#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"
#include "support/test_util.h"
#include "testing/sample_batch.h"

namespace m3sa::testing {
namespace {

CudaRun cuda_plan(OpKind op, const MsaConfig& config, const SyntheticBatch& sb) {
  return cuda_run(plan_request(op, config, sb, {Backend::cuda}));
}

HostTensor cuda_index_topk(const MsaConfig& config, const SyntheticBatch& sb, const DeviceBatch& db,
                           CudaRun* reuse = nullptr) {
  CudaRun local;
  CudaRun& run = reuse ? *reuse : (local = cuda_plan(OpKind::index_topk, config, sb));
  DeviceBuffer topk(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k}, 0x5a);
  const Status s =
      index_topk(run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()},
                 run.workspace.workspace());
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_flags(run), 0);
  return topk.download();
}

HostTensor cuda_score_blocks(const MsaConfig& config, const SyntheticBatch& sb,
                             const DeviceBatch& db) {
  CudaRun run = cuda_plan(OpKind::score_blocks, config, sb);
  DeviceBuffer scores(DType::f32, {config.num_index_heads, sb.num_tokens(), sb.width()}, 0xff);
  const Status s = score_blocks(
      run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), scores.view()},
      run.workspace.workspace());
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_flags(run), 0);
  return scores.download();
}

HostTensor cuda_select(const MsaConfig& config, const SyntheticBatch& sb, const DeviceBatch& db,
                       const HostTensor& scores) {
  CudaRun run = cuda_plan(OpKind::select_topk_blocks, config, sb);
  DeviceBuffer d_scores(scores);
  DeviceBuffer topk(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k}, 0x5a);
  const Status s = select_topk_blocks(run.plan, {d_scores.view(), db.batch(), topk.view()},
                                      run.workspace.workspace());
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_flags(run), 0);
  return topk.download();
}

struct IndexerCase {
  const char* name;
  BatchSpec spec;
  MsaConfig config;
  bool integers;      // integer data: every sum exact, selections and scores must match exactly
  bool use_reference; // small enough for the reference; else the CPU backend is the oracle
};

void PrintTo(const IndexerCase& c, std::ostream* os) { *os << c.name; }

MsaConfig cfg(int heads, int k = 16, int local = 1, int init = 0) {
  MsaConfig c;
  c.num_index_heads = heads, c.top_k = k, c.local_blocks = local, c.init_blocks = init;
  return c;
}

BatchSpec decode_spec(std::vector<int32_t> seq_lens, int heads, DType dtype, int q_len = 1) {
  BatchSpec s;
  s.seq_lens = seq_lens;
  s.q_lens.assign(seq_lens.size(), q_len);
  s.num_decode = static_cast<int>(seq_lens.size());
  s.decode_q_len = q_len;
  s.index_heads = heads;
  s.index_dtype = dtype;
  return s;
}

BatchSpec random_decode_spec(int batch, int max_len, int heads, DType dtype, uint64_t seed,
                             int padding = 0) {
  Rng rng(seed);
  std::vector<int32_t> lens;
  for (int i = 0; i < batch; ++i) lens.push_back(i < padding ? 0 : rng.uniform_int(1, max_len));
  return decode_spec(lens, heads, dtype);
}

BatchSpec mixed_spec(int heads, DType dtype) {
  BatchSpec s;
  s.q_lens = {2, 2, 2, 700, 33, 1};
  s.seq_lens = {9000, 130, 0, 5700, 33, 200};
  s.num_decode = 3;
  s.decode_q_len = 2;
  s.index_heads = heads;
  s.index_dtype = dtype;
  return s;
}

std::vector<IndexerCase> indexer_cases() {
  const DType bf = DType::bf16, f8 = DType::fp8_e4m3;
  BatchSpec prefill_long;
  prefill_long.q_lens = {4096};
  prefill_long.seq_lens = {64 * 1024};
  prefill_long.index_heads = 1;
  return {
      {"SmallDecodeBoundaryLengthsH4", decode_spec({1, 127, 128, 129, 2049, 0}, 4, bf), cfg(4),
       true, true},
      {"DecodeBoundaryLengthsFp8", decode_spec({1, 127, 128, 129, 2049, 0}, 4, f8), cfg(4), true,
       true},
      {"DecodeB64RandomLengthsH1", random_decode_spec(64, 40000, 1, bf, 7, 8), cfg(1), true, false},
      {"DecodeB64RandomLengthsRandomData", random_decode_spec(64, 40000, 1, bf, 8, 8), cfg(1),
       false, false},
      {"DecodeB256H4", random_decode_spec(256, 9000, 4, bf, 9, 16), cfg(4), true, false},
      {"DecodeB256H4Fp8RandomData", random_decode_spec(256, 9000, 4, f8, 10, 16), cfg(4), false,
       false},
      {"SmallDecodeMtp4", decode_spec({5000, 300, 7000}, 4, bf, 4), cfg(4), true, true},
      {"DecodeMtp16", decode_spec({5000, 16, 20000}, 2, bf, 16), cfg(2), true, false},
      // 16 x 16 rows per request: four 64-row tiles, each merged by its own last CTA.
      {"DecodeMtp16H16K32Init2", decode_spec({9000, 0, 300, 40000}, 16, bf, 16), cfg(16, 32, 1, 2),
       true, false},
      // The fp8 K = 32 decode instantiation (decode_topk_fp8_k32.cu).
      {"DecodeFp8K32H2", decode_spec({9000, 300, 40000, 0}, 2, f8), cfg(2, 32), true, false},
      {"DecodeMtp3H4Fp8RandomData", decode_spec({7000, 129, 33000}, 4, f8, 3), cfg(4), false,
       false},
      {"MixedDecodePrefillH4", mixed_spec(4, bf), cfg(4), true, false},
      {"MixedDecodePrefillFp8RandomData", mixed_spec(4, f8), cfg(4), false, false},
      {"MixedK32Local2Init1", mixed_spec(3, bf), cfg(3, 32, 2, 1), true, false},
      {"SmallMixedK8NoLocal", mixed_spec(2, bf), cfg(2, 8, 0, 0), true, false},
      {"MixedK1", mixed_spec(1, bf), cfg(1, 1, 1, 0), true, false},
      {"MixedH16", mixed_spec(16, bf), cfg(16), true, false},
      {"Prefill4kAfter60k", prefill_long, cfg(1), true, false},
      {"DecodeMillionTokens", decode_spec({1 << 20, 1000}, 1, bf), cfg(1), true, false},
      {"DecodeMillionTokensFp8RandomData", decode_spec({1 << 20}, 1, f8), cfg(1), false, false},
  };
}

class GpuIndexer : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(GpuIndexer, MatchesHostBackend) {
  M3SA_SKIP_WITHOUT_CUDA();
  const IndexerCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  BatchSpec spec = c.spec;
  spec.seed = seed;
  SyntheticBatch sb(spec);
  const IndexerOracle oracle = indexer_oracle(c.config, sb, seed, c.integers, c.use_reference);
  const HostTensor &want_topk = oracle.topk, &want_scores = oracle.scores;

  const DeviceBatch db(sb);
  const HostTensor got_topk = cuda_index_topk(c.config, sb, db);
  const HostTensor got_scores = cuda_score_blocks(c.config, sb, db);
  const TopkComparison cmp =
      compare_topk(want_topk.view(), got_topk.view(),
                   c.integers ? TensorView{} : want_scores.view(), selection_rules(c.config, sb));
  std::printf("[ %s ] %s: %s\n", c.name, to_string(oracle.backend), describe(cmp).c_str());
  EXPECT_TRUE(cmp.ok()) << describe(cmp);
  if (c.integers) {
    EXPECT_EQ(cmp.identical_rows, cmp.rows);
    EXPECT_TRUE(same_bytes(want_scores, got_scores))
        << "integer-valued scores must be bit-identical";
  }
  // The two-step path on the device equals index_topk: bit for bit on integer data; on random
  // data up to near-ties, since decode rows are scored by the decode kernel (mma.sync) and the
  // export by the prefill scorer (wgmma on Hopper), whose fp32 sums round in other orders.
  const HostTensor two_step = cuda_select(c.config, sb, db, got_scores);
  if (c.integers)
    EXPECT_TRUE(same_bytes(two_step, got_topk));
  else
    EXPECT_TRUE(compare_topk(want_topk.view(), two_step.view(), want_scores.view(),
                             selection_rules(c.config, sb))
                    .ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuIndexer, ::testing::ValuesIn(indexer_cases()),
                         [](const ::testing::TestParamInfo<IndexerCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(GpuIndexerLarge, PrefillChunk16kAfterMillionTokenPrefixSpotCheck) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  BatchSpec spec;
  spec.q_lens = {16384};
  spec.seq_lens = {1 << 20}; // a 16K chunk after a 1M - 16K prefix: 8192 causal blocks at the end
  spec.index_heads = 1;
  spec.seed = seed;
  SyntheticBatch sb(spec);
  sb.fill_index_integers(seed, -3, 3);
  const DeviceBatch db(sb);
  const HostTensor got = cuda_index_topk(cfg(1), sb, db);
  // The whole chunk is 2.2e13 multiply-adds: the CPU backend checks spread tokens (both chunk
  // ends, block boundaries) as single-token requests over the same cache.
  const std::vector<int64_t> tokens = {0,    1,    127,   128,   129,   1000,  4095,  4096,
                                       8191, 8192, 12000, 16254, 16255, 16256, 16382, 16383};
  const SampleBatch sample = make_sample(sb, tokens);
  const int64_t n = static_cast<int64_t>(tokens.size());
  PlanRequest request{OpKind::index_topk, Backend::cpu, cfg(1), Capacities{n, n, sb.width()},
                      DType::bf16};
  PlannedOp planned(request);
  M3SA_ASSERT_OK(planned.status);
  HostTensor want(DType::i32, {1, n, 16});
  M3SA_ASSERT_OK(index_topk(
      planned.plan, {sample.index_q.view(), sb.index_k_cache.view(), sample.batch(), want.view()},
      planned.workspace()));
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(topk_row(want, 0, i), topk_row(got, 0, tokens[i])) << "token " << tokens[i];
}

// Requests whose rows straddle select_topk_kernel's 256 candidates a group: 200, 256 and 257
// blocks (fewer candidates once init and local blocks are taken out) and 301.
const std::vector<int32_t> kGroupAndWarpRows = {
    200 * 128, 40 * 128, 301 * 128 + 5, 257 * 128 - 3, 256 * 128, 129, 0};

TEST(GpuIndexerSmall, SelectionMatchesReferenceOnTiesNanAndInfinities) {
  M3SA_SKIP_WITHOUT_CUDA();
  // Rows of up to 256 candidates are selected by 8 lanes, longer ones (here up to 301 blocks) by
  // the whole warp, in the same launch; 2344-block rows take the CTA-per-row kernel.
  for (std::vector<int32_t> lens : {std::vector<int32_t>{40 * 128, 3000, 129, 0}, kGroupAndWarpRows,
                                    std::vector<int32_t>{300000, 40 * 128, 0}}) {
    SyntheticBatch sb(decode_spec(lens, 2, DType::bf16));
    HostTensor scores(DType::f32, {2, sb.num_tokens(), sb.width()});
    Rng rng(test_seed());
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1.f, 2.f};
    for (int64_t i = 0; i < scores.view().numel(); ++i)
      scores.data<float>()[i] = rng.uniform() < 0.5 ? specials[rng.uniform_int(0, 6)]
                                                    : static_cast<float>(rng.uniform_int(-50, 50));
    for (MsaConfig config : {cfg(2), cfg(2, 32, 3, 2), cfg(2, 5, 0, 0)}) {
      HostTensor want;
      M3SA_ASSERT_OK(run_select_topk_blocks(config, sb, scores, {Backend::reference}, &want));
      const DeviceBatch db(sb);
      EXPECT_TRUE(same_bytes(want, cuda_select(config, sb, db, scores)))
          << "K " << config.top_k << " width " << sb.width();
    }
  }
}

// The select kernels' floor + survivors path (SelectTopkParams::rank_every_candidate = 0) chooses
// exactly what ranking every candidate chooses, and both equal the reference, in select_topk_kernel
// (rows by 8-lane groups, or by the warp past 256 candidates or when a group's survivors overflow)
// and the CTA-per-row kernel (few wide rows), on scores full of ties, NaN and infinities (rows
// whose survivors overflow and fall back), on smooth scores (few survivors) and on integers of a
// wide range (ties at the floor, survivors that fit).
TEST(GpuIndexerSmall, RankFloorSelectionEqualsTheFullRanking) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (std::vector<int32_t> lens : {std::vector<int32_t>{40 * 128, 3000, 129, 0, 1000, 77},
                                    kGroupAndWarpRows, std::vector<int32_t>{300000, 40 * 128, 0}}) {
    SyntheticBatch sb(decode_spec(lens, 2, DType::bf16));
    Rng rng(test_seed());
    for (const int mode : {0, 1, 2}) {
      HostTensor scores(DType::f32, {2, sb.num_tokens(), sb.width()});
      const float specials[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1.f, 2.f};
      for (int64_t i = 0; i < scores.view().numel(); ++i)
        scores.data<float>()[i] = mode == 1   ? static_cast<float>(rng.uniform() * 100.0)
                                  : mode == 2 ? static_cast<float>(rng.uniform_int(-3000, 3000))
                                  : rng.uniform() < 0.5
                                      ? specials[rng.uniform_int(0, 6)]
                                      : static_cast<float>(rng.uniform_int(-50, 50));
      for (MsaConfig config : {cfg(2), cfg(2, 32, 3, 2), cfg(2, 5, 0, 0), cfg(2, 1, 1, 0)}) {
        CudaRun run = cuda_plan(OpKind::select_topk_blocks, config, sb);
        const DeviceBatch db(sb);
        const DeviceBuffer d_scores(scores);
        const DeviceBuffer flags(DType::i32, {1}, 0);
        HostTensor got[2];
        for (int every = 0; every < 2; ++every) {
          DeviceBuffer topk(DType::i32, {2, sb.num_tokens(), config.top_k}, 0x5a);
          cuda::SelectTopkParams p{};
          p.scores = d_scores.data_as<const float>();
          p.score_stride_head = int64_t{sb.num_tokens()} * sb.width();
          p.score_stride_token = sb.width();
          p.score_stride_block = 1;
          p.score_width = sb.width();
          p.rows = cuda::selection_rows(run.plan, db.batch(), topk.view());
          p.first_request = 0;
          p.error_flags = flags.data_as<int32_t>();
          p.rank_every_candidate = every;
          M3SA_CUDA_ASSERT(cuda::launch_select_topk(p, nullptr));
          M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
          got[every] = topk.download();
        }
        HostTensor want;
        M3SA_ASSERT_OK(run_select_topk_blocks(config, sb, scores, {Backend::reference}, &want));
        EXPECT_TRUE(same_bytes(want, got[0])) << "K " << config.top_k << " width " << sb.width();
        EXPECT_TRUE(same_bytes(got[0], got[1])) << "K " << config.top_k << " width " << sb.width();
        EXPECT_EQ(flags.download().data<int32_t>()[0], 0);
      }
    }
  }
}

TEST(GpuIndexerSmall, InsertIndexKIsBitExactAndSkipsPadding) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::bf16, DType::fp8_e4m3})
    for (DType row_dtype : {DType::bf16, DType::f32}) {
      const int tokens = 300, pages = 4;
      HostTensor rows(row_dtype, {tokens, kHeadDim}), slots(DType::i64, {tokens}),
          cache(dtype, {pages, kBlockTokens, kHeadDim});
      Rng rng(test_seed());
      for (int64_t i = 0; i < rows.view().numel(); ++i)
        store(row_dtype, rows.view().data, i, static_cast<float>(rng.normal() * 300));
      for (int t = 0; t < tokens; ++t)
        slots.data<int64_t>()[t] = t % 7 == 3 ? -1 : (t * 37) % (pages * kBlockTokens);
      cache.fill_bytes(0x11);
      HostTensor want(dtype, {pages, kBlockTokens, kHeadDim});
      std::memcpy(want.view().data, cache.view().data, cache.bytes());
      PlanRequest request;
      request.op = OpKind::insert_index_k;
      request.cache_dtype = dtype;
      request.capacities = {1, tokens, 1};
      request.backend = Backend::reference;
      PlannedOp ref(request);
      M3SA_ASSERT_OK(
          insert_index_k(ref.plan, {rows.view(), slots.view(), want.view()}, ref.workspace()));
      request.backend = Backend::cuda;
      OpPlan plan;
      M3SA_ASSERT_OK(make_plan(request, &plan));
      const DeviceBuffer ws = device_workspace(plan);
      M3SA_EXPECT_OK(ws.status());
      DeviceBuffer d_rows(rows), d_slots(slots), d_cache(cache);
      M3SA_ASSERT_OK(
          insert_index_k(plan, {d_rows.view(), d_slots.view(), d_cache.view()}, ws.workspace()));
      M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bytes(want, d_cache.download()))
          << to_string(dtype) << " from " << to_string(row_dtype);
      int32_t flags = -1;
      M3SA_ASSERT_OK(read_device_errors(plan, ws.workspace(), {}, &flags));
      EXPECT_EQ(flags, 0) << to_string(dtype) << " from " << to_string(row_dtype);
    }
}

// The device error flag after one index_topk on a fresh plan and workspace.
int32_t flags_after_index_topk(const SyntheticBatch& sb, const DeviceBatch& db) {
  CudaRun run = cuda_plan(OpKind::index_topk, cfg(1), sb);
  DeviceBuffer topk(DType::i32, {1, sb.num_tokens(), 16}, 0x5a);
  Status s =
      index_topk(run.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()},
                 run.workspace.workspace());
  int32_t flags = -1;
  if (s.ok()) s = read_device_errors(run.plan, run.workspace.workspace(), {}, &flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return flags;
}

TEST(GpuIndexerSmall, BadPageIdsAreReportedNotRead) {
  M3SA_SKIP_WITHOUT_CUDA();
  SyntheticBatch sb(decode_spec({1000, 3000}, 1, DType::bf16));
  sb.fill_index_integers(1, -2, 2);
  DeviceBatch db(sb);
  HostTensor table = db.block_table.download();
  table.data<int32_t>()[1] = 1 << 20; // request 0, block 1
  M3SA_EXPECT_OK(db.block_table.upload(table));
  EXPECT_EQ(flags_after_index_topk(sb, db) & 1, 1);
}

TEST(GpuIndexerSmall, DecodeQLenMismatchIsReported) {
  M3SA_SKIP_WITHOUT_CUDA();
  SyntheticBatch sb(mixed_spec(1, DType::bf16)); // decode requests of q_len 2
  sb.fill_index_integers(2, -2, 2);
  DeviceBatch db(sb);
  db.decode_q_len = 1; // what the host says; the device cu_q_lens disagree
  EXPECT_EQ(flags_after_index_topk(sb, db), 8);
}

TEST(GpuIndexerRuns, ErrorFlagsAccumulateUntilReadAndUnpreparedWorkspacesAreReported) {
  M3SA_SKIP_WITHOUT_CUDA();
  SyntheticBatch sb(mixed_spec(1, DType::bf16));
  sb.fill_index_integers(4, -2, 2);
  DeviceBatch db(sb);
  db.decode_q_len = 1; // flagged on the device: bit 8
  CudaRun run = cuda_plan(OpKind::index_topk, cfg(1), sb);
  DeviceBuffer topk(DType::i32, {1, sb.num_tokens(), 16}, 0x5a);
  const IndexTopkArgs args{db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()};
  M3SA_ASSERT_OK(index_topk(run.plan, args, run.workspace.workspace()));
  db.decode_q_len = 2; // a clean run does not clear the earlier bit
  M3SA_ASSERT_OK(index_topk(run.plan, args, run.workspace.workspace()));
  int32_t flags = 0;
  M3SA_ASSERT_OK(read_device_errors(run.plan, run.workspace.workspace(), {}, &flags));
  EXPECT_EQ(flags, 8);
  M3SA_ASSERT_OK(read_device_errors(run.plan, run.workspace.workspace(), {}, &flags));
  EXPECT_EQ(flags, 0); // reading cleared it

  const DeviceBuffer unprepared = device_workspace(run.plan, false);

  M3SA_EXPECT_OK(unprepared.status());
  const Status s = read_device_errors(run.plan, unprepared.workspace(), {}, &flags);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.to_string().find("prepare_workspace"), std::string::npos) << s.to_string();
}

TEST(GpuIndexerRuns, PlanLargerThanTheBatch) {
  M3SA_SKIP_WITHOUT_CUDA();
  // Capacities of a serving engine (256 requests, 8K tokens, 1M-token rows) run on a small mixed
  // batch: the grid is the plan's, the idle CTAs leave outputs and the arrival counters alone.
  SyntheticBatch sb(mixed_spec(4, DType::bf16));
  sb.fill_index_integers(3, -2, 2);
  const DeviceBatch db(sb);
  PlanRequest request = plan_request(OpKind::index_topk, cfg(4), sb, {Backend::cuda});
  request.capacities = {256, 8192, 8192};
  CudaRun run;
  M3SA_ASSERT_OK(make_plan(request, &run.plan));
  run.workspace = device_workspace(run.plan);
  HostTensor want;
  M3SA_ASSERT_OK(run_index_topk(cfg(4), sb, {Backend::reference}, &want));
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(same_bytes(want, cuda_index_topk(cfg(4), sb, db, &run))) << "run " << i;
}

TEST(GpuIndexerRuns, TwentyRunsAreBitwiseIdentical) {
  M3SA_SKIP_WITHOUT_CUDA();
  SyntheticBatch sb(mixed_spec(4, DType::bf16));
  sb.fill_index_random(test_seed());
  const DeviceBatch db(sb);
  CudaRun run = cuda_plan(OpKind::index_topk, cfg(4), sb);
  const HostTensor first = cuda_index_topk(cfg(4), sb, db, &run);
  const HostTensor first_scores = cuda_score_blocks(cfg(4), sb, db);
  for (int i = 1; i < 20; ++i) {
    ASSERT_TRUE(same_bytes(first, cuda_index_topk(cfg(4), sb, db, &run))) << "run " << i;
    ASSERT_TRUE(same_bytes(first_scores, cuda_score_blocks(cfg(4), sb, db))) << "run " << i;
  }
}

TEST(GpuIndexerRuns, CapturedDecodeReplaysOnRewrittenInputs) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Capacity batch: 32 decode requests; the second data set changes lengths, pages and keys.
  BatchSpec a = random_decode_spec(32, 8000, 4, DType::bf16, seed, 2);
  a.min_width = 80; // one block-table width for both data sets
  SyntheticBatch sa(a);
  sa.fill_index_random(seed);
  BatchSpec b = random_decode_spec(32, 80 * 128, 4, DType::bf16, seed + 1, 5);
  b.min_width = 80;
  SyntheticBatch sb(b);
  sb.fill_index_random(seed + 2);
  ASSERT_EQ(sa.width(), sb.width());
  ASSERT_GE(sa.num_pages(), 1);

  // Device buffers sized for the larger of the two caches.
  const int pages = std::max(sa.num_pages(), sb.num_pages());
  HostTensor cache_a(DType::bf16, {pages, kBlockTokens, kHeadDim}),
      cache_b(DType::bf16, {pages, kBlockTokens, kHeadDim});
  cache_a.fill_bytes(0), cache_b.fill_bytes(0);
  std::memcpy(cache_a.view().data, sa.index_k_cache.view().data, sa.index_k_cache.bytes());
  std::memcpy(cache_b.view().data, sb.index_k_cache.view().data, sb.index_k_cache.bytes());
  DeviceBatch db(sa);
  DeviceBuffer cache(cache_a);
  const MsaConfig config = cfg(4);
  CudaRun run = cuda_plan(OpKind::index_topk, config, sa);
  DeviceBuffer topk(DType::i32, {4, sa.num_tokens(), 16}, 0x5a);
  const IndexTopkArgs args{db.index_q.view(), cache.view(), db.batch(), topk.view()};

  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status captured = index_topk(run.plan, args, run.workspace.workspace(), {0, stream});
  M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  M3SA_ASSERT_OK(captured);
  M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));

  // Replay on data set A, then rewrite seq_lens, block table, index-Q and the cache in place.
  M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  HostTensor want_a, want_a_scores;
  M3SA_ASSERT_OK(run_index_topk(config, sa, {Backend::cpu}, &want_a));
  M3SA_ASSERT_OK(run_score_blocks(config, sa, {Backend::cpu}, &want_a_scores));
  const TopkComparison cmp_a = compare_topk(want_a.view(), topk.download().view(),
                                            want_a_scores.view(), selection_rules(config, sa));
  EXPECT_TRUE(cmp_a.ok()) << describe(cmp_a);
  EXPECT_EQ(device_flags(run), 0);

  M3SA_EXPECT_OK(db.seq_lens.upload(sb.seq_lens));
  M3SA_EXPECT_OK(db.block_table.upload(sb.block_table));
  M3SA_EXPECT_OK(db.index_q.upload(sb.index_q));
  M3SA_EXPECT_OK(cache.upload(cache_b));
  M3SA_EXPECT_OK(topk.fill(0x5a));
  M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  const HostTensor replayed = topk.download();
  M3SA_EXPECT_OK(topk.fill(0x5a));
  M3SA_ASSERT_OK(
      index_topk(run.plan, args, run.workspace.workspace(), {0, stream})); // eager on the new data
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  EXPECT_TRUE(same_bytes(replayed, topk.download()));
  HostTensor want_b, want_b_scores;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::cpu}, &want_b));
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {Backend::cpu}, &want_b_scores));
  const TopkComparison cmp = compare_topk(want_b.view(), replayed.view(), want_b_scores.view(),
                                          selection_rules(config, sb));
  EXPECT_TRUE(cmp.ok()) << describe(cmp);
  EXPECT_EQ(device_flags(run), 0);

  for (int i = 0; i < 1000; ++i) {
    M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    if (i % 100 == 99) {
      M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
      ASSERT_TRUE(same_bytes(replayed, topk.download())) << "replay " << i;
    }
  }
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  ASSERT_TRUE(same_bytes(replayed, topk.download()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Back-to-back index_topk calls in one graph on one workspace, alternating two data sets of one
// shape, each into its own output: every output must equal the eager run of its set, for both
// cache dtypes (the widened e4m3 scorer too). The workspace's scores hold the other set's when a
// call begins, so a selection that read a row before the scorer stored it (programmatic
// dependent launch lets the selection start early; bench/patches/s22-select-overlap-red.patch
// starts each row as soon as its tile is scored) would select from the wrong data.
TEST(GpuIndexerRuns, GraphOfAlternatingPrefillBatchesEqualsEagerRuns) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(dtype == DType::bf16 ? "bf16" : "e4m3");
    BatchSpec spec;
    spec.q_lens = {1, 3000, 700, 1500};
    spec.seq_lens = {9000, 3000, 20000, 1500 + 128 * 40};
    spec.num_decode = 1;
    spec.decode_q_len = 1;
    spec.index_heads = 4;
    spec.index_dtype = dtype;
    SyntheticBatch sa(spec), sb(spec);
    sa.fill_index_random(seed);
    sb.fill_index_random(seed + 1);
    const DeviceBatch da(sa), db(sb);
    const MsaConfig config = cfg(4);
    CudaRun run = cuda_plan(OpKind::index_topk, config, sa);
    const HostTensor want_a = cuda_index_topk(config, sa, da, &run);
    const HostTensor want_b = cuda_index_topk(config, sb, db, &run);
    ASSERT_FALSE(same_bytes(want_a, want_b)) << "the data sets must select differently";

    expect_graph_of_alternating_calls(run, da, db, want_a, want_b, {4, sa.num_tokens(), 16}, 12);
  }
}

} // namespace
} // namespace m3sa::testing
