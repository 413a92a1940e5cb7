#include "demo_cuda.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace m3sa::cli {
namespace {

Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return {StatusCode::cuda_error, std::string(what) + ": " + cudaGetErrorString(e)};
}
#define DEMO_CUDA(expr) M3SA_RETURN_IF_ERROR_DEMO(cuda_check((expr), #expr))
#define M3SA_RETURN_IF_ERROR_DEMO(expr)                                                            \
  do {                                                                                             \
    const Status s_ = (expr);                                                                      \
    if (!s_.ok()) return s_;                                                                       \
  } while (0)

// A device copy of a host tensor, freed on scope exit.
struct Mirror {
  void* ptr = nullptr;
  TensorView view;
  Status status;
  size_t bytes = 0;
  explicit Mirror(const TensorView& host) { // a contiguous host tensor
    view = host;
    bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
    status = cuda_check(cudaMalloc(&ptr, bytes ? bytes : 16), "cudaMalloc");
    if (status.ok())
      status = cuda_check(cudaMemcpy(ptr, host.data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    view.data = ptr;
    view.device = {DeviceKind::cuda, 0};
  }
  ~Mirror() { cudaFree(ptr); }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  Status download(const TensorView& host) const {
    return cuda_check(cudaMemcpy(host.data, ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
};

// Plans `op`, gives it a device workspace, runs `body` between two events.
template <typename Body>
Status timed_on_gpu(const PlanRequest& request, cudaStream_t stream, double* ms, Body&& body) {
  OpPlan plan;
  M3SA_RETURN_IF_ERROR_DEMO(make_plan(request, &plan));
  void* ws = nullptr;
  DEMO_CUDA(cudaMalloc(&ws, plan.workspace_bytes ? plan.workspace_bytes : 64));
  M3SA_RETURN_IF_ERROR_DEMO(
      prepare_workspace(plan, Workspace{ws, plan.workspace_bytes}, ExecContext{0, stream}));
  cudaEvent_t start, stop;
  DEMO_CUDA(cudaEventCreate(&start));
  DEMO_CUDA(cudaEventCreate(&stop));
  DEMO_CUDA(cudaEventRecord(start, stream));
  Status s = body(plan, Workspace{ws, plan.workspace_bytes}, ExecContext{0, stream});
  DEMO_CUDA(cudaEventRecord(stop, stream));
  DEMO_CUDA(cudaEventSynchronize(stop));
  float elapsed = 0;
  DEMO_CUDA(cudaEventElapsedTime(&elapsed, start, stop));
  *ms = elapsed;
  int32_t flags = 0;
  if (s.ok())
    s = read_device_errors(plan, Workspace{ws, plan.workspace_bytes}, ExecContext{0, stream},
                           &flags);
  if (s.ok() && flags != 0)
    s = Status(StatusCode::invalid_argument,
               "device-side validation flagged bad metadata: bits " + std::to_string(flags));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(ws);
  return s;
}

} // namespace

Status run_indexer_on_cuda(const MsaConfig& config, const testing::SyntheticBatch& sb,
                           const NormRopeInsertArgs& step, testing::HostTensor& topk,
                           double* norm_rope_ms, double* topk_ms) {
  // Host views -> device mirrors (views carry shape and strides; the mirror swaps the pointer).
  std::vector<std::unique_ptr<Mirror>> mirrors;
  const auto mirror = [&](const TensorView& host) {
    mirrors.push_back(std::make_unique<Mirror>(host));
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
  std::vector<std::pair<const Mirror*, TensorView>> outputs;
  for (TensorView* v : views) {
    const TensorView host = *v;
    const Mirror* m = mirror(host);
    M3SA_RETURN_IF_ERROR_DEMO(m->status);
    *v = m->view;
    if (v == &d.q_out || v == &d.k_cache || v == &d.v_cache || v == &d.index_q_out ||
        v == &d.index_k_cache)
      outputs.push_back({m, host});
  }
  const Mirror *cu = mirror(sb.cu_q_lens.view()), *seq = mirror(sb.seq_lens.view()),
               *table = mirror(sb.block_table.view()), *d_topk = mirror(topk.view());
  for (const Mirror* m : {cu, seq, table, d_topk}) M3SA_RETURN_IF_ERROR_DEMO(m->status);
  cudaStream_t stream;
  DEMO_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BatchMetadata batch = sb.batch();
  batch.cu_q_lens = cu->view, batch.seq_lens = seq->view, batch.block_table = table->view;
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
          return index_topk(plan, {d.index_q_out, d.index_k_cache, batch, d_topk->view}, ws, ctx);
        });
  for (const auto& [m, host] : outputs)
    if (s.ok()) s = m->download(host);
  if (s.ok()) s = d_topk->download(topk.view());
  cudaStreamDestroy(stream);
  return s;
}

} // namespace m3sa::cli
