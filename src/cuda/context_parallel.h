#pragma once
// Host side of the CUDA context-parallel indexer, callable from plain C++ (streams as void*).
#include <cstdint>

#include "m3sa/context_parallel.h"

namespace m3sa::cuda {

// The implementations whose decode kernels score a rank's shard (ContextParallelPlan::scoring),
// best first: the first that plans on the device is taken (sm90 streams the pages by TMA).
inline constexpr const char* kContextParallelScoring[] = {"cuda.index_topk.sm90",
                                                          "cuda.index_topk.sm80"};

// Completes `plan` (request, shard and scoring already set): candidate and workspace sizes.
Status size_context_parallel_plan(ContextParallelPlan* plan);
Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          void* stream);
Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              uint64_t* candidates, Workspace workspace, void* stream);
Status merge_shard_candidates(const ContextParallelPlan& plan, const uint64_t* gathered,
                              const BatchMetadata& batch, const TensorView& topk, void* stream);
Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace, void* stream);

} // namespace m3sa::cuda
