#pragma once
// CPU backend: OpenMP over rows, fp32 accumulation. Every output row is computed by one thread in a
// fixed order, so results do not depend on the thread count. Inputs arrive validated by src/api.
#include <cstddef>

#include "m3sa/ops.h"

namespace m3sa::cpu {

int default_num_threads();
size_t workspace_bytes(const PlanRequest& request, int num_threads);
size_t attention_workspace_bytes(const PlanRequest& request, int num_threads);

void insert_index_k(const InsertIndexKArgs& args, int num_threads);
void score_blocks(const MsaConfig& config, const ScoreBlocksArgs& args, Workspace workspace,
                  int num_threads);
void select_topk_blocks(const MsaConfig& config, const SelectTopkBlocksArgs& args,
                        Workspace workspace, int num_threads);
void index_topk(const MsaConfig& config, const IndexTopkArgs& args, Workspace workspace,
                int num_threads);
void sparse_attention(const PlanRequest& request, const SparseAttentionArgs& args,
                      Workspace workspace, int num_threads);
void norm_rope_insert(const MsaConfig& config, const NormRopeInsertArgs& args, int num_threads);

} // namespace m3sa::cpu
