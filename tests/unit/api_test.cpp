// Plans, capabilities and the value types of the public API.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "registry/registry.h"
#include "support/test_util.h"

namespace m3sa::testing {
namespace {

PlanRequest small_request(OpKind op, Backend backend) {
  PlanRequest r;
  r.op = op;
  r.backend = backend;
  r.capacities = {4, 64, 32};
  return r;
}

// The 64-byte aligned start of `bytes` of host workspace inside `memory` (resized to hold it).
void* aligned_workspace(std::vector<std::byte>& memory, size_t bytes) {
  memory.resize(bytes + 64);
  void* aligned = memory.data();
  size_t space = memory.size();
  return std::align(64, bytes, aligned, space);
}

// What supports' answers for `backend` and `op` start with.
std::string supports_prefix(Backend backend, OpKind op) {
  return std::string("backend ") + to_string(backend) + ", op " + to_string(op) + ": ";
}

// A host implementation's registered name, "<backend>.<op>".
std::string implementation_name(Backend backend, OpKind op) {
  return std::string(to_string(backend)) + "." + to_string(op);
}

TEST(Api, StatusMessageNamesArgumentExpectationAndValue) {
  const Status s = Status::invalid_argument("config.top_k", "1..32", "0");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "config.top_k: expected 1..32, got 0");
  EXPECT_EQ(Status{}.to_string(), "ok");
}

TEST(Api, TensorViewDescribesItself) {
  const TensorView v =
      TensorView::contiguous(reinterpret_cast<void*>(64), DType::bf16, {7, 64, 128});
  EXPECT_EQ(v.describe(), "bf16 [7, 64, 128] strides [8192, 128, 1] on cpu");
  EXPECT_EQ(v.numel(), 7 * 64 * 128);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_FALSE(TensorView{}.present());
}

// A view's counts saturate instead of wrapping (the argument checks compare them with buffer
// sizes); a rank-0 view holds no element (it is how an optional argument is absent); and
// contiguity ignores the stride of a size-1 dim, which frameworks set freely.
TEST(Api, TensorViewCountsSaturateAndContiguityIgnoresSizeOneDims) {
  EXPECT_EQ(TensorView{}.numel(), 0);
  const auto* base = reinterpret_cast<void*>(64);
  TensorView v = TensorView::contiguous(base, DType::bf16, {2, 1, 4});
  EXPECT_EQ(v.numel(), 8);
  v.strides[1] = 12345;
  EXPECT_TRUE(v.is_contiguous());
  v.strides[0] = 5;
  EXPECT_FALSE(v.is_contiguous());
  constexpr int64_t kHuge = int64_t{1} << 40, kMax = std::numeric_limits<int64_t>::max();
  const TensorView huge = TensorView::contiguous(base, DType::bf16, {2, kHuge, kHuge});
  EXPECT_EQ(huge.strides[2], 1);
  EXPECT_EQ(huge.strides[1], kHuge);
  EXPECT_EQ(huge.strides[0], kMax); // 2^80 elements a row
  EXPECT_EQ(huge.numel(), kMax);
  EXPECT_TRUE(huge.is_contiguous());
}

TEST(Api, HostBackendsSupportEveryOpAndConfig) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (int k : {1, 8, 16, 32})
      for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
        MsaConfig config;
        config.top_k = k;
        config.local_blocks = 1;
        EXPECT_TRUE(supports(backend, config, dtype).ok()) << to_string(backend) << " K=" << k;
      }
}

