#pragma once
// Host side of the CUDA backend, callable from plain C++ (the stream travels as void*).
#include "m3sa/context_parallel.h"
#include "m3sa/ops.h"

namespace m3sa::cuda {

int visible_device_count();

Status make_plan(const PlanRequest& request, OpPlan* plan);
Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      void* stream);
Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    void* stream);
Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          void* stream);
Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace, void* stream);
Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& args, Workspace workspace,
                        void* stream);
Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& args, Workspace workspace,
                        void* stream);
Status prepare_workspace(const OpPlan& plan, Workspace workspace, void* stream);
Status read_device_errors(const OpPlan& plan, Workspace workspace, void* stream, int32_t* flags);

Status make_context_parallel_plan(const PlanRequest& request, const ContextShard& shard,
                                  ContextParallelPlan* plan);
Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          void* stream);
Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              uint64_t* candidates, Workspace workspace, void* stream);
Status merge_shard_candidates(const ContextParallelPlan& plan, const uint64_t* gathered,
                              const BatchMetadata& batch, const TensorView& topk, void* stream);
Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace, void* stream);

} // namespace m3sa::cuda
