#include "m3sa/capabilities.h"

#include "common/check.h"
#include "common/supported_configs.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace m3sa {

#ifdef M3SA_HAVE_CUDA
int cuda_device_count() { return cuda::visible_device_count(); }
#else
int cuda_device_count() { return 0; }
#endif

bool cuda_backend_built() { return detail::kCudaBuilt; }

Status supports(Backend backend, OpKind op, const MsaConfig& config, DType cache_dtype) {
  const detail::BackendCapability& cap = detail::capability(backend);
  const std::string what = detail::concat("backend ", to_string(backend), ", op ", to_string(op));
  if (!cap.built)
    return Status::unsupported(
        what, "m3sa was built without it (configure with -DM3SA_ENABLE_CUDA=ON and nvcc on PATH)");
  if (cap.needs_cuda_device && cuda_device_count() == 0)
    return Status::unsupported(what, "no CUDA device is visible to this process");
  if (!(cap.ops & detail::op_bit(op))) return Status::unsupported(what, cap.missing_ops_reason);
  if (config.top_k < cap.min_top_k || config.top_k > cap.max_top_k)
    return Status::unsupported(what, detail::concat("top_k ", config.top_k, " outside ",
                                                    cap.min_top_k, "..", cap.max_top_k));
  if (config.num_index_heads > cap.max_index_heads)
    return Status::unsupported(what, detail::concat("num_index_heads ", config.num_index_heads,
                                                    " > ", cap.max_index_heads));
  if (cache_dtype == DType::fp8_e4m3 && !cap.fp8_cache)
    return Status::unsupported(what, "fp8_e4m3 caches");
  if (config.reduce_heads && !cap.reduce_heads)
    return Status::unsupported(what, "reduce_heads mode");
  return {};
}

Status supports(Backend backend, const MsaConfig& config, DType cache_dtype) {
  for (OpKind op : {OpKind::insert_index_k, OpKind::score_blocks, OpKind::select_topk_blocks,
                    OpKind::index_topk, OpKind::sparse_attention, OpKind::norm_rope_insert})
    M3SA_RETURN_IF_ERROR(supports(backend, op, config, cache_dtype));
  return {};
}

Backend best_available_backend(OpKind op, const MsaConfig& config, DType cache_dtype) {
  return supports(Backend::cuda, op, config, cache_dtype).ok() ? Backend::cuda : Backend::cpu;
}

Backend best_available_backend(const MsaConfig& config, DType cache_dtype) {
  return supports(Backend::cuda, config, cache_dtype).ok() ? Backend::cuda : Backend::cpu;
}

} // namespace m3sa
