// CUDA norm_rope_insert host side: parameters from the arguments, one launch whose grid the
// launcher sizes from the plan's SM count. Implementation: cuda.norm_rope_insert.
#include "common/norm_rope_math.h"
#include "cuda/control.h"
#include "cuda/launch.h"
#include "cuda/launchers.h"
#include "registry/registry.h"

namespace m3sa::cuda {
namespace {

struct NormRopePlanInfo {
  static constexpr uint32_t kVersion = 1;
  int32_t sm_count; // the launcher keeps 4 CTAs per SM resident
};

// The workspace holds the control area only.
Status plan_norm_rope(const PlanRequest&, const detail::DeviceCaps& caps, OpPlan* plan) {
  plan->num_threads = 1;
  detail::WorkspaceCarver carver;
  take_control_area(carver, 0);
  plan->workspace_bytes = carver.bytes_used();
  detail::store_plan_info(plan, NormRopePlanInfo{caps.sm_count});
  return {};
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& a, Workspace workspace,
                        const ExecContext& ctx) {
  detail::WorkspaceCarver carver(workspace.data);
  const ControlArea control = take_control_area(carver, 0);
  const MsaConfig& config = plan.request.config;
  NormRopeInsertParams p{};
  p.q = a.q.data, p.q_stride_token = a.q.strides[0], p.q_stride_head = a.q.strides[1];
  p.k = a.k.data, p.k_stride_token = a.k.strides[0], p.k_stride_head = a.k.strides[1];
  p.v = a.v.data, p.v_stride_token = a.v.strides[0], p.v_stride_head = a.v.strides[1];
  p.index_q = a.index_q.data;
  p.index_q_stride_token = a.index_q.strides[0], p.index_q_stride_head = a.index_q.strides[1];
  p.index_k = a.index_k.data, p.index_k_stride_token = a.index_k.strides[0];
  p.positions = a.positions.ptr<const int64_t>(), p.positions_stride = a.positions.strides[0];
  const TensorView* weights[4] = {&a.q_norm_weight, &a.k_norm_weight, &a.index_q_norm_weight,
                                  &a.index_k_norm_weight};
  for (int i = 0; i < 4; ++i) {
    p.norm_weights[i] = weights[i]->data;
    p.norm_weight_is_f32[i] = weights[i]->dtype == DType::f32;
  }
  if (a.cos_sin_cache.present()) {
    p.cos_sin_cache = a.cos_sin_cache.data;
    p.cos_sin_stride = a.cos_sin_cache.strides[0];
    p.cos_sin_rows = a.cos_sin_cache.shape[0];
    p.cos_sin_is_f32 = a.cos_sin_cache.dtype == DType::f32;
  }
  p.slot_mapping = a.slot_mapping.ptr<const int64_t>(), p.slot_stride = a.slot_mapping.strides[0];
  p.index_slot_mapping = a.index_slot_mapping.ptr<const int64_t>();
  p.index_slot_stride = a.index_slot_mapping.strides[0];
  p.q_out = a.q_out.data;
  p.q_out_stride_token = a.q_out.strides[0], p.q_out_stride_head = a.q_out.strides[1];
  p.k_cache = a.k_cache.data;
  p.k_cache_stride_page = a.k_cache.strides[0], p.k_cache_stride_token = a.k_cache.strides[1];
  p.k_cache_stride_head = a.k_cache.strides[2];
  p.v_cache = a.v_cache.data;
  p.v_cache_stride_page = a.v_cache.strides[0], p.v_cache_stride_token = a.v_cache.strides[1];
  p.v_cache_stride_head = a.v_cache.strides[2];
  p.kv_pages = a.k_cache.shape[0];
  p.kv_is_fp8 = a.k_cache.dtype == DType::fp8_e4m3;
  p.k_scale = a.k_scale, p.v_scale = a.v_scale;
  p.index_q_out = a.index_q_out.data;
  p.index_q_out_stride_token = a.index_q_out.strides[0];
  p.index_q_out_stride_head = a.index_q_out.strides[1];
  p.index_k_cache = a.index_k_cache.data;
  p.index_cache_stride_page = a.index_k_cache.strides[0];
  p.index_cache_stride_token = a.index_k_cache.strides[1];
  p.index_pages = a.index_k_cache.shape[0];
  p.index_is_fp8 = a.index_k_cache.dtype == DType::fp8_e4m3;
  p.num_tokens = static_cast<int32_t>(a.q.shape[0]);
  p.q_heads = static_cast<int32_t>(a.q.shape[1]);
  p.kv_heads = static_cast<int32_t>(a.k.shape[1]);
  p.index_heads = static_cast<int32_t>(a.index_q.shape[1]);
  p.eps = config.rms_norm_eps, p.weight_offset = config.norm_weight_offset;
  for (int i = 0; i < 32; ++i)
    p.inv_freq[i] = detail::norm_rope::inverse_frequency(config.rope_theta, i);
  p.error_flags = control.error_flags;
  M3SA_CUDA_RETURN_IF_ERROR(launch_norm_rope_insert(
      p, static_cast<int>(plan.request.capacities.max_tokens),
      detail::load_plan_info<NormRopePlanInfo>(plan).sm_count, as_stream(ctx.stream)));
  return {};
}

} // namespace
} // namespace m3sa::cuda

namespace m3sa::detail {

extern const Implementation kCudaNormRopeInsert;
const Implementation kCudaNormRopeInsert = {
    "cuda.norm_rope_insert",
    "four lanes per row, persistent CTAs over token tiles, the CPU backend's fp32 order",
    Backend::cuda,
    OpKind::norm_rope_insert,
    0,
    cuda::can_run_sm80,
    cuda::plan_norm_rope,
    cuda::norm_rope_insert,
    cuda::prepare_control_area,
    cuda::read_control_errors,
    cuda::NormRopePlanInfo::kVersion};

} // namespace m3sa::detail
