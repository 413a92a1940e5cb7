// The context-parallel decode indexer against the single-GPU index_topk. On one GPU the ranks'
// shards are scored one after another into one gathered buffer (NCCL refuses two ranks on one
// device) and merged by the same merge kernel; the NCCL path runs where several GPUs are visible.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"
#include "support/test_util.h"

#ifdef M3SA_HAVE_NCCL
#include "testing/nccl_ranks.h"
#endif

namespace m3sa::testing {
namespace {

MsaConfig config_with_heads(int heads) {
  MsaConfig c;
  c.num_index_heads = heads;
  return c;
}

// The rank's block table: its j-th block (in global order) -> the page holding that block. The
// test keeps one device cache for all ranks; each rank reads only its pages through its table.
HostTensor shard_table(const SyntheticBatch& sb, const Capacities& cap, const ContextShard& shard) {
  const int64_t width =
      std::max<int64_t>(1, shard_local_blocks(cap, shard, cap.max_blocks_per_request));
  const int requests = sb.batch().num_requests;
  HostTensor table(DType::i32, {requests, width});
  table.fill_bytes(0);
  for (int r = 0; r < requests; ++r) {
    const int64_t n = (sb.spec().seq_lens[r] + kBlockTokens - 1) / kBlockTokens;
    for (int64_t j = 0; j < shard_local_blocks(cap, shard, n); ++j)
      table.data<int32_t>()[r * width + j] = sb.page(r, shard_global_block(cap, shard, j));
  }
  return table;
}

HostTensor single_gpu_topk(const MsaConfig& config, const SyntheticBatch& sb,
                           const DeviceBatch& db) {
  OpPlan plan;
  EXPECT_TRUE(make_plan(plan_request(OpKind::index_topk, config, sb, {Backend::cuda}), &plan).ok());
  const DeviceBuffer ws = device_workspace(plan);
  M3SA_EXPECT_OK(ws.status());
  DeviceBuffer topk(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k}, 0x5a);
  const Status s = index_topk(
      plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), topk.view()}, ws.workspace());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return topk.download();
}

// Rank `rank`'s [H, T, fill] slice of a gathered [ranks, H, T, fill] candidate buffer.
TensorView rank_slice(const DeviceBuffer& gathered, int rank) {
  const TensorView all = gathered.view();
  const int64_t heads = all.shape[1], tokens = all.shape[2], fill = all.shape[3];
  return TensorView::contiguous(all.ptr<int64_t>() + rank * heads * tokens * fill, DType::i64,
                                {heads, tokens, fill}, {DeviceKind::cuda, 0});
}

struct ShardCase {
  const char* name;
  std::vector<int32_t> seq_lens;
  int heads;
  DType dtype;
  MsaConfig config;
};
void PrintTo(const ShardCase& c, std::ostream* os) { *os << c.name; }

std::vector<ShardCase> shard_cases() {
  MsaConfig k32 = config_with_heads(2);
  k32.top_k = 32, k32.local_blocks = 2, k32.init_blocks = 1;
  return {{"MillionTokensH4", {1 << 20, 300000, 5000, 0}, 4, DType::bf16, config_with_heads(4)},
          {"MillionTokensFp8H1", {1 << 20, 70000}, 1, DType::fp8_e4m3, config_with_heads(1)},
          {"SmallK32Init1Local2", {200000, 3000, 129}, 2, DType::bf16, k32}};
}

class GpuContextParallel : public ::testing::TestWithParam<ShardCase> {};

