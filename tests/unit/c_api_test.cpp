// The C API (m3sa/c_api.h, the shared library libm3sa_c) against the C++ API it wraps: the same
// plans, the same bytes out of every op, the same messages, and errors for every C value the C++
// types cannot hold (an int outside an enum's list, a null struct). This binary also links the
// static library, so it runs with two copies of m3sa in one process: what an engine that loads
// libm3sa_c beside its own m3sa gets.
#include "m3sa/c_api.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "support/c_views.h"
#include "support/test_util.h"
#include "testing/norm_rope_batch.h"

namespace m3sa::testing {
namespace {

// A C plan with its workspace, planned from the request the C++ side uses.
struct CPlanned {
  m3sa_plan plan = {};
  HostTensor workspace;
  m3sa_status status = M3SA_INTERNAL;
  explicit CPlanned(const PlanRequest& request) {
    const m3sa_plan_request c = c_request(request);
    status = m3sa_make_plan(&c, &plan);
    if (status != M3SA_OK) return;
    workspace.reset(DType::i32, {static_cast<int64_t>(plan.workspace_bytes / 4 + 16)});
    status = m3sa_prepare_workspace(&plan, ws(), nullptr);
  }
  m3sa_workspace ws() const { return {workspace.view().data, workspace.bytes()}; }
};

#define EXPECT_C_OK(expr)                                                                          \
  do {                                                                                             \
    const m3sa_status c_status_ = (expr);                                                          \
    EXPECT_EQ(c_status_, M3SA_OK) << m3sa_last_error_message();                                    \
  } while (0)
#define ASSERT_C_OK(expr)                                                                          \
  do {                                                                                             \
    const m3sa_status c_status_ = (expr);                                                          \
    ASSERT_EQ(c_status_, M3SA_OK) << m3sa_last_error_message();                                    \
  } while (0)

// MTP decode rows (q_len 2), a padding row, prefill chunks with and without a prefix.
BatchSpec mixed_spec(DType index_dtype, DType kv_dtype, uint64_t seed) {
  BatchSpec spec;
  spec.q_lens = {2, 2, 2, 37, 150};
  spec.seq_lens = {3000, 129, 0, 2600, 150};
  spec.num_decode = 3;
  spec.decode_q_len = 2;
  spec.index_heads = 2;
  spec.index_dtype = index_dtype;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.kv_dtype = kv_dtype;
  spec.extra_columns = 3;
  spec.seed = seed;
  return spec;
}

MsaConfig two_heads() {
  MsaConfig c;
  c.num_index_heads = 2;
  return c;
}

TEST(CApi, ReportsTheLibraryItWraps) {
  EXPECT_EQ(m3sa_c_api_version(), M3SA_C_API_VERSION);
  EXPECT_STREQ(m3sa_version_string(), version_string());
  EXPECT_STREQ(m3sa_build_commit(), build_commit());
  EXPECT_EQ(m3sa_cuda_backend_built(), cuda_backend_built() ? 1 : 0);
  EXPECT_EQ(m3sa_cuda_device_count(), cuda_device_count());
}

TEST(CApi, DefaultsAreTheCppDefaults) {
  m3sa_config config;
  std::memset(&config, 0x5a, sizeof config);
  m3sa_config_init(&config);
  const MsaConfig want;
  EXPECT_EQ(config.top_k, want.top_k);
  EXPECT_EQ(config.local_blocks, want.local_blocks);
  EXPECT_EQ(config.init_blocks, want.init_blocks);
  EXPECT_EQ(config.num_index_heads, want.num_index_heads);
  EXPECT_EQ(config.score_scale, want.score_scale);
  EXPECT_EQ(config.reduce_heads, 0);
  EXPECT_EQ(config.rms_norm_eps, want.rms_norm_eps);
  EXPECT_EQ(config.norm_weight_offset, want.norm_weight_offset);
  EXPECT_EQ(config.rope_theta, want.rope_theta);

  m3sa_plan_request request;
  std::memset(&request, 0x5a, sizeof request);
  m3sa_plan_request_init(&request);
  const PlanRequest cpp;
  EXPECT_EQ(request.op, static_cast<int32_t>(cpp.op));
  EXPECT_EQ(request.backend, static_cast<int32_t>(cpp.backend));
  EXPECT_EQ(request.cache_dtype, static_cast<int32_t>(cpp.cache_dtype));
  EXPECT_EQ(request.capacities.max_requests, 0);
  EXPECT_EQ(request.num_threads, 0);
  EXPECT_EQ(request.device_ordinal, 0);
  EXPECT_EQ(request.implementation, nullptr);
  EXPECT_EQ(std::memcmp(&request.config, &config, sizeof config), 0);
  m3sa_config_init(nullptr); // ignored, as documented by "nothing here aborts"
  m3sa_plan_request_init(nullptr);
}

TEST(CApi, NamesEveryEnumValueAndNothingElse) {
  for (int v = 0; v <= 4; ++v) {
    EXPECT_STREQ(m3sa_dtype_name(v), to_string(static_cast<DType>(v)));
    EXPECT_EQ(m3sa_dtype_size(v), dtype_size(static_cast<DType>(v)));
    EXPECT_STREQ(m3sa_status_name(v), to_string(static_cast<StatusCode>(v)));
  }
  for (int v = 0; v <= 2; ++v)
    EXPECT_STREQ(m3sa_backend_name(v), to_string(static_cast<Backend>(v)));
  for (int v = 0; v <= 5; ++v) EXPECT_STREQ(m3sa_op_name(v), to_string(static_cast<OpKind>(v)));
  for (int bad : {-1, 5, 6, 255, 1 << 30}) {
    EXPECT_STREQ(m3sa_dtype_name(bad), "unknown");
    EXPECT_EQ(m3sa_dtype_size(bad), 0u);
    EXPECT_STREQ(m3sa_status_name(bad), "unknown");
  }
  EXPECT_STREQ(m3sa_backend_name(3), "unknown");
  EXPECT_STREQ(m3sa_op_name(6), "unknown");
  EXPECT_STREQ(m3sa_op_name(-1), "unknown");
}

TEST(CApi, RegistryAnswersAsTheCppRegistry) {
  ASSERT_EQ(m3sa_implementation_count(), implementation_count());
  for (int i = 0; i < implementation_count(); ++i) {
    m3sa_implementation_info info;
    ASSERT_C_OK(m3sa_implementation_info_at(i, &info));
    const ImplementationInfo want = implementation_info(i);
    EXPECT_STREQ(info.name, want.name);
    EXPECT_STREQ(info.description, want.description);
    EXPECT_EQ(info.backend, static_cast<int32_t>(want.backend));
    EXPECT_EQ(info.op, static_cast<int32_t>(want.op));
  }
  m3sa_implementation_info info;
  EXPECT_EQ(m3sa_implementation_info_at(implementation_count(), &info), M3SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3sa_last_error_message()).find("index: expected 0.."), std::string::npos)
      << m3sa_last_error_message();
  EXPECT_EQ(m3sa_implementation_info_at(-1, &info), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_implementation_info_at(0, nullptr), M3SA_INVALID_ARGUMENT);

