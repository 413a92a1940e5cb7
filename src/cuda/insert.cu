// CUDA insert_index_k host side. Implementation: cuda.insert_index_k.
#include "cuda/control.h"
#include "cuda/launch.h"
#include "cuda/launchers.h"
#include "registry/registry.h"

namespace m3sa::cuda {
namespace {

// The workspace holds the control area only; the grid covers the token capacity.
Status plan_insert(const PlanRequest&, const detail::DeviceCaps&, OpPlan* plan) {
  plan->num_threads = 1;
  detail::WorkspaceCarver carver;
  take_control_area(carver, 0);
  plan->workspace_bytes = carver.bytes_used();
  return {};
}

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      const ExecContext& ctx) {
  detail::WorkspaceCarver carver(workspace.data);
  const ControlArea control = take_control_area(carver, 0);
  InsertIndexKParams p{};
  p.index_k = args.index_k.data;
  p.k_stride_token = args.index_k.strides[0];
  p.k_is_f32 = args.index_k.dtype == DType::f32;
  p.slot_mapping = args.slot_mapping.ptr<const int64_t>();
  p.slot_stride = args.slot_mapping.strides[0];
  p.num_tokens = static_cast<int32_t>(args.index_k.shape[0]);
  p.index_k_cache = args.index_k_cache.data;
  p.cache_stride_page = args.index_k_cache.strides[0];
  p.cache_stride_token = args.index_k_cache.strides[1];
  p.num_pages = static_cast<int32_t>(args.index_k_cache.shape[0]);
  p.cache_is_fp8 = args.index_k_cache.dtype == DType::fp8_e4m3;
  p.error_flags = control.error_flags;
  M3SA_CUDA_RETURN_IF_ERROR(launch_insert_index_k(
      p, static_cast<int>(plan.request.capacities.max_tokens), as_stream(ctx.stream)));
  return {};
}

} // namespace
} // namespace m3sa::cuda

namespace m3sa::detail {

extern const Implementation kCudaInsertIndexK;
const Implementation kCudaInsertIndexK = {"cuda.insert_index_k",
                                          "16 threads per row, one rounding to the cache dtype",
                                          Backend::cuda,
                                          OpKind::insert_index_k,
                                          0,
                                          cuda::can_run_sm80,
                                          cuda::plan_insert,
                                          cuda::insert_index_k,
                                          cuda::prepare_control_area,
                                          cuda::read_control_errors};

} // namespace m3sa::detail