TEST_P(GpuContextParallel, ShardedSelectionsEqualTheSingleGpuOnes) {
  M3SA_SKIP_WITHOUT_CUDA();
  const ShardCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  BatchSpec spec;
  spec.seq_lens = c.seq_lens;
  spec.q_lens.assign(c.seq_lens.size(), 1);
  spec.num_decode = static_cast<int>(c.seq_lens.size());
  spec.index_heads = c.heads;
  spec.index_dtype = c.dtype;
  SyntheticBatch sb(spec);
  sb.fill_index_random(seed);
  const DeviceBatch db(sb);
  const HostTensor want = single_gpu_topk(c.config, sb, db);
  // The single-GPU result shares the decode kernels under test: hold it to the CPU backend (kept
  // to the reference by the cpu suite) first, near-ties allowed on this random data.
  HostTensor cpu_topk, cpu_scores;
  M3SA_ASSERT_OK(run_index_topk(c.config, sb, {Backend::cpu}, &cpu_topk));
  M3SA_ASSERT_OK(run_score_blocks(c.config, sb, {Backend::cpu}, &cpu_scores));
  const TopkComparison oracle =
      compare_topk(cpu_topk.view(), want.view(), cpu_scores.view(), selection_rules(c.config, sb));
  EXPECT_TRUE(oracle.ok()) << describe(oracle);
  const PlanRequest request = plan_request(OpKind::index_topk, c.config, sb, {Backend::cuda});

  for (ShardMode mode : {ShardMode::contiguous, ShardMode::round_robin})
    for (int ranks : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(mode == ShardMode::contiguous ? "contiguous" : "round robin") +
                   " over " + std::to_string(ranks) + " ranks");
      std::vector<ContextParallelPlan> plans(ranks);
      for (int rank = 0; rank < ranks; ++rank)
        M3SA_ASSERT_OK(make_context_parallel_plan(request, {rank, ranks, mode}, &plans[rank]));
      const int fill = plans[0].ranked_slots;
      DeviceBuffer gathered(DType::i64, {ranks, c.heads, sb.num_tokens(), fill}, 0x77);
      DeviceBuffer topk(DType::i32, {c.heads, sb.num_tokens(), c.config.top_k}, 0x5a);
      for (int rank = 0; rank < ranks; ++rank) { // each rank in turn, as if on its own GPU
        const ContextParallelPlan& plan = plans[rank];
        const DeviceBuffer table(shard_table(sb, request.capacities, plan.shard));
        BatchMetadata batch = db.batch();
        batch.block_table = table.view();
        const DeviceBuffer ws = device_workspace(plan.scoring, false);
        M3SA_EXPECT_OK(ws.status());
        M3SA_ASSERT_OK(prepare_context_parallel_workspace(plan, ws.workspace()));
        M3SA_ASSERT_OK(
            score_shard_candidates(plan, {db.index_q.view(), db.index_k_cache.view(), batch, {}},
                                   rank_slice(gathered, rank), ws.workspace()));
        // The last rank's scoring is followed at once by the merge (launched to overlap it, PDL),
        // which must still read every candidate the scoring writes.
        if (rank == ranks - 1)
          M3SA_ASSERT_OK(
              merge_shard_candidates(plans[0], gathered.view(), db.batch(), topk.view()));
        M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
        int32_t flags = -1;
        M3SA_ASSERT_OK(read_device_errors(plan.scoring, ws.workspace(), {}, &flags));
        EXPECT_EQ(flags, 0);
      }
      EXPECT_TRUE(same_bytes(want, topk.download()));
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuContextParallel, ::testing::ValuesIn(shard_cases()),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// A graph of back-to-back context-parallel steps on one GPU (each: two ranks' shards scored into
// one gathered buffer, then merged), alternating two data sets into their own outputs. Every
// kernel of a step starts early (programmatic dependent launch after its predecessor), so a
// scoring that wrote the gathered candidates before the previous merge had read them, or a merge
// that read them before its scorings had written them, gives the other set's selection.
TEST(GpuContextParallelSmall, BackToBackStepsInAGraphEqualTheSingleGpuSelections) {
  M3SA_SKIP_WITHOUT_CUDA();
  constexpr int kRanks = 2, kSteps = 4;
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MsaConfig config = config_with_heads(2);
  BatchSpec spec;
  spec.seq_lens = {70000, 5000, 129};
  spec.q_lens.assign(spec.seq_lens.size(), 1);
  spec.num_decode = static_cast<int>(spec.seq_lens.size());
  spec.index_heads = config.num_index_heads;
  SyntheticBatch sa(spec), sb(spec);
  sa.fill_index_random(seed);
  sb.fill_index_random(seed + 1);
  const DeviceBatch da(sa), db(sb);
  const HostTensor want[2] = {single_gpu_topk(config, sa, da), single_gpu_topk(config, sb, db)};
  ASSERT_FALSE(same_bytes(want[0], want[1])); // the sets must tell the steps apart
  const PlanRequest request = plan_request(OpKind::index_topk, config, sa, {Backend::cuda});
  std::vector<ContextParallelPlan> plans(kRanks);
  std::vector<DeviceBuffer> tables, workspaces;
  for (int rank = 0; rank < kRanks; ++rank) {
    M3SA_ASSERT_OK(
        make_context_parallel_plan(request, {rank, kRanks, ShardMode::contiguous}, &plans[rank]));
    tables.emplace_back(shard_table(sa, request.capacities, plans[rank].shard)); // same pages
    workspaces.push_back(device_workspace(plans[rank].scoring, false));
    M3SA_ASSERT_OK(workspaces.back().status());
    M3SA_ASSERT_OK(prepare_context_parallel_workspace(plans[rank], workspaces.back().workspace()));
  }
  const int fill = plans[0].ranked_slots;
  const DeviceBuffer gathered(DType::i64, {kRanks, config.num_index_heads, sa.num_tokens(), fill},
                              0x77);
  expect_graph_of_alternating_results(
      [&](int i, const TensorView& out, cudaStream_t stream) {
        const DeviceBatch& d = i % 2 == 0 ? da : db;
        const ExecContext ctx{0, stream};
        Status s;
        for (int rank = 0; rank < kRanks && s.ok(); ++rank) {
          BatchMetadata batch = d.batch();
          batch.block_table = tables[rank].view();
          s = score_shard_candidates(plans[rank],
                                     {d.index_q.view(), d.index_k_cache.view(), batch, {}},
                                     rank_slice(gathered, rank), workspaces[rank].workspace(), ctx);
        }
        return s.ok() ? merge_shard_candidates(plans[0], gathered.view(), d.batch(), out, ctx) : s;
      },
      want[0], want[1], {config.num_index_heads, sa.num_tokens(), config.top_k}, kSteps, 3);
  for (int rank = 0; rank < kRanks; ++rank) {
    int32_t flags = -1;
    M3SA_ASSERT_OK(
        read_device_errors(plans[rank].scoring, workspaces[rank].workspace(), {}, &flags));
    EXPECT_EQ(flags, 0);
  }
}

TEST(GpuContextParallelSmall, PrefillRowsAndOversizedTablesAreRejected) {
  M3SA_SKIP_WITHOUT_CUDA();
  BatchSpec spec;
  spec.seq_lens = {5000, 300};
  spec.q_lens = {1, 40};
  spec.num_decode = 1;
  spec.index_heads = 1;
  SyntheticBatch sb(spec);
  const DeviceBatch db(sb);
  ContextParallelPlan plan;
  M3SA_ASSERT_OK(make_context_parallel_plan(
      plan_request(OpKind::index_topk, config_with_heads(1), sb, {Backend::cuda}),
      {1, 4, ShardMode::contiguous}, &plan));
  const DeviceBuffer ws = device_workspace(plan.scoring, false);
  M3SA_EXPECT_OK(ws.status());
  DeviceBuffer candidates(DType::i64, {1, sb.num_tokens(), plan.ranked_slots}, 0);
  const IndexTopkArgs args{db.index_q.view(), db.index_k_cache.view(), db.batch(), {}};
  Status s = score_shard_candidates(plan, args, candidates.view(), ws.workspace());
  EXPECT_NE(s.message().find("decode rows"), std::string::npos) << s.to_string();
  BatchMetadata decode_only = db.batch(); // the first request alone: a decode batch
  decode_only.num_decode_requests = decode_only.num_requests = 1;
  decode_only.num_tokens = 1;
  decode_only.cu_q_lens.shape[0] = 2, decode_only.seq_lens.shape[0] = 1;
  decode_only.block_table.shape[0] = 1;
  TensorView one_query = db.index_q.view();
  one_query.shape[0] = 1;
  s = score_shard_candidates(plan, {one_query, db.index_k_cache.view(), decode_only, {}},
                             candidates.view(), ws.workspace());
  EXPECT_NE(s.message().find("the rank's table"), std::string::npos) << s.to_string();
}

TEST(GpuContextParallelMultiGpu, NcclExchangeAcrossGpusEqualsTheSingleGpuResultEagerAndInAGraph) {
  M3SA_SKIP_WITHOUT_CUDA();
#ifndef M3SA_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL headers: the NCCL exchange is compiled out";
#else
  int devices = 0;
  M3SA_CUDA_ASSERT(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "NCCL path needs 2+ GPUs; " << devices << " visible";
  const cuda::NcclLibrary& nccl = cuda::nccl_library();
  if (!nccl.loaded()) GTEST_SKIP() << nccl.error;
  setenv("NCCL_NVLS_ENABLE", "0", 1); // NVLink multicast off (device README)

  BatchSpec spec;
  spec.seq_lens = {1 << 20, 250000};
  spec.q_lens = {1, 1};
  spec.num_decode = 2;
  spec.index_heads = 4;
  SyntheticBatch sb(spec);
  sb.fill_index_random(test_seed());
  const MsaConfig config = config_with_heads(4);
  const PlanRequest request = plan_request(OpKind::index_topk, config, sb, {Backend::cuda});
  HostTensor want;
  {
    const DeviceBatch db(sb);
    want = single_gpu_topk(config, sb, db);
  }
  for (int ranks = 2; ranks <= devices; ranks *= 2) { // every power of two the host allows
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::vector<HostTensor> got(ranks), replayed(ranks);
    const std::vector<Status> results = run_on_ranks(ranks, [&](int rank, ncclComm_t comm) {
      ContextParallelPlan plan;
      M3SA_RETURN_IF_ERROR(
          make_context_parallel_plan(request, {rank, ranks, ShardMode::round_robin}, &plan));
      const DeviceBatch db(sb); // a full copy per GPU; each rank reads its pages only
      const DeviceBuffer table(shard_table(sb, request.capacities, plan.shard));
      BatchMetadata batch = db.batch();
      batch.block_table = table.view();
      const DeviceBuffer ws = device_workspace(plan.scoring, false);
      const DeviceBuffer topk(DType::i32, {4, sb.num_tokens(), config.top_k}, 0x5a);
      M3SA_RETURN_IF_ERROR(ws.status());
      M3SA_RETURN_IF_ERROR(topk.status());
      cudaStream_t stream;
      M3SA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const auto step = [&] {
        return context_parallel_index_topk(
            plan, {db.index_q.view(), db.index_k_cache.view(), batch, topk.view()}, comm,
            ws.workspace(), {0, stream});
      };
      Status s = prepare_context_parallel_workspace(plan, ws.workspace(), {0, stream});
      if (s.ok()) s = step();
      if (s.ok()) s = cuda::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      got[rank] = topk.download();
      // The same step captured in a graph (each rank captures its own stream, thread-local, at
      // the same time as the others) and replayed twice into a poisoned output.
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (s.ok()) s = topk.fill(0x5a);
      if (s.ok())
        s = cuda::cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture");
      if (s.ok()) {
        s = step();
        const Status ended =
            cuda::cuda_status(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
        if (s.ok()) s = ended;
      }
      if (s.ok())
        s = cuda::cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      for (int replay = 0; replay < 2 && s.ok(); ++replay)
        s = cuda::cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      if (s.ok()) s = cuda::cuda_status(cudaStreamSynchronize(stream), "replay");
      if (s.ok()) replayed[rank] = topk.download();
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      int32_t flags = -1; // after the eager step and both replays
      if (s.ok()) s = read_device_errors(plan.scoring, ws.workspace(), {0, stream}, &flags);
      if (s.ok() && flags != 0)
        s = Status(StatusCode::internal, "device error flags " + std::to_string(flags));
      cudaStreamDestroy(stream);
      return s;
    });
    for (int rank = 0; rank < ranks; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].to_string();
      EXPECT_TRUE(same_bytes(want, got[rank])) << "rank " << rank;
      EXPECT_TRUE(same_bytes(want, replayed[rank])) << "rank " << rank << ", graph replay";
    }
  }
#endif
}

} // namespace
} // namespace m3sa::testing