  for (int backend = 0; backend <= 2; ++backend)
    for (int op = 0; op <= 5; ++op)
      for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
        MsaConfig config;
        config.top_k = 32;
        const m3sa_config c = c_config(config);
        const Status want =
            supports(static_cast<Backend>(backend), static_cast<OpKind>(op), config, dtype);
        EXPECT_EQ(m3sa_supports(backend, op, &c, static_cast<int32_t>(dtype)),
                  static_cast<m3sa_status>(want.code()));
        EXPECT_EQ(m3sa_last_error_message(), want.ok() ? std::string() : want.to_string());
      }
  const m3sa_config defaults = c_config(MsaConfig{});
  EXPECT_EQ(m3sa_best_available_backend(&defaults, M3SA_DTYPE_BF16),
            static_cast<int32_t>(best_available_backend(MsaConfig{})));
  EXPECT_EQ(m3sa_best_available_backend(nullptr, M3SA_DTYPE_BF16), M3SA_BACKEND_CPU);
  EXPECT_EQ(m3sa_supports(M3SA_BACKEND_CPU, M3SA_OP_INDEX_TOPK, nullptr, M3SA_DTYPE_BF16),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_supports(3, M3SA_OP_INDEX_TOPK, &defaults, M3SA_DTYPE_BF16),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: backend: expected one of 0..2, got 3");
  // A dtype the C API knows but no cache takes: refused as the C++ supports refuses it.
  EXPECT_EQ(m3sa_supports(M3SA_BACKEND_CPU, M3SA_OP_INDEX_TOPK, &defaults, M3SA_DTYPE_F32),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: backend cpu, op index_topk: cache_dtype: expected bf16 or "
            "fp8_e4m3, got f32");
  EXPECT_EQ(m3sa_best_available_backend(&defaults, M3SA_DTYPE_F32), M3SA_BACKEND_CPU);
}

// Every plan field - the sealed ones included - is what the C++ make_plan gives, for a config with
// no field at its default (the seal hashes them all, so a field the conversion drops shows).
TEST(CApi, PlansAreTheCppPlans) {
  const SyntheticBatch sb(mixed_spec(DType::bf16, DType::bf16, 3));
  MsaConfig config;
  config.top_k = 8;
  config.local_blocks = 2;
  config.init_blocks = 1;
  config.num_index_heads = 2;
  config.score_scale = 0.5f;
  config.reduce_heads = true;
  config.rms_norm_eps = 1e-5f;
  config.norm_weight_offset = 0.f;
  config.rope_theta = 1e4;
  for (int op = 0; op <= 5; ++op)
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      SCOPED_TRACE(std::string(to_string(static_cast<OpKind>(op))) + " " + to_string(backend));
      PlanRequest request = plan_request(static_cast<OpKind>(op), config, sb, {backend, 2});
      request.cache_dtype = DType::fp8_e4m3;
      request.device_ordinal = 0;
      OpPlan want;
      M3SA_ASSERT_OK(make_plan(request, &want));
      const m3sa_plan_request c = c_request(request);
      m3sa_plan got;
      ASSERT_C_OK(m3sa_make_plan(&c, &got));
      EXPECT_STREQ(m3sa_last_error_message(), "");
      EXPECT_EQ(got.implementation, want.implementation);
      EXPECT_EQ(got.num_threads, want.num_threads);
      EXPECT_EQ(got.workspace_bytes, want.workspace_bytes);
      EXPECT_EQ(got.plan_info_version, want.plan_info_version);
      for (int i = 0; i < M3SA_PLAN_INFO_SIZE; ++i) EXPECT_EQ(got.plan_info[i], want.plan_info[i]);
      EXPECT_STREQ(got.request.implementation, want.request.implementation);
      EXPECT_STREQ(m3sa_plan_implementation_name(&got), implementation_name(want));
      EXPECT_EQ(got.request.backend, static_cast<int32_t>(want.request.backend));
      const m3sa_plan_request back = c_request(want.request);
      EXPECT_EQ(std::memcmp(&got.request.config, &back.config, sizeof back.config), 0);
      EXPECT_EQ(got.request.cache_dtype, back.cache_dtype);
      EXPECT_EQ(got.request.num_threads, back.num_threads);
      // The plan runs: the C side hands back exactly what was sealed.
      HostTensor workspace(DType::i32, {static_cast<int64_t>(got.workspace_bytes / 4 + 16)});
      EXPECT_C_OK(
          m3sa_prepare_workspace(&got, {workspace.view().data, workspace.bytes()}, nullptr));
    }
}

