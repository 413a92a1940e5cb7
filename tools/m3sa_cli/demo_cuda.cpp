#include "demo_cuda.h"

#include <cuda_runtime.h>

#include <string>

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
  explicit Mirror(const testing::HostTensor& host) {
    view = host.view();
    status = cuda_check(cudaMalloc(&ptr, host.bytes() ? host.bytes() : 16), "cudaMalloc");
    if (status.ok())
      status = cuda_check(cudaMemcpy(ptr, host.view().data, host.bytes(), cudaMemcpyHostToDevice),
                          "cudaMemcpy");
    view.data = ptr;
    view.device = {DeviceKind::cuda, 0};
  }
  ~Mirror() { cudaFree(ptr); }
  Status download(const testing::HostTensor& host) const {
    return cuda_check(cudaMemcpy(host.view().data, ptr, host.bytes(), cudaMemcpyDeviceToHost),
                      "cudaMemcpy");
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

Status run_indexer_on_cuda(const MsaConfig& config, testing::SyntheticBatch& sb,
                           const testing::HostTensor& rows, const testing::HostTensor& slots,
                           testing::HostTensor& topk, double* insert_ms, double* topk_ms) {
  const Mirror cu(sb.cu_q_lens), seq(sb.seq_lens), table(sb.block_table), q(sb.index_q),
      cache(sb.index_k_cache), d_rows(rows), d_slots(slots), d_topk(topk);
  for (const Mirror* m : {&cu, &seq, &table, &q, &cache, &d_rows, &d_slots, &d_topk})
    M3SA_RETURN_IF_ERROR_DEMO(m->status);
  cudaStream_t stream;
  DEMO_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BatchMetadata batch = sb.batch();
  batch.cu_q_lens = cu.view, batch.seq_lens = seq.view, batch.block_table = table.view;
  PlanRequest request{OpKind::insert_index_k, Backend::cuda, config, sb.capacities(),
                      sb.spec().index_dtype};
  Status s = timed_on_gpu(
      request, stream, insert_ms, [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
        return insert_index_k(plan, {d_rows.view, d_slots.view, cache.view}, ws, ctx);
      });
  request.op = OpKind::index_topk;
  if (s.ok())
    s = timed_on_gpu(request, stream, topk_ms,
                     [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
                       return index_topk(plan, {q.view, cache.view, batch, d_topk.view}, ws, ctx);
                     });
  if (s.ok()) s = cache.download(sb.index_k_cache);
  if (s.ok()) s = d_topk.download(topk);
  cudaStreamDestroy(stream);
  return s;
}

} // namespace m3sa::cli
