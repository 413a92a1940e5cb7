// Context-parallel decode indexer: validation and dispatch (CUDA only; the kernels are the decode
// indexer's, with a shard map, plus a merge of every rank's candidates).
#include "m3sa/context_parallel.h"

#include <algorithm>

#include "api/validate.h"
#include "common/check.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/context_parallel.h"
#endif
#include "m3sa/capabilities.h"

namespace m3sa {
namespace {

#ifdef M3SA_HAVE_CUDA
#define M3SA_CONTEXT_PARALLEL_DISPATCH(call) return with_context(cuda::call)
#else
#define M3SA_CONTEXT_PARALLEL_DISPATCH(call)                                                       \
  (void)ctx;                                                                                       \
  return with_context(Status::unsupported("backend cuda", "m3sa was built without it"))
#endif

Status with_context(Status status) {
  if (status.ok()) return status;
  return {status.code(), "m3sa::context_parallel_index_topk: " + status.message()};
}

Status check_shard(const ContextShard& shard) {
  if (shard.num_ranks < 1 || shard.num_ranks > 1024)
    return Status::invalid_argument("shard.num_ranks", "1..1024", std::to_string(shard.num_ranks));
  if (shard.rank < 0 || shard.rank >= shard.num_ranks)
    return Status::invalid_argument("shard.rank",
                                    detail::concat("0..num_ranks-1 (", shard.num_ranks - 1, ")"),
                                    std::to_string(shard.rank));
  return {};
}

// The run arguments every entry point shares: the plan's, decode rows only, the shard's table.
Status check_shard_args(const ContextParallelPlan& plan, const IndexTopkArgs& args, bool topk) {
  const OpPlan& scoring = plan.scoring;
  const DeviceKind device = DeviceKind::cuda;
  M3SA_RETURN_IF_ERROR(
      detail::check_scoring_inputs(scoring, args.index_q, args.index_k_cache, args.batch, device));
  if (args.batch.num_decode_requests != args.batch.num_requests)
    return Status::invalid_argument(
        "batch.num_decode_requests",
        detail::concat("== num_requests (", args.batch.num_requests,
                       "): the context-parallel indexer serves decode rows"),
        std::to_string(args.batch.num_decode_requests));
  const int64_t local_width = shard_local_blocks(plan.request.capacities, plan.shard,
                                                 plan.request.capacities.max_blocks_per_request);
  if (args.batch.block_table.shape[1] > local_width)
    return Status::invalid_argument("batch.block_table",
                                    detail::concat("the rank's table: at most ", local_width,
                                                   " columns (rank ", plan.shard.rank, " of ",
                                                   plan.shard.num_ranks, ")"),
                                    args.batch.block_table.describe());
  if (topk) {
    M3SA_RETURN_IF_ERROR(detail::check_topk_out(scoring, args.topk, args.batch.num_tokens, device));
    M3SA_RETURN_IF_ERROR(detail::check_aliasing(
        {{args.topk, "topk"}}, {{args.index_q, "index_q"}, {args.index_k_cache, "index_k_cache"}},
        &args.batch, {}));
  }
  return {};
}

// One rank's candidates ([H, max_tokens, slots]) or every rank's (gathered: [R, H, ...]).
Status check_candidates(const ContextParallelPlan& plan, const TensorView& t, const char* name,
                        bool gathered) {
  const int64_t ranks = plan.shard.num_ranks;
  const Capacities& cap = plan.request.capacities;
  const int64_t heads = plan.request.config.num_index_heads;
  const int64_t slots = std::max(1, plan.ranked_slots);
  if (!gathered)
    return detail::check_tensor(t,
                                {name,
                                 {DType::i64},
                                 {heads, cap.max_tokens, slots},
                                 "[num_index_heads, max_tokens, top_k - init - local]",
                                 true,
                                 true},
                                DeviceKind::cuda);
  return detail::check_tensor(t,
                              {name,
                               {DType::i64},
                               {ranks, heads, cap.max_tokens, slots},
                               "[num_ranks, num_index_heads, max_tokens, top_k - init - local]",
                               true,
                               false},
                              DeviceKind::cuda);
}

} // namespace

int64_t shard_span(const Capacities& capacities, const ContextShard& shard) {
  return (capacities.max_blocks_per_request + shard.num_ranks - 1) / shard.num_ranks;
}

int64_t shard_global_block(const Capacities& capacities, const ContextShard& shard, int64_t j) {
  return shard.mode == ShardMode::contiguous ? shard.rank * shard_span(capacities, shard) + j
                                             : j * shard.num_ranks + shard.rank;
}

int64_t shard_local_blocks(const Capacities& capacities, const ContextShard& shard, int64_t n) {
  if (shard.mode == ShardMode::contiguous) {
    const int64_t span = shard_span(capacities, shard);
    return std::clamp<int64_t>(n - shard.rank * span, 0, span);
  }
  return n > shard.rank ? (n - shard.rank + shard.num_ranks - 1) / shard.num_ranks : 0;
}

Status make_context_parallel_plan(const PlanRequest& request, const ContextShard& shard,
                                  ContextParallelPlan* plan) {
  if (plan == nullptr)
    return with_context(Status::invalid_argument("plan", "a non-null pointer", "nullptr"));
  M3SA_RETURN_IF_ERROR(with_context(check_shard(shard)));
  if (request.backend != Backend::cuda)
    return with_context(Status::unsupported(
        detail::concat("backend ", to_string(request.backend)),
        "the context-parallel indexer runs on CUDA (single-process backends have one memory)"));
  PlanRequest decode = request;
  decode.op = OpKind::index_topk;
  M3SA_RETURN_IF_ERROR(with_context(detail::check_plan_request(decode)));
  M3SA_RETURN_IF_ERROR(
      with_context(supports(Backend::cuda, OpKind::index_topk, decode.config, decode.cache_dtype)));
#ifdef M3SA_HAVE_CUDA
  ContextParallelPlan result;
  Status planned;
  for (const char* implementation : cuda::kContextParallelScoring) {
    decode.implementation = implementation;
    planned = make_plan(decode, &result.scoring);
    if (planned.ok()) break;
  }
  M3SA_RETURN_IF_ERROR(with_context(planned));
  result.request = decode;
  result.shard = shard;
  M3SA_RETURN_IF_ERROR(with_context(cuda::size_context_parallel_plan(&result)));
  *plan = result;
  return {};
#else
  return with_context(Status::unsupported("backend cuda", "m3sa was built without it"));
#endif
}

Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          const ExecContext& ctx) {
  M3SA_RETURN_IF_ERROR(with_context(detail::check_workspace(workspace, plan.workspace_bytes)));
  M3SA_CONTEXT_PARALLEL_DISPATCH(prepare_context_parallel_workspace(plan, workspace, ctx.stream));
}

Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace, const ExecContext& ctx) {
  M3SA_RETURN_IF_ERROR(with_context(detail::check_workspace(workspace, plan.workspace_bytes)));
  M3SA_RETURN_IF_ERROR(with_context(check_shard_args(plan, args, true)));
  (void)nccl_comm; // unused where m3sa was built without CUDA
  M3SA_CONTEXT_PARALLEL_DISPATCH(
      context_parallel_index_topk(plan, args, nccl_comm, workspace, ctx.stream));
}

Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              const TensorView& candidates, Workspace workspace,
                              const ExecContext& ctx) {
  M3SA_RETURN_IF_ERROR(with_context(detail::check_workspace(workspace, plan.workspace_bytes)));
  M3SA_RETURN_IF_ERROR(with_context(check_shard_args(plan, args, false)));
  M3SA_RETURN_IF_ERROR(with_context(check_candidates(plan, candidates, "candidates", false)));
  M3SA_CONTEXT_PARALLEL_DISPATCH(score_shard_candidates(
      plan, args, static_cast<uint64_t*>(candidates.data), workspace, ctx.stream));
}

Status merge_shard_candidates(const ContextParallelPlan& plan, const TensorView& gathered,
                              const BatchMetadata& batch, const TensorView& topk,
                              const ExecContext& ctx) {
  M3SA_RETURN_IF_ERROR(with_context(check_candidates(plan, gathered, "gathered", true)));
  M3SA_RETURN_IF_ERROR(
      with_context(detail::check_batch(plan.scoring, batch, DeviceKind::cuda, -1)));
  M3SA_RETURN_IF_ERROR(
      with_context(detail::check_topk_out(plan.scoring, topk, batch.num_tokens, DeviceKind::cuda)));
  M3SA_CONTEXT_PARALLEL_DISPATCH(merge_shard_candidates(
      plan, static_cast<const uint64_t*>(gathered.data), batch, topk, ctx.stream));
}

} // namespace m3sa
