#pragma once
// The registry of op implementations: every (backend, op) kernel family declares what it supports
// (can_implement), its plan-time choices (plan: threads, workspace size, plan_info) and its run.
// supports(), make_plan(), prepare_workspace(), read_device_errors(), `m3sa info` and the tests all
// iterate this one list, written once in registry.cpp. docs/architecture.md says how to add one.
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <variant>

#include "common/check.h"
#include "m3sa/ops.h"
#include "m3sa/registry.h"

namespace m3sa::detail {

// What plans may depend on, read once per make_plan for the request's CUDA device ordinal (host
// backends get present == false).
struct DeviceCaps {
  bool present = false;
  int compute_capability = 0; // major * 10 + minor: 90 on Hopper
  int sm_count = 0;
  int64_t shared_memory_per_block_optin = 0;
};

template <typename Args>
using RunFnOf = Status (*)(const OpPlan&, const Args&, Workspace, const ExecContext&);
using RunFn =
    std::variant<RunFnOf<InsertIndexKArgs>, RunFnOf<ScoreBlocksArgs>, RunFnOf<SelectTopkBlocksArgs>,
                 RunFnOf<IndexTopkArgs>, RunFnOf<SparseAttentionArgs>, RunFnOf<NormRopeInsertArgs>>;

using CanImplementFn = Status (*)(const PlanRequest& request, const DeviceCaps& caps);
using PlanFn = Status (*)(const PlanRequest& request, const DeviceCaps& caps, OpPlan* plan);

struct Implementation {
  const char* name; // the public id: "<backend>.<op>[.<variant>]", e.g. "cuda.score_blocks.sm80"
  const char* description;
  Backend backend;
  OpKind op;
  int priority; // make_plan picks the highest-priority one whose can_implement is OK
  // unsupported with the reason when this implementation cannot run `request` on `caps`.
  CanImplementFn can_implement;
  // Fills num_threads, workspace_bytes and plan_info (request, implementation and
  // plan_info_version are set by make_plan).
  PlanFn plan;
  RunFn run;
  Status (*prepare_workspace)(const OpPlan& plan, Workspace workspace, void* stream); // or null
  Status (*read_device_errors)(const OpPlan& plan, Workspace workspace, void* stream,
                               int32_t* flags); // or null: the flag is always 0
  // Layout version of the struct this implementation keeps in OpPlan::plan_info; bump it when
  // the struct changes so that a plan from an older build is rejected instead of misread.
  uint32_t plan_info_version = 1;
};

std::span<const Implementation* const> implementations();

// The implementation a plan was made with, or invalid_argument "plan" when the plan names none,
// names one of another op, or carries plan_info of another layout version.
Status implementation_of(const OpPlan& plan, OpKind op, const Implementation** out);

// The capabilities of request.device_ordinal for CUDA requests; present == false otherwise.
DeviceCaps device_caps(const PlanRequest& request);

// request with the implementation's backend and op (what can_implement is asked about).
Status check_implementation(const Implementation& impl, const PlanRequest& request,
                            const DeviceCaps& caps);

// The last plan_info word holds the plan's seal (seal_plan); implementations get the rest.
inline constexpr int kPlanSealWord = 15;
inline constexpr size_t kPlanInfoBytes = kPlanSealWord * sizeof(int64_t);

// Plan info: a trivially copyable struct per implementation, kept in OpPlan::plan_info.
template <typename T> void store_plan_info(OpPlan* plan, const T& info) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kPlanInfoBytes);
  std::memset(plan->plan_info, 0, sizeof plan->plan_info);
  std::memcpy(plan->plan_info, &info, sizeof info);
}
template <typename T> T load_plan_info(const OpPlan& plan) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kPlanInfoBytes);
  T info;
  std::memcpy(&info, plan.plan_info, sizeof info);
  return info;
}

// Plans are caller-owned values that runs trust for sizes (workspace_bytes, num_threads, top_k,
// capacities, plan_info). make_plan seals a plan with a hash of every field a run depends on;
// check_plan_sealed re-hashes it (a few hundred ns, no device calls), so a plan edited after
// make_plan is rejected instead of overrunning the workspace it was sized for.
void seal_plan(OpPlan* plan);
// implementation_of, for a plan whose seal matches.
Status sealed_implementation_of(const OpPlan& plan, OpKind op, const Implementation** out);

// Runs the plan's implementation (validation has been done by the public entry point).
template <typename Args>
Status run_implementation(const OpPlan& plan, const Args& args, Workspace workspace,
                          const ExecContext& ctx) {
  const Implementation* impl = nullptr;
  M3SA_RETURN_IF_ERROR(implementation_of(plan, plan.request.op, &impl));
  const auto* run = std::get_if<RunFnOf<Args>>(&impl->run);
  if (run == nullptr || *run == nullptr)
    return Status::invalid_argument("plan", "a plan whose implementation runs these arguments",
                                    impl->name);
  return (*run)(plan, args, workspace, ctx);
}

// Threads a host implementation runs with: the context's, never more than the plan's.
inline int run_threads(const OpPlan& plan, const ExecContext& ctx) {
  return ctx.num_threads > 0 && ctx.num_threads < plan.num_threads ? ctx.num_threads
                                                                   : plan.num_threads;
}

// The limits every implementation has today (contract section 1): top_k 1..32, 1..16 index heads.
Status check_config_limits(const PlanRequest& request);
// can_implement of the host implementations: every request within those limits.
inline Status host_can_implement(const PlanRequest& request, const DeviceCaps&) {
  return check_config_limits(request);
}

// A host implementation's entry: host_can_implement, no workspace preparation, no device errors.
inline Implementation host_implementation(const char* name, const char* description,
                                          Backend backend, OpKind op, PlanFn plan, RunFn run) {
  return {name, description, backend, op, 0, host_can_implement, plan, run, nullptr, nullptr};
}

} // namespace m3sa::detail
