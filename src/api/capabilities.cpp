#include "m3sa/capabilities.h"

#include <string>

#include "api/validate.h"
#include "common/check.h"
#include "registry/registry.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/control.h"
#endif

namespace m3sa {

#ifdef M3SA_HAVE_CUDA
int cuda_device_count() { return cuda::visible_device_count(); }
bool cuda_backend_built() { return true; }
#else
int cuda_device_count() { return 0; }
bool cuda_backend_built() { return false; }
#endif

Status supports(Backend backend, OpKind op, const MsaConfig& config, DType cache_dtype) {
  PlanRequest request;
  request.op = op;
  request.backend = backend;
  request.config = config;
  request.cache_dtype = cache_dtype;
  const std::string what = detail::concat("backend ", to_string(backend), ", op ", to_string(op));
  // A dtype outside the contract is the caller's error, as make_plan says: no build supports it.
  if (const Status s = detail::check_cache_dtype(cache_dtype); !s.ok())
    return {s.code(), what + ": " + s.message()};
  if (backend == Backend::cuda && !cuda_backend_built())
    return Status::unsupported(
        what, "m3sa was built without it (configure with -DM3SA_ENABLE_CUDA=ON and nvcc on PATH)");
  const detail::DeviceCaps caps = detail::device_caps(request);
  std::string reasons;
  for (const detail::Implementation* impl : detail::implementations()) {
    if (impl->backend != backend || impl->op != op) continue;
    const Status s = detail::check_implementation(*impl, request, caps);
    if (s.ok()) return s;
    reasons += (reasons.empty() ? "" : "; ") + s.message();
  }
  if (reasons.empty())
    return Status::unsupported(
        what, detail::concat("no ", to_string(backend), " implementation of ", to_string(op),
                             " is registered in this build; run it on Backend::cpu"));
  return {StatusCode::unsupported, what + ": " + reasons};
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