// Runs every op through both APIs on the same inputs, outputs poisoned alike, and compares bytes.
TEST(CApi, EveryOpWritesTheBytesTheCppOpWrites) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MsaConfig config = two_heads();
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    SyntheticBatch sb(mixed_spec(dtype, dtype, seed));
    M3SA_ASSERT_OK(sb.status());
    sb.fill_index_random(seed);
    sb.fill_attention_random(seed + 1);
    const RunOptions options{Backend::cpu, 2};

    // The C call of `op` on its own C plan into a poisoned tensor shaped like `like`.
    const auto c_result = [&](OpKind op, const HostTensor& like, auto&& call) {
      HostTensor got = HostTensor::shaped_like(like.view());
      got.fill_bytes(0xa5);
      CPlanned p(plan_request(op, config, sb, options));
      EXPECT_EQ(p.status, M3SA_OK) << m3sa_last_error_message();
      EXPECT_EQ(call(p, got.view()), M3SA_OK) << to_string(op) << ": " << m3sa_last_error_message();
      return got;
    };
    HostTensor want_topk, want_scores, want_selected;
    M3SA_ASSERT_OK(run_index_topk(config, sb, options, &want_topk));
    EXPECT_TRUE(same_bytes(
        want_topk, c_result(OpKind::index_topk, want_topk, [&](const CPlanned& p, TensorView out) {
          const m3sa_index_topk_args args =
              c_args(IndexTopkArgs{sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), out});
          return m3sa_index_topk(&p.plan, &args, p.ws(), nullptr);
        })));
    M3SA_ASSERT_OK(run_score_blocks(config, sb, options, &want_scores));
    EXPECT_TRUE(same_bytes(
        want_scores,
        c_result(OpKind::score_blocks, want_scores, [&](const CPlanned& p, TensorView out) {
          const m3sa_score_blocks_args args = {c_view(sb.index_q.view()),
                                               c_view(sb.index_k_cache.view()), c_batch(sb.batch()),
                                               c_view(out)};
          return m3sa_score_blocks(&p.plan, &args, p.ws(), nullptr);
        })));
    M3SA_ASSERT_OK(run_select_topk_blocks(config, sb, want_scores, options, &want_selected));
    EXPECT_TRUE(same_bytes(
        want_selected,
        c_result(OpKind::select_topk_blocks, want_selected, [&](const CPlanned& p, TensorView out) {
          const m3sa_select_topk_blocks_args args = {c_view(want_scores.view()),
                                                     c_batch(sb.batch()), c_view(out)};
          return m3sa_select_topk_blocks(&p.plan, &args, p.ws(), nullptr);
        })));

    // sparse_attention with its own KV block table, lse and scales (k 0.5, v 2)
    HostTensor want_out(DType::bf16, {sb.num_tokens(), 8, kHeadDim});
    HostTensor want_lse(DType::f32, {sb.num_tokens(), 8});
    HostTensor got_out = HostTensor::shaped_like(want_out.view());
    HostTensor got_lse = HostTensor::shaped_like(want_lse.view());
    for (const HostTensor* t : {&want_out, &want_lse, &got_out, &got_lse}) t->fill_bytes(0xa5);
    const PlanRequest attention_request =
        plan_request(OpKind::sparse_attention, config, sb, options);
    {
      PlannedOp cpp(attention_request);
      M3SA_ASSERT_OK(cpp.status);
      SparseAttentionArgs args = attention_args(sb, want_topk, want_out, want_lse, true);
      args.k_scale = 0.5f;
      args.v_scale = 2.f;
      M3SA_ASSERT_OK(sparse_attention(cpp.plan, args, cpp.workspace(), {2, nullptr}));
    }
    {
      CPlanned p(attention_request);
      ASSERT_C_OK(p.status);
      SparseAttentionArgs cpp = attention_args(sb, want_topk, got_out, got_lse, true);
      cpp.k_scale = 0.5f;
      cpp.v_scale = 2.f;
      const m3sa_sparse_attention_args args = c_args(cpp);
      const m3sa_exec_context ctx = {2, nullptr};
      ASSERT_C_OK(m3sa_sparse_attention(&p.plan, &args, p.ws(), &ctx));
    }
    EXPECT_TRUE(same_bytes(want_out, got_out));
    EXPECT_TRUE(same_bytes(want_lse, got_lse));
  }
}

