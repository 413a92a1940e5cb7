#include "demo_cuda.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_status.h"
#include "testing/device_buffer.h"

namespace m3sa::cli {
namespace {

using testing::DeviceBuffer;

// Plans `op`, gives it a device workspace, runs `body` between two events.
template <typename Body>
Status timed_on_gpu(const PlanRequest& request, cudaStream_t stream, double* ms, Body&& body) {
  OpPlan plan;
  M3SA_RETURN_IF_ERROR(make_plan(request, &plan));
  const ExecContext ctx{0, stream};
  const DeviceBuffer ws = testing::device_workspace(plan, true, ctx);
  M3SA_RETURN_IF_ERROR(ws.status());
  M3SA_RETURN_IF_ERROR(body(plan, ws.workspace(), ctx)); // loads the kernels' modules
  cudaEvent_t start, stop;
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
  Status s = body(plan, ws.workspace(), ctx);
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float elapsed = 0;
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, start, stop));
  *ms = elapsed;
  int32_t flags = 0;
  if (s.ok()) s = read_device_errors(plan, ws.workspace(), ctx, &flags);
  if (s.ok() && flags != 0)
    s = Status(StatusCode::invalid_argument,
               "device-side validation flagged bad metadata: bits " + std::to_string(flags));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return s;
}

} // namespace

Status run_layer_on_cuda(const MsaConfig& config, const testing::SyntheticBatch& sb,
                         const NormRopeInsertArgs& step, testing::HostTensor& topk,
                         double* norm_rope_ms, double* topk_ms, const GpuAttention* attention) {
  // Host views -> device copies (views carry shape and strides; the copy swaps the pointer).
  std::vector<std::unique_ptr<DeviceBuffer>> mirrors;
  const auto mirror = [&](const TensorView& host) {
    mirrors.push_back(std::make_unique<DeviceBuffer>(host));
    return mirrors.back().get();
  };
  NormRopeInsertArgs d = step;
  TensorView* views[] = {&d.q,
                         &d.k,
                         &d.v,
                         &d.index_q,
                         &d.index_k,
                         &d.positions,
                         &d.q_norm_weight,
                         &d.k_norm_weight,
                         &d.index_q_norm_weight,
                         &d.index_k_norm_weight,
                         &d.slot_mapping,
                         &d.index_slot_mapping,
                         &d.q_out,
                         &d.k_cache,
                         &d.v_cache,
                         &d.index_q_out,
                         &d.index_k_cache};
  std::vector<std::pair<const DeviceBuffer*, TensorView>> outputs;
  for (TensorView* v : views) {
    const TensorView host = *v;
    const DeviceBuffer* m = mirror(host);
    M3SA_RETURN_IF_ERROR(m->status());
    *v = m->view();
    if (v == &d.q_out || v == &d.k_cache || v == &d.v_cache || v == &d.index_q_out ||
        v == &d.index_k_cache)
      outputs.push_back({m, host});
  }
  const DeviceBuffer *cu = mirror(sb.cu_q_lens.view()), *seq = mirror(sb.seq_lens.view()),
                     *table = mirror(sb.block_table.view()), *d_topk = mirror(topk.view());
  for (const DeviceBuffer* m : {cu, seq, table, d_topk}) M3SA_RETURN_IF_ERROR(m->status());
  cudaStream_t stream;
  M3SA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BatchMetadata batch = sb.batch();
  batch.cu_q_lens = cu->view(), batch.seq_lens = seq->view(), batch.block_table = table->view();
  PlanRequest request{OpKind::norm_rope_insert, Backend::cuda, config, sb.capacities(),
                      sb.spec().index_dtype};
  Status s = timed_on_gpu(request, stream, norm_rope_ms,
                          [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
                            return norm_rope_insert(plan, d, ws, ctx);
                          });
  request.op = OpKind::index_topk;
  if (s.ok())
    s = timed_on_gpu(
        request, stream, topk_ms, [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
          return index_topk(plan, {d.index_q_out, d.index_k_cache, batch, d_topk->view()}, ws, ctx);
        });
  if (s.ok() && attention) {
    const DeviceBuffer *kv_table = mirror(sb.kv_block_table.view()),
                       *out = mirror(attention->out->view()), *lse = mirror(attention->lse->view());
    for (const DeviceBuffer* m : {kv_table, out, lse}) M3SA_RETURN_IF_ERROR(m->status());
    request = {OpKind::sparse_attention, Backend::cuda, config, sb.capacities(),
               sb.spec().kv_dtype};
    SparseAttentionArgs args;
    args.q = d.q_out, args.k_cache = d.k_cache, args.v_cache = d.v_cache;
    args.topk = d_topk->view(), args.batch = batch, args.kv_block_table = kv_table->view();
    args.out = out->view(), args.lse = lse->view();
    s = timed_on_gpu(request, stream, attention->ms,
                     [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
                       return sparse_attention(plan, args, ws, ctx);
                     });
    if (s.ok()) s = out->download(attention->out->view());
    if (s.ok()) s = lse->download(attention->lse->view());
  }
  for (const auto& [m, host] : outputs)
    if (s.ok()) s = m->download(host);
  if (s.ok()) s = d_topk->download(topk.view());
  cudaStreamDestroy(stream);
  return s;
}

} // namespace m3sa::cli
