// The one list of implementations. Adding one: its own files defining `const Implementation kXxx`,
// one `extern` line and one array entry here, and its sources in src/CMakeLists.txt.
#include "registry/registry.h"

#include <cstring>
#include <string>

#include "common/check.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/control.h"
#endif

namespace m3sa::detail {

// One declaration per implementation, each defined in its backend's file.
extern const Implementation kReferenceInsertIndexK;
extern const Implementation kReferenceScoreBlocks;
extern const Implementation kReferenceSelectTopkBlocks;
extern const Implementation kReferenceIndexTopk;
extern const Implementation kReferenceSparseAttention;
extern const Implementation kReferenceNormRopeInsert;
extern const Implementation kCpuInsertIndexK;
extern const Implementation kCpuScoreBlocks;
extern const Implementation kCpuSelectTopkBlocks;
extern const Implementation kCpuIndexTopk;
extern const Implementation kCpuSparseAttention;
extern const Implementation kCpuNormRopeInsert;
#ifdef M3SA_HAVE_CUDA
extern const Implementation kCudaInsertIndexK;
extern const Implementation kCudaScoreBlocksSm80;
extern const Implementation kCudaSelectTopkBlocks;
extern const Implementation kCudaIndexTopkSm80;
extern const Implementation kCudaNormRopeInsert;
extern const Implementation kCudaSparseAttentionSm80;
#endif

namespace {

// Pointers, not copies: each entry is defined in its backend's translation unit, and copying it
// here would depend on the order in which the translation units are initialised.
// One line per implementation.
// clang-format off
const Implementation* const kImplementations[] = {
    &kReferenceInsertIndexK,
    &kReferenceScoreBlocks,
    &kReferenceSelectTopkBlocks,
    &kReferenceIndexTopk,
    &kReferenceSparseAttention,
    &kReferenceNormRopeInsert,
    &kCpuInsertIndexK,
    &kCpuScoreBlocks,
    &kCpuSelectTopkBlocks,
    &kCpuIndexTopk,
    &kCpuSparseAttention,
    &kCpuNormRopeInsert,
#ifdef M3SA_HAVE_CUDA
    &kCudaInsertIndexK,
    &kCudaScoreBlocksSm80,
    &kCudaSelectTopkBlocks,
    &kCudaIndexTopkSm80,
    &kCudaNormRopeInsert,
    &kCudaSparseAttentionSm80,
#endif
};
// clang-format on

} // namespace

std::span<const Implementation* const> implementations() { return kImplementations; }

Status implementation_of(const OpPlan& plan, OpKind op, const Implementation** out) {
  const auto all = implementations();
  if (plan.implementation < 0 || plan.implementation >= static_cast<int32_t>(all.size()))
    return Status::invalid_argument(
        "plan", concat("a plan made by make_plan (implementation in [0, ", all.size(), "))"),
        concat("implementation ", plan.implementation));
  const Implementation& impl = *all[plan.implementation];
  if (impl.op != op)
    return Status::invalid_argument("plan", concat("a plan made for ", to_string(op)),
                                    concat("a plan for ", impl.name));
  if (plan.plan_info_version != impl.plan_info_version)
    return Status::invalid_argument(
        "plan", concat("plan_info version ", impl.plan_info_version, " of ", impl.name),
        concat("version ", plan.plan_info_version, " (a plan from another build)"));
  *out = &impl;
  return {};
}

Status check_config_limits(const PlanRequest& request) {
  const MsaConfig& config = request.config;
  if (config.top_k < 1 || config.top_k > kMaxTopK)
    return Status::unsupported(concat("config.top_k ", config.top_k),
                               concat("outside 1..", kMaxTopK));
  if (config.num_index_heads < 1 || config.num_index_heads > kMaxIndexHeads)
    return Status::unsupported(concat("config.num_index_heads ", config.num_index_heads),
                               concat("outside 1..", kMaxIndexHeads));
  return {};
}

DeviceCaps device_caps(const PlanRequest& request) {
#ifdef M3SA_HAVE_CUDA
  if (request.backend == Backend::cuda) return cuda::read_device_caps(request.device_ordinal);
#else
  (void)request;
#endif
  return {};
}

Status check_implementation(const Implementation& impl, const PlanRequest& request,
                            const DeviceCaps& caps) {
  PlanRequest own = request;
  own.backend = impl.backend;
  own.op = impl.op;
  const Status s = impl.can_implement(own, caps);
  if (s.ok()) return s;
  return {s.code(), concat(impl.name, ": ", s.message())};
}

} // namespace m3sa::detail

namespace m3sa {

int implementation_count() { return static_cast<int>(detail::implementations().size()); }

ImplementationInfo implementation_info(int index) {
  if (index < 0 || index >= implementation_count()) return {};
  const detail::Implementation& impl = *detail::implementations()[index];
  return {impl.name, impl.backend, impl.op, impl.description};
}

Status implementation_supports(int index, const PlanRequest& request) {
  if (index < 0 || index >= implementation_count())
    return Status::invalid_argument("index", detail::concat("0..", implementation_count() - 1),
                                    std::to_string(index));
  const detail::Implementation& impl = *detail::implementations()[index];
  PlanRequest own = request;
  own.backend = impl.backend;
  return detail::check_implementation(impl, own, detail::device_caps(own));
}

const char* implementation_name(const OpPlan& plan) {
  const auto all = detail::implementations();
  if (plan.implementation < 0 || plan.implementation >= static_cast<int32_t>(all.size())) return "";
  return all[plan.implementation]->name;
}

} // namespace m3sa
