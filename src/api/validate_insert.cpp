// insert_index_k arguments.
#include "api/validate.h"

#include "common/check.h"

namespace m3sa::detail {

Status validate_args(const OpPlan& plan, const InsertIndexKArgs& args, const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  M3SA_RETURN_IF_ERROR(check_tensor(
      args.index_k,
      {"index_k", {DType::bf16, DType::f32}, {kAnyExtent, kHeadDim}, "[num_tokens, 128]"}, device));
  M3SA_RETURN_IF_ERROR(check_vector_rows(args.index_k, "index_k", device));
  const int64_t tokens = args.index_k.shape[0];
  if (tokens > plan.request.capacities.max_tokens)
    return Status::invalid_argument(
        "index_k", concat("at most ", plan.request.capacities.max_tokens, " rows (plan capacity)"),
        args.index_k.describe());
  M3SA_RETURN_IF_ERROR(check_tensor(
      args.slot_mapping, {"slot_mapping", {DType::i64}, {tokens}, "[num_tokens]", false}, device));
  TensorView cache = args.index_k_cache;
  M3SA_RETURN_IF_ERROR(check_index_cache(plan, cache, device));
  M3SA_RETURN_IF_ERROR(check_tensor(cache,
                                    {"index_k_cache",
                                     {cache.dtype},
                                     {kAtLeastOne, kBlockTokens, kHeadDim},
                                     "[num_pages, 128, 128]",
                                     true,
                                     true},
                                    device));
  M3SA_RETURN_IF_ERROR(check_aliasing(
      {{cache, "index_k_cache"}}, {{args.index_k, "index_k"}, {args.slot_mapping, "slot_mapping"}},
      nullptr, workspace));
  if (!host_readable(device)) return {}; // the device flags bad slots
  return check_slots(args.slot_mapping, "slot_mapping", cache.shape[0]);
}

} // namespace m3sa::detail