TEST(CApi, WritesTheCachesTheCppInsertsWrite) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    NormRopeSpec spec;
    spec.kv_dtype = dtype;
    spec.index_dtype = dtype;
    spec.k_scale = 0.75f;
    spec.v_scale = 1.5f;
    spec.seed = seed;
    NormRopeBatch want(spec), got(spec);
    M3SA_ASSERT_OK(want.status());
    M3SA_ASSERT_OK(got.status());
    MsaConfig config;
    config.num_index_heads = spec.index_heads;
    want.poison_outputs();
    got.poison_outputs();
    M3SA_ASSERT_OK(run_norm_rope_insert(config, want, Backend::cpu, 2));
    PlanRequest request;
    request.op = OpKind::norm_rope_insert;
    request.backend = Backend::cpu;
    request.config = config;
    request.capacities = {1, spec.tokens, 1};
    request.cache_dtype = dtype;
    request.num_threads = 2;
    CPlanned p(request);
    ASSERT_C_OK(p.status);
    const NormRopeInsertArgs a = got.args();
    const m3sa_norm_rope_insert_args args = {c_view(a.q),
                                             c_view(a.k),
                                             c_view(a.v),
                                             c_view(a.index_q),
                                             c_view(a.index_k),
                                             c_view(a.positions),
                                             c_view(a.q_norm_weight),
                                             c_view(a.k_norm_weight),
                                             c_view(a.index_q_norm_weight),
                                             c_view(a.index_k_norm_weight),
                                             c_view(a.cos_sin_cache),
                                             c_view(a.slot_mapping),
                                             c_view(a.index_slot_mapping),
                                             c_view(a.q_out),
                                             c_view(a.k_cache),
                                             c_view(a.v_cache),
                                             a.k_scale,
                                             a.v_scale,
                                             c_view(a.index_q_out),
                                             c_view(a.index_k_cache)};
    ASSERT_C_OK(m3sa_norm_rope_insert(&p.plan, &args, p.ws(), nullptr));
    EXPECT_TRUE(same_bytes(want.q_out, got.q_out));
    EXPECT_TRUE(same_bytes(want.k_cache, got.k_cache));
    EXPECT_TRUE(same_bytes(want.v_cache, got.v_cache));
    EXPECT_TRUE(same_bytes(want.index_q_out, got.index_q_out));
    EXPECT_TRUE(same_bytes(want.index_k_cache, got.index_k_cache));

    // insert_index_k: the index-K rows of the same batch into a fresh cache, both APIs.
    request.op = OpKind::insert_index_k;
    OpPlan cpp_plan;
    M3SA_ASSERT_OK(make_plan(request, &cpp_plan));
    HostTensor cpp_cache = HostTensor::shaped_like(want.index_k_cache.view());
    HostTensor c_cache = HostTensor::shaped_like(want.index_k_cache.view());
    cpp_cache.fill_bytes(0x11);
    c_cache.fill_bytes(0x11);
    M3SA_ASSERT_OK(insert_index_k(
        cpp_plan, {want.index_k.view(), want.index_slot_mapping.view(), cpp_cache.view()}, {}));
    CPlanned insert(request);
    ASSERT_C_OK(insert.status);
    const m3sa_insert_index_k_args insert_args = {c_view(want.index_k.view()),
                                                  c_view(want.index_slot_mapping.view()),
                                                  c_view(c_cache.view())};
    ASSERT_C_OK(m3sa_insert_index_k(&insert.plan, &insert_args, insert.ws(), nullptr));
    EXPECT_TRUE(same_bytes(cpp_cache, c_cache));
  }
}