TEST(Api, CudaBackendSaysWhyItIsUnavailable) {
  const Status s = supports(Backend::cuda, MsaConfig{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("backend cuda"), std::string::npos) << s.message();
  EXPECT_EQ(best_available_backend(MsaConfig{}), Backend::cpu);
  PlanRequest request =
      small_request(OpKind::sparse_attention, Backend::cuda); // no CUDA kernel yet
  OpPlan plan;
  EXPECT_EQ(make_plan(request, &plan).code(), StatusCode::unsupported);
  EXPECT_EQ(best_available_backend(OpKind::sparse_attention, MsaConfig{}), Backend::cpu);
}

// What capabilities.cpp answers matches how the library was configured (the build passes
// M3SA_HAVE_CUDA to this test as M3SA_TEST_CUDA_BACKEND_BUILT): a CUDA-free build neither claims
// the backend nor counts a device, and its refusal of every CUDA op says how to get one.
TEST(Api, CapabilityAnswersMatchTheBuild) {
  EXPECT_EQ(cuda_backend_built(), M3SA_TEST_CUDA_BACKEND_BUILT != 0);
  if (cuda_backend_built()) GTEST_SKIP() << "the CUDA backend is built: its answers need a device";
  EXPECT_EQ(cuda_device_count(), 0);
  for (OpKind op : kEveryOp) {
    const Status s = supports(Backend::cuda, op, MsaConfig{});
    EXPECT_EQ(s.code(), StatusCode::unsupported) << to_string(op);
    EXPECT_NE(s.message().find(std::string("backend cuda, op ") + to_string(op)), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("-DM3SA_ENABLE_CUDA=ON"), std::string::npos) << s.message();
    EXPECT_EQ(best_available_backend(op, MsaConfig{}), Backend::cpu) << to_string(op);
  }
}

// A host backend refuses a config past the implementations' limits as unsupported (not as an
// invalid argument: a later build may support it), naming the backend, the op and every
// implementation's reason; the whole-config form answers the first op's refusal.
TEST(Api, HostBackendsRefuseConfigsPastTheLimitsNamingBackendAndOp) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    for (OpKind op : kEveryOp) {
      MsaConfig config;
      config.top_k = kMaxTopK + 1;
      const Status s = supports(backend, op, config);
      EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
      const std::string what = supports_prefix(backend, op);
      EXPECT_EQ(s.message().rfind(what, 0), 0u) << s.message();
      EXPECT_NE(s.message().find("config.top_k " + std::to_string(kMaxTopK + 1)), std::string::npos)
          << s.message();
    }
    MsaConfig config;
    config.num_index_heads = kMaxIndexHeads + 1;
    const Status s = supports(backend, config);
    EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
    EXPECT_EQ(s.message().rfind(supports_prefix(backend, OpKind::insert_index_k), 0), 0u)
        << s.message();
    EXPECT_NE(s.message().find("config.num_index_heads"), std::string::npos) << s.message();
  }
}

// A cache dtype outside the contract's two is the caller's error in every entry point: supports
// says so for each backend and op as make_plan does (invalid_argument naming cache_dtype), never
// OK, and best_available_backend does not pick CUDA for it.
TEST(Api, CapabilityQueriesRejectACacheDtypeOutsideBf16AndE4m3) {
  for (Backend backend : {Backend::reference, Backend::cpu, Backend::cuda})
    for (OpKind op : kEveryOp)
      for (DType dtype : {DType::f32, DType::i32}) {
        const Status s = supports(backend, op, MsaConfig{}, dtype);
        EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
        const std::string what = supports_prefix(backend, op);
        EXPECT_EQ(s.message().rfind(what, 0), 0u) << s.message();
        EXPECT_NE(s.message().find(std::string("cache_dtype: expected bf16 or fp8_e4m3, got ") +
                                   to_string(dtype)),
                  std::string::npos)
            << s.message();
        EXPECT_EQ(best_available_backend(op, MsaConfig{}, dtype), Backend::cpu);
      }
  EXPECT_EQ(supports(Backend::cpu, MsaConfig{}, DType::f32).code(), StatusCode::invalid_argument);
  PlanRequest request = small_request(OpKind::index_topk, Backend::cpu);
  request.cache_dtype = DType::f32;
  OpPlan plan;
  const Status s = make_plan(request, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("cache_dtype: expected bf16 or fp8_e4m3, got f32"), std::string::npos)
      << s.message();
}

TEST(Api, PlansSizeWorkspacesFromCapacitiesOnly) {
  for (OpKind op : {OpKind::insert_index_k, OpKind::score_blocks, OpKind::select_topk_blocks,
                    OpKind::index_topk, OpKind::sparse_attention}) {
    PlanRequest small = small_request(op, Backend::cpu);
    small.num_threads = 2;
    PlanRequest large = small;
    large.capacities.max_blocks_per_request = 8192;
    OpPlan a, b;
    M3SA_ASSERT_OK(make_plan(small, &a));
    M3SA_ASSERT_OK(make_plan(large, &b));
    EXPECT_EQ(a.num_threads, 2);
    EXPECT_LE(a.workspace_bytes, b.workspace_bytes) << to_string(op);
    EXPECT_EQ(a.workspace_bytes % 64, 0u);
    if (op == OpKind::index_topk) {
      EXPECT_GE(b.workspace_bytes, 2u * 8192 * sizeof(float));
    }
  }
}

