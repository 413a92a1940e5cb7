// Public entry points: common checks, the op's validation (src/api/validate_<family>.cpp), then
// the plan's implementation from the registry (src/registry).
#include "m3sa/ops.h"

#include <string>
#include <string_view>

#include "api/validate.h"
#include "common/check.h"
#include "registry/registry.h"

namespace m3sa {
namespace {

Status with_op(OpKind op, Status status) {
  if (status.ok()) return status;
  return {status.code(), std::string("m3sa::") + to_string(op) + ": " + status.message()};
}

template <typename Args>
Status validate_and_run(OpKind op, const OpPlan& plan, const Args& args, Workspace workspace,
                        const ExecContext& ctx) {
  M3SA_RETURN_IF_ERROR(with_op(op, detail::check_run_common(plan, op, workspace, ctx)));
  // The aliasing rules cover the bytes of the workspace the implementation uses.
  const Workspace used{workspace.data, plan.workspace_bytes};
  M3SA_RETURN_IF_ERROR(with_op(op, detail::validate_args(plan, args, used)));
  return with_op(op, detail::run_implementation(plan, args, workspace, ctx));
}

// The named implementation, or the highest-priority one of (backend, op) that can run here.
Status choose_implementation(const PlanRequest& request, const detail::DeviceCaps& caps,
                             int32_t* index) {
  const auto all = detail::implementations();
  const bool named = request.implementation != nullptr && request.implementation[0] != '\0';
  std::string available, reasons;
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(all.size()); ++i) {
    const detail::Implementation& impl = *all[i];
    if (impl.op != request.op || (!named && impl.backend != request.backend)) continue;
    available += (available.empty() ? "" : ", ") + std::string(impl.name);
    if (named && std::string_view(impl.name) != request.implementation) continue;
    const Status s = detail::check_implementation(impl, request, caps);
    if (!s.ok()) {
      reasons += (reasons.empty() ? "" : "; ") + s.message();
      continue;
    }
    if (best < 0 || impl.priority > all[best]->priority) best = i;
  }
  if (best >= 0) {
    *index = best;
    return {};
  }
  if (named && reasons.empty())
    return Status::unsupported(detail::concat("implementation ", request.implementation),
                               detail::concat("no such implementation of ", to_string(request.op),
                                              " in this build (available: ", available, ")"));
  const std::string what =
      detail::concat("backend ", to_string(request.backend), ", op ", to_string(request.op));
  if (reasons.empty())
    return Status::unsupported(what, "no implementation is registered in this build");
  return {StatusCode::unsupported, what + ": " + reasons};
}

} // namespace

Status make_plan(const PlanRequest& request, OpPlan* plan) {
  if (plan == nullptr)
    return with_op(request.op, Status::invalid_argument("plan", "a non-null OpPlan*", "nullptr"));
  M3SA_RETURN_IF_ERROR(with_op(request.op, detail::check_plan_request(request)));
  const detail::DeviceCaps caps = detail::device_caps(request);
  OpPlan result;
  M3SA_RETURN_IF_ERROR(
      with_op(request.op, choose_implementation(request, caps, &result.implementation)));
  const detail::Implementation& impl = *detail::implementations()[result.implementation];
  result.request = request;
  result.request.backend = impl.backend;
  result.request.implementation = impl.name; // the registry's string outlives the caller's
  result.plan_info_version = impl.plan_info_version;
  M3SA_RETURN_IF_ERROR(with_op(request.op, impl.plan(result.request, caps, &result)));
  detail::seal_plan(&result);
  *plan = result;
  return {};
}

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      const ExecContext& ctx) {
  return validate_and_run(OpKind::insert_index_k, plan, args, workspace, ctx);
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    const ExecContext& ctx) {
  return validate_and_run(OpKind::score_blocks, plan, args, workspace, ctx);
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext& ctx) {
  return validate_and_run(OpKind::select_topk_blocks, plan, args, workspace, ctx);
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext& ctx) {
  return validate_and_run(OpKind::index_topk, plan, args, workspace, ctx);
}

Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& args, Workspace workspace,
                        const ExecContext& ctx) {
  return validate_and_run(OpKind::sparse_attention, plan, args, workspace, ctx);
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& args, Workspace workspace,
                        const ExecContext& ctx) {
  return validate_and_run(OpKind::norm_rope_insert, plan, args, workspace, ctx);
}

namespace {

Status prepare_workspace_unprefixed(const OpPlan& plan, Workspace workspace,
                                    const ExecContext& ctx) {
  const detail::Implementation* impl = nullptr;
  M3SA_RETURN_IF_ERROR(detail::sealed_implementation_of(plan, plan.request.op, &impl));
  M3SA_RETURN_IF_ERROR(detail::check_workspace(workspace, plan.workspace_bytes));
  if (impl->prepare_workspace == nullptr) return {};
  return impl->prepare_workspace(plan, workspace, ctx.stream);
}

Status read_device_errors_unprefixed(const OpPlan& plan, Workspace workspace,
                                     const ExecContext& ctx, int32_t* flags) {
  if (flags == nullptr) return Status::invalid_argument("flags", "a non-null int32_t*", "nullptr");
  *flags = 0;
  const detail::Implementation* impl = nullptr;
  M3SA_RETURN_IF_ERROR(detail::sealed_implementation_of(plan, plan.request.op, &impl));
  M3SA_RETURN_IF_ERROR(detail::check_workspace(workspace, plan.workspace_bytes));
  if (impl->read_device_errors == nullptr) return {};
  return impl->read_device_errors(plan, workspace, ctx.stream, flags);
}

} // namespace

// Like the ops, the workspace entry points name the plan's op in every message (contract §9).
Status prepare_workspace(const OpPlan& plan, Workspace workspace, const ExecContext& ctx) {
  return with_op(plan.request.op, prepare_workspace_unprefixed(plan, workspace, ctx));
}

Status read_device_errors(const OpPlan& plan, Workspace workspace, const ExecContext& ctx,
                          int32_t* flags) {
  return with_op(plan.request.op, read_device_errors_unprefixed(plan, workspace, ctx, flags));
}

} // namespace m3sa