// A shape the C++ validation rejects gives the C++ message word for word; values no C++ type can
// hold are rejected before any conversion, naming the C field.
TEST(CApi, ErrorsAreValuesNamingTheField) {
  const MsaConfig config = two_heads();
  SyntheticBatch sb(mixed_spec(DType::bf16, DType::bf16, 5));
  M3SA_ASSERT_OK(sb.status());
  sb.fill_index_random(5);
  const PlanRequest request = plan_request(OpKind::index_topk, config, sb, {Backend::cpu, 1});
  CPlanned p(request);
  ASSERT_C_OK(p.status);
  HostTensor topk(DType::i32, {2, sb.num_tokens(), 15}); // K 15 for a plan of 16
  const IndexTopkArgs cpp_args{sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()};
  OpPlan cpp_plan;
  M3SA_ASSERT_OK(make_plan(request, &cpp_plan));
  const Status want = index_topk(cpp_plan, cpp_args, {p.ws().data, p.ws().bytes});
  ASSERT_EQ(want.code(), StatusCode::invalid_argument);
  const m3sa_index_topk_args good = {c_view(sb.index_q.view()), c_view(sb.index_k_cache.view()),
                                     c_batch(sb.batch()), c_view(topk.view())};
  EXPECT_EQ(m3sa_index_topk(&p.plan, &good, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()), want.to_string());

  auto expect_rejected = [&](m3sa_index_topk_args args, const std::string& field) {
    EXPECT_EQ(m3sa_index_topk(&p.plan, &args, p.ws(), nullptr), M3SA_INVALID_ARGUMENT) << field;
    const std::string message = m3sa_last_error_message();
    EXPECT_EQ(message.rfind("invalid_argument: m3sa::index_topk: " + field + ": expected ", 0), 0u)
        << message;
  };
  m3sa_index_topk_args args = good;
  args.topk.dtype = 5;
  expect_rejected(args, "topk.dtype");
  args = good;
  args.topk.dtype = -1;
  expect_rejected(args, "topk.dtype");
  args = good;
  args.index_q.rank = 5;
  expect_rejected(args, "index_q.rank");
  args = good;
  args.index_k_cache.device_kind = 2;
  expect_rejected(args, "index_k_cache.device_kind");
  args = good;
  args.batch.seq_lens.dtype = 100;
  expect_rejected(args, "batch.seq_lens.dtype");
  args = good;
  args.batch.block_table.rank = -1;
  expect_rejected(args, "batch.block_table.rank");

  // Fields the C++ validation judges: the C call must hand them over as they are.
  auto expect_cpp_message = [&](const IndexTopkArgs& cpp, const m3sa_index_topk_args& c,
                                const ExecContext& cpp_ctx, const m3sa_exec_context* c_ctx) {
    const Status cpp_status = index_topk(cpp_plan, cpp, {p.ws().data, p.ws().bytes}, cpp_ctx);
    ASSERT_FALSE(cpp_status.ok());
    EXPECT_EQ(m3sa_index_topk(&p.plan, &c, p.ws(), c_ctx),
              static_cast<m3sa_status>(cpp_status.code()));
    EXPECT_EQ(std::string(m3sa_last_error_message()), cpp_status.to_string());
  };
  HostTensor right_topk(DType::i32, {2, sb.num_tokens(), 16});
  IndexTopkArgs cpp_on_gpu{sb.index_q.view(), sb.index_k_cache.view(), sb.batch(),
                           right_topk.view()};
  cpp_on_gpu.topk.device = {DeviceKind::cuda, 3};
  m3sa_index_topk_args c_on_gpu = good;
  c_on_gpu.topk = c_view(cpp_on_gpu.topk);
  expect_cpp_message(cpp_on_gpu, c_on_gpu, {}, nullptr); // "... on cuda:3"
  const int negative_threads = -1;
  IndexTopkArgs cpp_right = cpp_on_gpu;
  cpp_right.topk.device = {};
  m3sa_index_topk_args c_right = good;
  c_right.topk = c_view(cpp_right.topk);
  const m3sa_exec_context c_threads = {negative_threads, nullptr};
  expect_cpp_message(cpp_right, c_right, {negative_threads, nullptr}, &c_threads);
  EXPECT_C_OK(m3sa_index_topk(&p.plan, &c_right, p.ws(), nullptr));

  EXPECT_EQ(m3sa_index_topk(&p.plan, nullptr, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: m3sa::index_topk: args: expected a non-null m3sa_index_topk_args*, "
            "got NULL");
  EXPECT_EQ(m3sa_index_topk(nullptr, &good, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_sparse_attention(&p.plan, nullptr, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  // A plan for another op is the C++ layer's error, named the same way.
  m3sa_sparse_attention_args attention = {};
  EXPECT_EQ(m3sa_sparse_attention(&p.plan, &attention, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(m3sa_last_error_message()).find("sparse_attention"), std::string::npos)
      << m3sa_last_error_message();

  // Requests: every enum-typed field, and the bool.
  m3sa_plan plan;
  // Named as the C++ make_plan names them, after the op (or "unknown-op").
  auto expect_request_rejected = [&](m3sa_plan_request r, const std::string& op,
                                     const std::string& field) {
    EXPECT_EQ(m3sa_make_plan(&r, &plan), M3SA_INVALID_ARGUMENT) << field;
    const std::string message = m3sa_last_error_message();
    EXPECT_EQ(message.rfind("invalid_argument: m3sa::" + op + ": " + field + ": expected ", 0), 0u)
        << message;
  };
  const m3sa_plan_request base = c_request(request);
  m3sa_plan_request r = base;
  r.op = 6;
  expect_request_rejected(r, "unknown-op", "op");
  r = base;
  r.backend = -3;
  expect_request_rejected(r, "index_topk", "backend");
  r = base;
  r.cache_dtype = 9;
  expect_request_rejected(r, "index_topk", "cache_dtype");
  r = base;
  r.config.reduce_heads = 2;
  expect_request_rejected(r, "index_topk", "config.reduce_heads");
  EXPECT_EQ(m3sa_make_plan(nullptr, &plan), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_make_plan(&base, nullptr), M3SA_INVALID_ARGUMENT);
  // In range for C but not for the model: the C++ plan's own check and message.
  r = base;
  r.config.top_k = 0;
  PlanRequest cpp_request = request;
  cpp_request.config.top_k = 0;
  OpPlan unused;
  const Status want_plan = make_plan(cpp_request, &unused);
  EXPECT_EQ(m3sa_make_plan(&r, &plan), static_cast<m3sa_status>(want_plan.code()));
  EXPECT_EQ(std::string(m3sa_last_error_message()), want_plan.to_string());
  // A name that is not an implementation.
  r = base;
  r.implementation = "cpu.no_such_thing";
  EXPECT_EQ(m3sa_make_plan(&r, &plan), M3SA_UNSUPPORTED);
  EXPECT_NE(std::string(m3sa_last_error_message()).find("cpu.no_such_thing"), std::string::npos);

  // A success clears the message.
  ASSERT_C_OK(m3sa_make_plan(&base, &plan));
  EXPECT_STREQ(m3sa_last_error_message(), "");
  int32_t flags = -1;
  EXPECT_C_OK(m3sa_read_device_errors(&plan, p.ws(), nullptr, &flags));
  EXPECT_EQ(flags, 0);
  EXPECT_EQ(m3sa_read_device_errors(&plan, p.ws(), nullptr, nullptr), M3SA_INVALID_ARGUMENT);
}

// A plan is sealed by make_plan: a field edited on the C side is caught like one edited in C++.
TEST(CApi, EditedPlansAreRejected) {
  SyntheticBatch sb(mixed_spec(DType::bf16, DType::bf16, 7));
  M3SA_ASSERT_OK(sb.status());
  CPlanned p(plan_request(OpKind::index_topk, two_heads(), sb, {Backend::cpu, 1}));
  ASSERT_C_OK(p.status);
  auto expect_edit_caught = [&](m3sa_plan edited, const char* what) {
    EXPECT_NE(m3sa_prepare_workspace(&edited, p.ws(), nullptr), M3SA_OK) << what;
    EXPECT_NE(std::string(m3sa_last_error_message()).find("plan"), std::string::npos)
        << what << ": " << m3sa_last_error_message();
  };
  m3sa_plan edited = p.plan;
  edited.workspace_bytes /= 2;
  expect_edit_caught(edited, "workspace_bytes");
  edited = p.plan;
  edited.request.config.top_k = 8;
  expect_edit_caught(edited, "top_k");
  edited = p.plan;
  edited.plan_info[0] += 1;
  expect_edit_caught(edited, "plan_info[0]");
  edited = p.plan;
  edited.implementation = 100000;
  expect_edit_caught(edited, "implementation");
  edited = p.plan;
  edited.request.op = 77;
  expect_edit_caught(edited, "request.op");
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: m3sa::unknown-op: plan.request.op: expected one of 0..5, got 77");
  const m3sa_index_topk_args no_args = {};
  EXPECT_EQ(m3sa_index_topk(&edited, &no_args, p.ws(), nullptr), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: m3sa::index_topk: plan.request.op: expected one of 0..5, got 77");
  EXPECT_C_OK(m3sa_prepare_workspace(&p.plan, p.ws(), nullptr));
  // A workspace too small for the plan.
  EXPECT_EQ(m3sa_prepare_workspace(&p.plan, {p.ws().data, 1}, nullptr), M3SA_INVALID_ARGUMENT);
}

// The message belongs to the thread whose call failed.
TEST(CApi, LastErrorMessageIsPerThread) {
  m3sa_plan plan;
  ASSERT_EQ(m3sa_make_plan(nullptr, &plan), M3SA_INVALID_ARGUMENT);
  const std::string mine = m3sa_last_error_message();
  std::string other_before, other_after;
  std::thread other([&] {
    other_before = m3sa_last_error_message();
    m3sa_config config;
    m3sa_config_init(&config);
    (void)m3sa_supports(M3SA_BACKEND_CPU, 42, &config, M3SA_DTYPE_BF16);
    other_after = m3sa_last_error_message();
  });
  other.join();
  EXPECT_EQ(other_before, "");
  EXPECT_EQ(other_after, "invalid_argument: op: expected one of 0..5, got 42"); // not an op call
  EXPECT_EQ(std::string(m3sa_last_error_message()), mine);
  EXPECT_EQ(mine, "invalid_argument: request: expected a non-null m3sa_plan_request*, got NULL");
}

TEST(CApi, ContiguousViewsAndTheirLimits) {
  const int64_t shape[3] = {2, 3, 4};
  m3sa_tensor_view v;
  ASSERT_C_OK(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 3, shape, &v));
  const TensorView want = TensorView::contiguous(nullptr, DType::bf16, {2, 3, 4});
  const m3sa_tensor_view expected = c_view(want);
  EXPECT_EQ(std::memcmp(&v, &expected, sizeof v), 0);
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, 7, 3, shape, &v), M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 5, shape, &v),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 3, nullptr, &v),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 3, shape, nullptr),
            M3SA_INVALID_ARGUMENT);
  const int64_t negative[2] = {4, -1};
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 2, negative, &v),
            M3SA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(m3sa_last_error_message()),
            "invalid_argument: shape[1]: expected >= 0, got -1");
  const int64_t huge[3] = {int64_t{1} << 40, int64_t{1} << 40, 1};
  EXPECT_EQ(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_BF16, 3, huge, &v),
            M3SA_INVALID_ARGUMENT);
  const int64_t empty[2] = {0, int64_t{1} << 62};
  EXPECT_C_OK(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_F32, 2, empty, &v));
  EXPECT_C_OK(m3sa_tensor_view_contiguous(nullptr, M3SA_DTYPE_F32, 0, nullptr, &v));
  EXPECT_EQ(v.rank, 0);
}