// Also the registry's own checks, behind the entry point's (which checks the plan's op and seal
// first, so that no public call reaches them): run_implementation trusts implementation_of to
// refuse an implementation of another op and an index at or past the table's end (never read).
TEST(Api, PlanForOneOpIsRejectedByAnother) {
  SyntheticBatch sb({{1}, {10}, 1, 1, 1});
  MsaConfig config;
  config.num_index_heads = 1;
  PlannedOp scoring(plan_request(OpKind::score_blocks, config, sb, {}));
  M3SA_ASSERT_OK(scoring.status);
  HostTensor topk(DType::i32, {1, 1, 16});
  Status s = index_topk(scoring.plan,
                        {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()},
                        scoring.workspace());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("a plan made for index_topk"), std::string::npos) << s.message();

  const detail::Implementation* impl = nullptr;
  s = detail::implementation_of(scoring.plan, OpKind::index_topk, &impl);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("a plan made for index_topk"), std::string::npos) << s.message();
  EXPECT_EQ(impl, nullptr);
  M3SA_ASSERT_OK(detail::implementation_of(scoring.plan, OpKind::score_blocks, &impl));
  ASSERT_NE(impl, nullptr);
  EXPECT_EQ(impl->op, OpKind::score_blocks);
  for (int32_t index : {-1, implementation_count(), implementation_count() + 1}) {
    OpPlan outside = scoring.plan;
    outside.implementation = index;
    impl = nullptr;
    s = detail::implementation_of(outside, OpKind::score_blocks, &impl);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << "implementation " << index;
    // Refused by the range check itself, not by whatever lies past the table.
    EXPECT_NE(s.message().find("implementation in [0, " + std::to_string(implementation_count())),
              std::string::npos)
        << s.message();
    EXPECT_EQ(impl, nullptr) << "implementation " << index;
  }
}

// Every implementation answers at the contract's limits (top_k 1..32, 1..16 index heads) through
// implementation_supports, which asks its can_implement directly - make_plan's argument checks
// reject such configs before any implementation sees them.
TEST(Api, ImplementationsAnswerAtTheConfigLimits) {
  for (int i = 0; i < implementation_count(); ++i) {
    const ImplementationInfo info = implementation_info(i);
    const bool host = info.backend != Backend::cuda; // a CUDA one may also lack a device here
    for (const auto& [top_k, heads, field] :
         {std::tuple{kMaxTopK, kMaxIndexHeads, ""}, std::tuple{kMaxTopK + 1, 1, "config.top_k"},
          std::tuple{16, kMaxIndexHeads + 1, "config.num_index_heads"}}) {
      PlanRequest request = small_request(info.op, info.backend);
      request.config.top_k = top_k;
      request.config.num_index_heads = heads;
      const Status s = implementation_supports(i, request);
      if (*field == '\0') {
        if (host) {
          EXPECT_TRUE(s.ok()) << info.name << ": " << s.to_string();
        }
        continue;
      }
      EXPECT_FALSE(s.ok()) << info.name << " top_k " << top_k << " heads " << heads;
      if (host) {
        EXPECT_EQ(s.code(), StatusCode::unsupported) << info.name << ": " << s.to_string();
        EXPECT_NE(s.message().find(field), std::string::npos) << info.name << ": " << s.message();
      }
    }
  }
}

TEST(Api, HostWorkspacesNeedNoPreparationAndReportNoDeviceErrors) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    OpPlan plan;
    M3SA_ASSERT_OK(make_plan(small_request(OpKind::index_topk, backend), &plan));
    std::vector<std::byte> memory;
    void* aligned = aligned_workspace(memory, plan.workspace_bytes);
    ASSERT_NE(aligned, nullptr);
    const Workspace ws{aligned, plan.workspace_bytes};
    M3SA_ASSERT_OK(prepare_workspace(plan, ws));
    int32_t flags = -1;
    M3SA_ASSERT_OK(read_device_errors(plan, ws, {}, &flags));
    EXPECT_EQ(flags, 0);
    if (plan.workspace_bytes > 0) {
      const Status s = prepare_workspace(plan, {aligned, plan.workspace_bytes - 1});
      EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
    }
    EXPECT_EQ(read_device_errors(plan, ws, {}, nullptr).code(), StatusCode::invalid_argument);
  }
}

