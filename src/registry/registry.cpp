// The one list of implementations. Adding one: its own files defining `const Implementation kXxx`,
// one line `X(kXxx)` in the list below (the host or the CUDA one), and its sources in
// src/CMakeLists.txt.
#include "registry/registry.h"

#include <cstring>
#include <string>

#include "common/check.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/control.h"
#endif

// One line per implementation, each defined in its backend's translation unit. The order is the
// public implementation index (m3sa info) and, within an op, the tie order of make_plan.
// clang-format off
#define M3SA_HOST_IMPLEMENTATIONS(X) \
  X(kReferenceInsertIndexK)          \
  X(kReferenceScoreBlocks)           \
  X(kReferenceSelectTopkBlocks)      \
  X(kReferenceIndexTopk)             \
  X(kReferenceSparseAttention)       \
  X(kReferenceNormRopeInsert)        \
  X(kCpuInsertIndexK)                \
  X(kCpuScoreBlocks)                 \
  X(kCpuSelectTopkBlocks)            \
  X(kCpuIndexTopk)                   \
  X(kCpuSparseAttention)             \
  X(kCpuNormRopeInsert)
#ifdef M3SA_HAVE_CUDA
#define M3SA_CUDA_IMPLEMENTATIONS(X) \
  X(kCudaInsertIndexK)               \
  X(kCudaScoreBlocksSm80)            \
  X(kCudaScoreBlocksSm90)            \
  X(kCudaSelectTopkBlocks)           \
  X(kCudaIndexTopkSm80)              \
  X(kCudaIndexTopkSm90)              \
  X(kCudaIndexTopkSm90Qgmma)         \
  X(kCudaNormRopeInsert)             \
  X(kCudaSparseAttentionSm80)        \
  X(kCudaSparseAttentionSm90)
#else
#define M3SA_CUDA_IMPLEMENTATIONS(X)
#endif
// clang-format on

namespace m3sa::detail {

#define M3SA_DECLARE_IMPLEMENTATION(name) extern const Implementation name;
M3SA_HOST_IMPLEMENTATIONS(M3SA_DECLARE_IMPLEMENTATION)
M3SA_CUDA_IMPLEMENTATIONS(M3SA_DECLARE_IMPLEMENTATION)
#undef M3SA_DECLARE_IMPLEMENTATION

namespace {

// Pointers, not copies: each entry is defined in its backend's translation unit, and copying it
// here would depend on the order in which the translation units are initialised.
#define M3SA_LIST_IMPLEMENTATION(name) &name,
const Implementation* const kImplementations[] = {M3SA_HOST_IMPLEMENTATIONS(
    M3SA_LIST_IMPLEMENTATION) M3SA_CUDA_IMPLEMENTATIONS(M3SA_LIST_IMPLEMENTATION)};
#undef M3SA_LIST_IMPLEMENTATION

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

namespace {

// FNV-1a over the bytes of each value (field by field: struct padding is not hashed).
class PlanHash {
public:
  template <typename T> PlanHash& operator<<(const T& value) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    for (unsigned char b : bytes) hash_ = (hash_ ^ b) * 0x100000001b3ull;
    return *this;
  }
  int64_t value() const { return static_cast<int64_t>(hash_); }

private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

int64_t plan_seal(const OpPlan& plan) {
  const PlanRequest& r = plan.request;
  const MsaConfig& c = r.config;
  PlanHash hash;
  hash << r.op << r.backend << c.top_k << c.local_blocks << c.init_blocks << c.num_index_heads
       << c.score_scale << c.reduce_heads << c.rms_norm_eps << c.norm_weight_offset << c.rope_theta
       << r.capacities.max_requests << r.capacities.max_tokens
       << r.capacities.max_blocks_per_request << r.cache_dtype << r.num_threads << r.device_ordinal
       << plan.implementation << plan.num_threads << plan.workspace_bytes << plan.plan_info_version;
  for (int i = 0; i < kPlanSealWord; ++i) hash << plan.plan_info[i];
  return hash.value();
}

} // namespace

void seal_plan(OpPlan* plan) { plan->plan_info[kPlanSealWord] = plan_seal(*plan); }

Status sealed_implementation_of(const OpPlan& plan, OpKind op, const Implementation** out) {
  M3SA_RETURN_IF_ERROR(implementation_of(plan, op, out));
  if (plan.plan_info[kPlanSealWord] != plan_seal(plan))
    return Status::invalid_argument(
        "plan", "a plan as make_plan made it (sealed: its fields are not edited afterwards)",
        concat("a plan whose fields differ from the ones it was sealed with (num_threads ",
               plan.num_threads, ", workspace_bytes ", plan.workspace_bytes, ", top_k ",
               plan.request.config.top_k, ")"));
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
