#pragma once
// Context-parallel decode indexer (CUDA): a request's index-K blocks are sharded over ranks; each
// rank scores its own blocks with the decode kernels, keeps its best candidates as (score, block)
// keys, the ranks all-gather the keys (NCCL), and every rank merges them into the same selection
// the single-GPU index_topk gives (contract §5 order and ties; forced blocks added by the merge).
//
// Sharding of global block b (its 128 tokens) over num_ranks ranks:
//   contiguous:  rank b / span, span = ceil(capacities.max_blocks_per_request / num_ranks)
//   round_robin: rank b % num_ranks
// A rank's cache holds only its blocks; its block table maps the rank's j-th block (in global
// order) to a page of that cache. seq_lens stay global.
#include <cstdint>

#include "m3sa/ops.h"

namespace m3sa {

enum class ShardMode : uint8_t { contiguous, round_robin };

struct ContextShard {
  int rank = 0;
  int num_ranks = 1;
  ShardMode mode = ShardMode::contiguous;
};

// Host helpers for building a rank's block table: the global id of the rank's j-th block, and
// how many of a request's n global blocks the rank holds.
int64_t shard_span(const Capacities& capacities, const ContextShard& shard);
int64_t shard_global_block(const Capacities& capacities, const ContextShard& shard, int64_t j);
int64_t shard_local_blocks(const Capacities& capacities, const ContextShard& shard, int64_t n);

struct ContextParallelPlan {
  PlanRequest request = {}; // op index_topk, backend cuda; capacities are global
  ContextShard shard = {};
  OpPlan scoring = {};        // the decode scoring plan this rank runs
  int ranked_slots = 0;       // candidates per row and rank: top_k - init - local
  size_t candidate_bytes = 0; // one rank's candidates: [H, max_tokens, ranked_slots] u64 keys
  size_t workspace_bytes = 0; // scoring + own candidates + gathered candidates
};

Status make_context_parallel_plan(const PlanRequest& request, const ContextShard& shard,
                                  ContextParallelPlan* plan);

// Once after allocating the workspace, as for every plan (see prepare_workspace).
Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          const ExecContext& ctx = {});

// This rank's decode step: score its shard (args.index_k_cache and args.batch.block_table are the
// rank's; every request must be a decode request), all-gather the candidates over `nccl_comm` (an
// ncclComm_t of num_ranks ranks in which this rank is shard.rank, on ctx.stream), merge, write
// args.topk. Capturable in a CUDA graph. Returns unsupported where m3sa was built without NCCL
// headers or libnccl.so.2 cannot be loaded: the two halves below then serve a caller's own
// exchange.
Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace,
                                   const ExecContext& ctx = {});

// Half 1: this rank's candidates into `candidates` ([H, max_tokens, ranked_slots] i64 holding the
// u64 keys; a slice of the gathered buffer works). args.topk is not written.
Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              const TensorView& candidates, Workspace workspace,
                              const ExecContext& ctx = {});
// Half 2: `gathered` ([num_ranks, H, max_tokens, ranked_slots] i64, rank-major) into topk.
Status merge_shard_candidates(const ContextParallelPlan& plan, const TensorView& gathered,
                              const BatchMetadata& batch, const TensorView& topk,
                              const ExecContext& ctx = {});

} // namespace m3sa