// Found by tests/fuzz/fuzz_plan (UBSan, asan preset): local_blocks + init_blocks was summed in int,
// which overflows for local_blocks = INT_MAX.
TEST(Api, LocalPlusInitBlocksNearIntMaxIsRejectedWithoutOverflow) {
  for (const auto& [local, init] : {std::pair{INT32_MAX, 1}, std::pair{1, INT32_MAX},
                                    std::pair{INT32_MAX, INT32_MAX}}) {
    PlanRequest request = small_request(OpKind::index_topk, Backend::cpu);
    request.config.local_blocks = local;
    request.config.init_blocks = init;
    OpPlan plan;
    const Status s = make_plan(request, &plan);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_EQ(
        s.message().rfind("m3sa::index_topk: config.local_blocks + config.init_blocks: expected ", 0),
        0u)
        << s.message();
  }
}

// Found by tests/fuzz/fuzz_plan: prepare_workspace and read_device_errors returned
// "workspace.bytes: ..." without the "m3sa::<op>: " prefix every other entry point carries.
TEST(Api, WorkspaceEntryPointsNameTheirOp) {
  OpPlan plan;
  M3SA_ASSERT_OK(make_plan(small_request(OpKind::index_topk, Backend::cpu), &plan));
  ASSERT_GT(plan.workspace_bytes, 0u);
  std::vector<std::byte> memory;
  void* aligned = aligned_workspace(memory, plan.workspace_bytes);
  ASSERT_NE(aligned, nullptr);
  const Status short_workspace = prepare_workspace(plan, {aligned, plan.workspace_bytes - 1});
  EXPECT_EQ(short_workspace.message().rfind("m3sa::index_topk: workspace.bytes: expected ", 0), 0u)
      << short_workspace.message();
  const Status misaligned =
      prepare_workspace(plan, {static_cast<char*>(aligned) + 1, plan.workspace_bytes});
  EXPECT_EQ(misaligned.message().rfind("m3sa::index_topk: workspace.data: expected ", 0), 0u)
      << misaligned.message();
  int32_t flags = 0;
  const Status no_flags = read_device_errors(plan, {aligned, plan.workspace_bytes}, {}, nullptr);
  EXPECT_EQ(no_flags.message().rfind("m3sa::index_topk: flags: expected ", 0), 0u)
      << no_flags.message();
  OpPlan edited = plan;
  edited.num_threads += 1;
  const Status edited_plan = read_device_errors(edited, {aligned, plan.workspace_bytes}, {}, &flags);
  EXPECT_EQ(edited_plan.message().rfind("m3sa::index_topk: plan: expected ", 0), 0u)
      << edited_plan.message();
}

TEST(Api, ShardsCoverEveryBlockOnceInGlobalOrder) {
  const Capacities cap{4, 64, 1000};
  for (ShardMode mode : {ShardMode::contiguous, ShardMode::round_robin})
    for (int ranks : {1, 2, 3, 8})
      for (int64_t n : {0, 1, 7, 999, 1000}) {
        std::vector<int> owner(static_cast<size_t>(n), -1);
        for (int rank = 0; rank < ranks; ++rank) {
          const ContextShard shard{rank, ranks, mode};
          int64_t previous = -1;
          for (int64_t j = 0; j < shard_local_blocks(cap, shard, n); ++j) {
            const int64_t b = shard_global_block(cap, shard, j);
            ASSERT_GT(b, previous); // a rank's blocks stay in global order
            ASSERT_LT(b, n);
            ASSERT_EQ(owner[b], -1) << "block " << b << " on two ranks";
            owner[b] = rank, previous = b;
          }
        }
        for (int64_t b = 0; b < n; ++b) ASSERT_NE(owner[b], -1) << "block " << b << " unowned";
      }
}

