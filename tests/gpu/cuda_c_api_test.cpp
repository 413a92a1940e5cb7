// The C API (libm3sa_c) on the device: index_topk and sparse_attention called through it write
// the bytes the C++ calls write on the same device data, on a caller's stream passed in the
// m3sa_exec_context, eagerly and replayed from a CUDA graph captured around the C calls.
#include <gtest/gtest.h>

#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"
#include "support/c_views.h"

namespace m3sa::testing {
namespace {

// A C plan of `request` with its device workspace, prepared on `stream`.
struct CDevicePlan {
  m3sa_plan plan = {};
  DeviceBuffer workspace;
  CDevicePlan(const PlanRequest& request, const m3sa_exec_context& ctx) {
    const m3sa_plan_request c = c_request(request);
    EXPECT_EQ(m3sa_make_plan(&c, &plan), M3SA_OK) << m3sa_last_error_message();
    workspace = DeviceBuffer(static_cast<size_t>(plan.workspace_bytes));
    EXPECT_TRUE(workspace.ok()) << workspace.status().to_string();
    EXPECT_EQ(m3sa_prepare_workspace(&plan, ws(), &ctx), M3SA_OK) << m3sa_last_error_message();
  }
  m3sa_workspace ws() const { return {workspace.data(), workspace.bytes()}; }
};

TEST(GpuCApi, IndexTopkAndAttentionWriteTheCppBytes) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const m3sa_exec_context c_ctx = {0, stream};
  const ExecContext ctx{0, stream};
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(to_string(dtype));
    BatchSpec spec;
    spec.q_lens = {1, 1, 1, 1, 300};
    spec.seq_lens = {9000, 130, 0, 40000, 2000};
    spec.num_decode = 4;
    spec.index_heads = 4;
    spec.index_dtype = dtype;
    spec.q_heads = 64;
    spec.kv_heads = 4;
    spec.kv_dtype = dtype;
    spec.seed = seed;
    SyntheticBatch sb(spec);
    M3SA_ASSERT_OK(sb.status());
    sb.fill_index_random(seed);
    sb.fill_attention_random(seed + 1);
    MsaConfig config;
    const int64_t t = sb.num_tokens();
    const DeviceBatch db(sb);

    // index_topk: C++, the C API, then the C API captured in a graph.
    const PlanRequest index_request = plan_request(OpKind::index_topk, config, sb, {Backend::cuda});
    const CudaRun cpp_index = cuda_run(index_request);
    const CDevicePlan c_index(index_request, c_ctx);
    DeviceBuffer want_topk(DType::i32, {4, t, 16}, 0x5a), got_topk(DType::i32, {4, t, 16}, 0x5a),
        graph_topk(DType::i32, {4, t, 16}, 0x5a);
    M3SA_ASSERT_OK(index_topk(
        cpp_index.plan, {db.index_q.view(), db.index_k_cache.view(), db.batch(), want_topk.view()},
        cpp_index.workspace.workspace(), ctx));
    const m3sa_index_topk_args index_args = c_args(
        IndexTopkArgs{db.index_q.view(), db.index_k_cache.view(), db.batch(), got_topk.view()});
    ASSERT_EQ(m3sa_index_topk(&c_index.plan, &index_args, c_index.ws(), &c_ctx), M3SA_OK)
        << m3sa_last_error_message();
    M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    const HostTensor want = want_topk.download();
    EXPECT_TRUE(same_bytes(want, got_topk.download()));

    m3sa_index_topk_args graph_args = index_args;
    graph_args.topk = c_view(graph_topk.view());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const m3sa_status captured = m3sa_index_topk(&c_index.plan, &graph_args, c_index.ws(), &c_ctx);
    M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(captured, M3SA_OK) << m3sa_last_error_message();
    M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      M3SA_ASSERT_OK(graph_topk.fill(0x5a));
      M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
      EXPECT_TRUE(same_bytes(want, graph_topk.download())) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    // sparse_attention over those selections, with scales and lse.
    const DeviceBuffer q(sb.q), k_cache(sb.k_cache), v_cache(sb.v_cache),
        kv_table(sb.kv_block_table);
    const PlanRequest attention_request =
        plan_request(OpKind::sparse_attention, config, sb, {Backend::cuda});
    const CudaRun cpp_attention = cuda_run(attention_request);
    const CDevicePlan c_attention(attention_request, c_ctx);
    DeviceBuffer want_out(DType::bf16, {t, 64, kHeadDim}, 0x5a),
        got_out(DType::bf16, {t, 64, kHeadDim}, 0x5a), want_lse(DType::f32, {t, 64}, 0x5a),
        got_lse(DType::f32, {t, 64}, 0x5a);
    const float k_scale = dtype == DType::fp8_e4m3 ? 0.75f : 1.f;
    const float v_scale = dtype == DType::fp8_e4m3 ? 1.25f : 1.f;
    SparseAttentionArgs args{q.view(),        k_cache.view(),   v_cache.view(), k_scale,
                             v_scale,         want_topk.view(), db.batch(),     kv_table.view(),
                             want_out.view(), want_lse.view()};
    M3SA_ASSERT_OK(
        sparse_attention(cpp_attention.plan, args, cpp_attention.workspace.workspace(), ctx));
    args.out = got_out.view();
    args.lse = got_lse.view();
    const m3sa_sparse_attention_args attention_args = c_args(args);
    ASSERT_EQ(m3sa_sparse_attention(&c_attention.plan, &attention_args, c_attention.ws(), &c_ctx),
              M3SA_OK)
        << m3sa_last_error_message();
    M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    EXPECT_TRUE(same_bytes(want_out.download(), got_out.download()));
    EXPECT_TRUE(same_bytes(want_lse.download(), got_lse.download()));

    for (const CDevicePlan* p : {&c_index, &c_attention}) {
      int32_t flags = -1;
      EXPECT_EQ(m3sa_read_device_errors(&p->plan, p->ws(), &c_ctx, &flags), M3SA_OK)
          << m3sa_last_error_message();
      EXPECT_EQ(flags, 0);
    }
  }
  cudaStreamDestroy(stream);
}

} // namespace
} // namespace m3sa::testing