TEST(CApi, ConversionsAreTheHeaderOnes) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float a = m3sa_bf16_bits_to_float(static_cast<uint16_t>(bits));
    const float b = bf16_bits_to_float(static_cast<uint16_t>(bits));
    EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << bits;
    EXPECT_EQ(m3sa_float_to_bf16_bits(b), float_to_bf16_bits(b)) << bits;
  }
  for (uint32_t bits = 0; bits < 256; ++bits) {
    const float a = m3sa_e4m3_bits_to_float(static_cast<uint8_t>(bits));
    const float b = e4m3_bits_to_float(static_cast<uint8_t>(bits));
    EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << bits;
  }
  Rng rng(test_seed());
  for (int i = 0; i < 100000; ++i) {
    const float x = rng.normal() * 300.f;
    EXPECT_EQ(m3sa_float_to_e4m3_bits(x), float_to_e4m3_bits(x)) << x;
  }
}

// In a build or on a machine without a usable GPU, a CUDA plan is unsupported, with the reason.
TEST(CApi, CudaWithoutADeviceIsUnsupported) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  m3sa_plan_request request;
  m3sa_plan_request_init(&request);
  request.backend = M3SA_BACKEND_CUDA;
  request.capacities = {4, 64, 32};
  m3sa_plan plan;
  EXPECT_EQ(m3sa_make_plan(&request, &plan), M3SA_UNSUPPORTED);
  EXPECT_NE(std::string(m3sa_last_error_message()).find("cuda"), std::string::npos)
      << m3sa_last_error_message();
}

} // namespace
} // namespace m3sa::testing
