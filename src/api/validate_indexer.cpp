// Arguments of the indexer ops (score_blocks, select_topk_blocks, index_topk) and the checks
// they share with the context-parallel indexer.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/host_batch.h"

namespace m3sa::detail {
namespace {

Status check_scores(const OpPlan& plan, const TensorView& scores, const BatchMetadata& batch,
                    bool output, DeviceKind device) {
  M3SA_RETURN_IF_ERROR(
      check_tensor(scores,
                   {"scores",
                    {DType::f32},
                    {plan.request.config.num_index_heads, batch.num_tokens, kAtLeastOne},
                    "[num_index_heads, num_tokens, N]",
                    false,
                    output},
                   device));
  if (scores.shape[2] < batch.block_table.shape[1])
    return Status::invalid_argument(
        "scores", concat("N >= block-table width ", batch.block_table.shape[1]), scores.describe());
  return {};
}

} // namespace

// A bf16 / e4m3 tensor of 128-wide rows whose dtype must be the plan's cache dtype.
Status check_cache_dtype_rows(const OpPlan& plan, const TensorView& t, const TensorRule& rule,
                              const char* why, DeviceKind device) {
  M3SA_RETURN_IF_ERROR(check_tensor(t, rule, device));
  M3SA_RETURN_IF_ERROR(check_vector_rows(t, rule.name, device));
  if (t.dtype != plan.request.cache_dtype)
    return Status::invalid_argument(
        rule.name, concat("dtype ", to_string(plan.request.cache_dtype), " (", why, ")"),
        t.describe());
  return {};
}

Status check_index_cache(const OpPlan& plan, const TensorView& cache, DeviceKind device) {
  return check_cache_dtype_rows(plan, cache,
                                {"index_k_cache",
                                 {DType::bf16, DType::fp8_e4m3},
                                 {kAtLeastOne, kBlockTokens, kHeadDim},
                                 "[num_pages, 128, 128]"},
                                "the plan's cache_dtype", device);
}

Status check_index_q(const OpPlan& plan, const TensorView& q, int64_t tokens, DeviceKind device) {
  return check_cache_dtype_rows(plan, q,
                                {"index_q",
                                 {DType::bf16, DType::fp8_e4m3},
                                 {tokens, plan.request.config.num_index_heads, kHeadDim},
                                 "[num_tokens, num_index_heads, 128]"},
                                "index-Q follows the index cache dtype", device);
}

// The inputs score_blocks and index_topk share: cache, batch (its pages bounded by the cache), q.
Status check_scoring_inputs(const OpPlan& plan, const TensorView& q, const TensorView& cache,
                            const BatchMetadata& batch, DeviceKind device) {
  M3SA_RETURN_IF_ERROR(check_index_cache(plan, cache, device));
  M3SA_RETURN_IF_ERROR(check_batch(plan, batch, device, cache.shape[0]));
  return check_index_q(plan, q, batch.num_tokens, device);
}

Status check_topk_out(const OpPlan& plan, const TensorView& topk, int64_t tokens,
                      DeviceKind device) {
  return check_tensor(topk,
                      {"topk",
                       {DType::i32},
                       {plan.request.config.num_index_heads, tokens, plan.request.config.top_k},
                       "[num_index_heads, num_tokens, top_k]",
                       false,
                       true},
                      device);
}

Status validate_args(const OpPlan& plan, const ScoreBlocksArgs& args, const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  M3SA_RETURN_IF_ERROR(
      check_scoring_inputs(plan, args.index_q, args.index_k_cache, args.batch, device));
  M3SA_RETURN_IF_ERROR(check_scores(plan, args.scores, args.batch, true, device));
  return check_aliasing({{args.scores, "scores"}},
                        {{args.index_q, "index_q"}, {args.index_k_cache, "index_k_cache"}},
                        &args.batch, workspace);
}

Status validate_args(const OpPlan& plan, const SelectTopkBlocksArgs& args,
                     const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  M3SA_RETURN_IF_ERROR(check_batch(plan, args.batch, device, -1));
  M3SA_RETURN_IF_ERROR(check_scores(plan, args.scores, args.batch, false, device));
  M3SA_RETURN_IF_ERROR(check_topk_out(plan, args.topk, args.batch.num_tokens, device));
  return check_aliasing({{args.topk, "topk"}}, {{args.scores, "scores"}}, &args.batch, workspace);
}

Status validate_args(const OpPlan& plan, const IndexTopkArgs& args, const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  M3SA_RETURN_IF_ERROR(
      check_scoring_inputs(plan, args.index_q, args.index_k_cache, args.batch, device));
  M3SA_RETURN_IF_ERROR(check_topk_out(plan, args.topk, args.batch.num_tokens, device));
  return check_aliasing({{args.topk, "topk"}},
                        {{args.index_q, "index_q"}, {args.index_k_cache, "index_k_cache"}},
                        &args.batch, workspace);
}
} // namespace m3sa::detail
