#pragma once
// The oracle: scalar, single-threaded, double accumulation, written to be read. It shares only the
// storage conversions (m3sa/numeric.h, tested bit-exactly against CUDA) and the host batch reader
// with the other backends, and never calls them. Inputs arrive validated by src/api.
#include <cstddef>

#include "m3sa/ops.h"

namespace m3sa::ref {

size_t workspace_bytes(const PlanRequest& request);

void insert_index_k(const InsertIndexKArgs& args);
void score_blocks(const MsaConfig& config, const ScoreBlocksArgs& args);
void select_topk_blocks(const MsaConfig& config, const SelectTopkBlocksArgs& args,
                        Workspace workspace);
void index_topk(const MsaConfig& config, const IndexTopkArgs& args, Workspace workspace);
void sparse_attention(const SparseAttentionArgs& args, Workspace workspace);
void norm_rope_insert(const MsaConfig& config, const NormRopeInsertArgs& args);

} // namespace m3sa::ref
