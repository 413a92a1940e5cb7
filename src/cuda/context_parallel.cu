// CUDA context-parallel indexer host side: the decode indexer's kernels with a shard map, the
// all-gather of every rank's candidates, and their merge into the single-GPU selection.
#include "cuda/context_parallel.h"

#include <algorithm>

#include "cuda/indexer.h"
#include "cuda/launch.h"
#include "cuda/launchers.h"
#include "cuda/nccl_exchange.h"
#include "registry/registry.h"

namespace m3sa::cuda {
namespace {

// The context-parallel workspace: decode scoring, this rank's candidates, all ranks' candidates.
struct ContextParallelLayout {
  IndexerLayout scoring;
  uint64_t* candidates = nullptr; // [H, max_tokens, ranked slots]
  uint64_t* gathered = nullptr;   // [ranks, H, max_tokens, ranked slots]
};

int splits_of(const ContextParallelPlan& plan) {
  return detail::load_plan_info<ScoringPlanInfo>(plan.scoring).block_splits;
}

ContextParallelLayout carve(const ContextParallelPlan& plan, void* base, size_t* bytes) {
  detail::WorkspaceCarver carver(base);
  ContextParallelLayout c;
  c.scoring = carve_indexer(plan.request, detail::load_plan_info<ScoringPlanInfo>(plan.scoring),
                            carver, true);
  const int64_t per_rank = static_cast<int64_t>(plan.candidate_bytes / sizeof(uint64_t));
  c.candidates = carver.take<uint64_t>(per_rank);
  c.gathered = carver.take<uint64_t>(per_rank * plan.shard.num_ranks);
  if (bytes) *bytes = carver.bytes_used();
  return c;
}

} // namespace

Status size_context_parallel_plan(ContextParallelPlan* plan) {
  const PlanRequest& request = plan->request;
  plan->ranked_slots = ranked_slots(request.config);
  plan->candidate_bytes = static_cast<size_t>(request.config.num_index_heads) *
                          request.capacities.max_tokens * std::max(1, plan->ranked_slots) *
                          sizeof(uint64_t);
  carve(*plan, nullptr, &plan->workspace_bytes);
  plan->scoring.workspace_bytes = plan->workspace_bytes;
  // The scoring plan now describes the context-parallel workspace (prepare_workspace and
  // read_device_errors take it): sealed again, as make_plan sealed what it returned.
  detail::seal_plan(&plan->scoring);
  return {};
}

Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          void* stream) {
  return initialise_control_area(carve(plan, workspace.data, nullptr).scoring.control, stream);
}

Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              uint64_t* candidates, Workspace workspace, void* stream) {
  const IndexerLayout l = carve(plan, workspace.data, nullptr).scoring;
  DecodeTopkParams p = decode_params(plan.scoring, splits_of(plan), args, l);
  p.scoring.shard_count = plan.shard.num_ranks;
  p.scoring.shard_rank = plan.shard.rank;
  p.scoring.shard_span = plan.shard.mode == ShardMode::contiguous
                             ? static_cast<int32_t>(shard_span(plan.request.capacities, plan.shard))
                             : 0;
  p.candidates = candidates;
  p.candidate_token_capacity = static_cast<int32_t>(plan.request.capacities.max_tokens);
  return launch_decode_topk(plan.scoring, p, args.index_k_cache, as_stream(stream));
}

Status merge_shard_candidates(const ContextParallelPlan& plan, const uint64_t* gathered,
                              const BatchMetadata& batch, const TensorView& topk, void* stream) {
  MergeCandidatesParams p{};
  p.candidates = gathered;
  p.num_ranks = plan.shard.num_ranks;
  p.rank_stride = static_cast<int64_t>(plan.candidate_bytes / sizeof(uint64_t));
  p.rows = selection_rows(plan.scoring, batch, topk);
  M3SA_CUDA_RETURN_IF_ERROR(launch_merge_candidates(p, as_stream(stream)));
  return {};
}

Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace, void* stream) {
  const ContextParallelLayout c = carve(plan, workspace.data, nullptr);
  M3SA_RETURN_IF_ERROR(score_shard_candidates(plan, args, c.candidates, workspace, stream));
  M3SA_RETURN_IF_ERROR(all_gather_u64(c.candidates, c.gathered,
                                      plan.candidate_bytes / sizeof(uint64_t), nccl_comm,
                                      as_stream(stream)));
  return merge_shard_candidates(plan, c.gathered, args.batch, args.topk, stream);
}

} // namespace m3sa::cuda