TEST(Api, ShardFormulasAreContiguousSpansAndRoundRobin) {
  // 1000 blocks over 3 ranks: contiguous spans of ceil(1000 / 3) = 334 blocks, or b % 3.
  const Capacities cap{4, 64, 1000};
  const auto shard = [](int rank, ShardMode mode) { return ContextShard{rank, 3, mode}; };
  const ShardMode contiguous = ShardMode::contiguous, round_robin = ShardMode::round_robin;
  EXPECT_EQ(shard_span(cap, shard(0, contiguous)), 334);
  EXPECT_EQ(shard_global_block(cap, shard(0, contiguous), 5), 5);
  EXPECT_EQ(shard_global_block(cap, shard(1, contiguous), 0), 334);
  EXPECT_EQ(shard_global_block(cap, shard(2, contiguous), 331), 999);
  EXPECT_EQ(shard_local_blocks(cap, shard(0, contiguous), 500), 334);
  EXPECT_EQ(shard_local_blocks(cap, shard(1, contiguous), 500), 166);
  EXPECT_EQ(shard_local_blocks(cap, shard(2, contiguous), 500), 0);
  EXPECT_EQ(shard_local_blocks(cap, shard(2, contiguous), 1000), 332);
  EXPECT_EQ(shard_global_block(cap, shard(1, round_robin), 0), 1);
  EXPECT_EQ(shard_global_block(cap, shard(2, round_robin), 5), 17);
  EXPECT_EQ(shard_local_blocks(cap, shard(0, round_robin), 1000), 334);
  EXPECT_EQ(shard_local_blocks(cap, shard(2, round_robin), 500), 166);
  EXPECT_EQ(shard_local_blocks(cap, shard(2, round_robin), 2), 0);
}

TEST(Api, ContextParallelIndexerIsCudaOnlyAndChecksItsShard) {
  PlanRequest request = small_request(OpKind::index_topk, Backend::cpu);
  ContextParallelPlan plan;
  Status s = make_context_parallel_plan(request, {0, 2, ShardMode::contiguous}, &plan);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
  EXPECT_EQ(s.message().rfind("m3sa::context_parallel_index_topk: ", 0), 0u) << s.message();
  request.backend = Backend::cuda;
  s = make_context_parallel_plan(request, {2, 2, ShardMode::contiguous}, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("shard.rank"), std::string::npos) << s.to_string();
  EXPECT_EQ(s.message().rfind("m3sa::context_parallel_index_topk: shard.rank: expected", 0), 0u)
      << s.message();
  // One past each end of the shard's ranges.
  s = make_context_parallel_plan(request, {-1, 2, ShardMode::contiguous}, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_EQ(s.message(), "m3sa::context_parallel_index_topk: shard.rank: expected 0..num_ranks-1 "
                         "(1), got -1");
  s = make_context_parallel_plan(request, {0, 1025, ShardMode::round_robin}, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_EQ(s.message(), "m3sa::context_parallel_index_topk: shard.num_ranks: expected 1..1024, "
                         "got 1025");
  s = make_context_parallel_plan(request, {0, 0, ShardMode::round_robin}, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("shard.num_ranks: expected 1..1024, got 0"), std::string::npos)
      << s.message();
}

TEST(Api, PlansNameTheirImplementationAndCanAskForOne) {
  OpPlan plan;
  M3SA_ASSERT_OK(make_plan(small_request(OpKind::index_topk, Backend::cpu), &plan));
  EXPECT_STREQ(implementation_name(plan), "cpu.index_topk");
  EXPECT_EQ(plan.plan_info_version, 1u);
  PlanRequest named = small_request(OpKind::index_topk, Backend::cpu);
  named.implementation = "reference.index_topk";
  M3SA_ASSERT_OK(make_plan(named, &plan));
  EXPECT_STREQ(implementation_name(plan), "reference.index_topk");
  EXPECT_EQ(plan.request.backend, Backend::reference);
  named.implementation = "cpu.index_topk.nonexistent";
  const Status s = make_plan(named, &plan);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
  EXPECT_NE(s.message().find("available: reference.index_topk, cpu.index_topk"), std::string::npos)
      << s.message();
  EXPECT_STREQ(implementation_name(OpPlan{}), "");
  int listed = 0;
  for (int i = 0; i < implementation_count(); ++i)
    listed += std::string(implementation_info(i).name) == "cpu.index_topk";
  EXPECT_EQ(listed, 1);
}

// An unnamed request's plan still names its implementation in request.implementation (m3sa/ops.h),
// and a named implementation must be one of the requested op: another op's is no such
// implementation, however well it would run the config.
TEST(Api, PlansCarryTheChosenNameAndRefuseAnotherOpsImplementation) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (OpKind op : kEveryOp) {
      OpPlan plan;
      M3SA_ASSERT_OK(make_plan(small_request(op, backend), &plan));
      const std::string want = implementation_name(backend, op);
      ASSERT_NE(plan.request.implementation, nullptr) << want;
      EXPECT_EQ(std::string(plan.request.implementation), want);
      EXPECT_EQ(plan.request.backend, backend) << want;
    }
  PlanRequest foreign = small_request(OpKind::index_topk, Backend::cpu);
  foreign.implementation = "cpu.score_blocks";
  OpPlan plan;
  const Status s = make_plan(foreign, &plan);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
  EXPECT_NE(s.message().find("no such implementation of index_topk"), std::string::npos)
      << s.message();
  EXPECT_EQ(plan.implementation, -1);
}

// The seal covers every capacity a run sizes its work by: a plan whose capacities were edited
// after make_plan is refused by the entry points.
TEST(Api, EditedCapacitiesBreakThePlansSeal) {
  OpPlan plan;
  M3SA_ASSERT_OK(make_plan(small_request(OpKind::index_topk, Backend::cpu), &plan));
  std::vector<std::byte> memory;
  void* aligned = aligned_workspace(memory, plan.workspace_bytes);
  ASSERT_NE(aligned, nullptr);
  const Workspace ws{aligned, plan.workspace_bytes};
  M3SA_ASSERT_OK(prepare_workspace(plan, ws));
  for (int field = 0; field < 3; ++field) {
    OpPlan edited = plan;
    Capacities& c = edited.request.capacities;
    (field == 0 ? c.max_requests : field == 1 ? c.max_tokens : c.max_blocks_per_request) += 1;
    const Status s = prepare_workspace(edited, ws);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << "field " << field;
    EXPECT_EQ(s.message().rfind("m3sa::index_topk: plan: expected a plan as make_plan made it", 0),
              0u)
        << s.message();
  }
}

// Below the limits too: top_k 0 or no index head is a config no implementation runs, and the
// refusal names each implementation that missed it.
TEST(Api, HostBackendsRefuseConfigsBelowTheLimitsNamingTheImplementation) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (OpKind op : kEveryOp)
      for (const auto& [top_k, heads, field] :
           {std::tuple{0, 1, "config.top_k 0"}, std::tuple{16, 0, "config.num_index_heads 0"}}) {
        MsaConfig config;
        config.top_k = top_k;
        config.num_index_heads = heads;
        const Status s = supports(backend, op, config);
        EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
        const std::string name = implementation_name(backend, op);
        EXPECT_NE(s.message().find(name + ": " + field), std::string::npos) << s.message();
      }
}

