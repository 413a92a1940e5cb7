// norm_rope_insert arguments: the tensors, their aliasing rules and (host data) positions and
// slots.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/host_batch.h"

namespace m3sa::detail {
Status validate_args(const OpPlan& plan, const NormRopeInsertArgs& a, const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  const MsaConfig& config = plan.request.config;
  if (!std::isfinite(config.rms_norm_eps) || config.rms_norm_eps < 0.f)
    return Status::invalid_argument("config.rms_norm_eps", "a finite value >= 0",
                                    std::to_string(config.rms_norm_eps));
  if (!std::isfinite(config.norm_weight_offset))
    return Status::invalid_argument("config.norm_weight_offset", "a finite value",
                                    std::to_string(config.norm_weight_offset));
  if (!a.cos_sin_cache.present() && !(config.rope_theta > 1.0 && std::isfinite(config.rope_theta)))
    return Status::invalid_argument("config.rope_theta", "a finite value > 1",
                                    std::to_string(config.rope_theta));
  const auto rows = [&](const TensorView& t, const char* name, std::initializer_list<DType> dtypes,
                        std::initializer_list<int64_t> shape, const char* text,
                        bool output) -> Status {
    M3SA_RETURN_IF_ERROR(check_tensor(t, {name, dtypes, shape, text, true, output}, device));
    return check_vector_rows(t, name, device);
  };
  M3SA_RETURN_IF_ERROR(
      rows(a.q, "q", {DType::bf16}, {kAnyExtent, kAtLeastOne, kHeadDim}, "[T, Hq, 128]", false));
  const int64_t tokens = a.q.shape[0], q_heads = a.q.shape[1];
  if (tokens > plan.request.capacities.max_tokens)
    return Status::invalid_argument(
        "q", concat("at most ", plan.request.capacities.max_tokens, " tokens (plan capacity)"),
        a.q.describe());
  M3SA_RETURN_IF_ERROR(
      rows(a.k, "k", {DType::bf16}, {tokens, kAtLeastOne, kHeadDim}, "[T, Hkv, 128]", false));
  const int64_t kv_heads = a.k.shape[1];
  M3SA_RETURN_IF_ERROR(
      rows(a.v, "v", {DType::bf16}, {tokens, kv_heads, kHeadDim}, "[T, Hkv, 128]", false));
  M3SA_RETURN_IF_ERROR(rows(a.index_q, "index_q", {DType::bf16},
                            {tokens, config.num_index_heads, kHeadDim}, "[T, num_index_heads, 128]",
                            false));
  M3SA_RETURN_IF_ERROR(
      rows(a.index_k, "index_k", {DType::bf16}, {tokens, kHeadDim}, "[T, 128]", false));
  const std::pair<const TensorView*, const char*> weights[] = {
      {&a.q_norm_weight, "q_norm_weight"},
      {&a.k_norm_weight, "k_norm_weight"},
      {&a.index_q_norm_weight, "index_q_norm_weight"},
      {&a.index_k_norm_weight, "index_k_norm_weight"}};
  for (const auto& [w, name] : weights)
    M3SA_RETURN_IF_ERROR(
        check_tensor(*w, {name, {DType::bf16, DType::f32}, {kHeadDim}, "[128]"}, device));
  M3SA_RETURN_IF_ERROR(check_optional_tensor(
      a.cos_sin_cache,
      {"cos_sin_cache", {DType::bf16, DType::f32}, {kAtLeastOne, kRotaryDim}, "[max_pos, 64]"},
      device));
  M3SA_RETURN_IF_ERROR(
      check_tensor(a.positions, {"positions", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(
      check_tensor(a.slot_mapping, {"slot_mapping", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(check_tensor(
      a.index_slot_mapping, {"index_slot_mapping", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(
      rows(a.q_out, "q_out", {DType::bf16}, {tokens, q_heads, kHeadDim}, "[T, Hq, 128]", true));
  M3SA_RETURN_IF_ERROR(rows(a.k_cache, "k_cache", {DType::bf16, DType::fp8_e4m3},
                            {kAtLeastOne, kBlockTokens, kv_heads, kHeadDim},
                            "[num_pages, 128, Hkv, 128]", true));
  M3SA_RETURN_IF_ERROR(rows(a.v_cache, "v_cache", {a.k_cache.dtype},
                            {a.k_cache.shape[0], kBlockTokens, kv_heads, kHeadDim},
                            "[num_pages, 128, Hkv, 128] like k_cache", true));
  for (const auto& [scale, name] :
       {std::pair{a.k_scale, "k_scale"}, std::pair{a.v_scale, "v_scale"}})
    if (!(scale > 0.f) || !std::isfinite(scale))
      return Status::invalid_argument(name, "a finite value > 0", std::to_string(scale));
  M3SA_RETURN_IF_ERROR(check_cache_dtype_rows(plan, a.index_q_out,
                                              {"index_q_out",
                                               {DType::bf16, DType::fp8_e4m3},
                                               {tokens, config.num_index_heads, kHeadDim},
                                               "[T, num_index_heads, 128]",
                                               true,
                                               true},
                                              "index-Q follows the index cache dtype", device));
  M3SA_RETURN_IF_ERROR(check_cache_dtype_rows(plan, a.index_k_cache,
                                              {"index_k_cache",
                                               {DType::bf16, DType::fp8_e4m3},
                                               {kAtLeastOne, kBlockTokens, kHeadDim},
                                               "[num_pages, 128, 128]",
                                               true,
                                               true},
                                              "the plan's cache_dtype", device));

  // q_out and index_q_out may overwrite q and index_q in place.
  M3SA_RETURN_IF_ERROR(check_aliasing({{a.q_out, "q_out", &a.q},
                                       {a.k_cache, "k_cache"},
                                       {a.v_cache, "v_cache"},
                                       {a.index_q_out, "index_q_out", &a.index_q},
                                       {a.index_k_cache, "index_k_cache"}},
                                      {{a.q, "q"},
                                       {a.k, "k"},
                                       {a.v, "v"},
                                       {a.index_q, "index_q"},
                                       {a.index_k, "index_k"},
                                       {a.positions, "positions"},
                                       {a.q_norm_weight, "q_norm_weight"},
                                       {a.k_norm_weight, "k_norm_weight"},
                                       {a.index_q_norm_weight, "index_q_norm_weight"},
                                       {a.index_k_norm_weight, "index_k_norm_weight"},
                                       {a.cos_sin_cache, "cos_sin_cache"},
                                       {a.slot_mapping, "slot_mapping"},
                                       {a.index_slot_mapping, "index_slot_mapping"}},
                                      nullptr, workspace));
  if (!host_readable(device)) return {}; // positions and slots: the device flags them
  const int64_t max_position = a.cos_sin_cache.present()
                                   ? std::min<int64_t>(a.cos_sin_cache.shape[0], kMaxRopePosition)
                                   : kMaxRopePosition;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t position = a.positions.ptr<const int64_t>()[t * a.positions.strides[0]];
    if (position < 0 || position >= max_position)
      return Status::invalid_argument(
          "positions",
          concat("values in [0, ", max_position, ")",
                 a.cos_sin_cache.present() ? " (cos_sin_cache rows)" : ""),
          concat(position, " at row ", t));
  }
  M3SA_RETURN_IF_ERROR(check_slots(a.slot_mapping, "slot_mapping", a.k_cache.shape[0]));
  return check_slots(a.index_slot_mapping, "index_slot_mapping", a.index_k_cache.shape[0]);
}

} // namespace m3sa::detail