// The names and sizes of the value types (m3sa/status.h, m3sa/types.h).
TEST(Api, StatusCodesAndDtypesHaveTheirNamesAndSizes) {
  EXPECT_STREQ(to_string(StatusCode::ok), "ok");
  EXPECT_STREQ(to_string(StatusCode::invalid_argument), "invalid_argument");
  EXPECT_STREQ(to_string(StatusCode::unsupported), "unsupported");
  EXPECT_STREQ(to_string(StatusCode::cuda_error), "cuda_error");
  EXPECT_STREQ(to_string(StatusCode::internal), "internal");
  EXPECT_EQ(Status::unsupported("backend cpu", "no").to_string(),
            "unsupported: backend cpu: unsupported: no");
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
}

TEST(Api, UnplannedOrForeignPlansAreRejected) {
  SyntheticBatch sb({{1}, {10}, 1, 1, 1});
  MsaConfig config;
  config.num_index_heads = 1;
  PlannedOp planned(plan_request(OpKind::index_topk, config, sb, {}));
  M3SA_ASSERT_OK(planned.status);
  HostTensor topk(DType::i32, {1, 1, 16});
  const IndexTopkArgs args{sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()};
  OpPlan stale = planned.plan;
  stale.plan_info_version = 99;
  Status s = index_topk(stale, args, planned.workspace());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("plan_info version"), std::string::npos) << s.message();
  OpPlan unplanned = planned.plan;
  unplanned.implementation = -1;
  s = index_topk(unplanned, args, planned.workspace());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
}

TEST(Api, VersionAndCommitAreReported) {
  EXPECT_STREQ(version_string(), "0.1.0");
  EXPECT_EQ(std::string(version_string()), std::to_string(kVersionMajor) + "." +
                                               std::to_string(kVersionMinor) + "." +
                                               std::to_string(kVersionPatch));
  EXPECT_NE(std::string(build_commit()), "");
}

} // namespace
} // namespace m3sa::testing
