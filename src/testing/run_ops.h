#pragma once
// Plan + workspace + poisoned outputs + run, for one op on a SyntheticBatch. Used by the tests and
// the CLI so that both exercise the public API the same way.
#include "m3sa/m3sa.h"
#include "testing/host_tensor.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

struct RunOptions {
  Backend backend = Backend::cpu;
  int num_threads = 0;            // plan and run thread count (0 = default)
  bool use_kv_block_table = true; // attention: pass the KV cache's own block table
  float k_scale = 1.f, v_scale = 1.f; // attention: the caches' dequantisation scales
};

PlanRequest plan_request(OpKind op, const MsaConfig& config, const SyntheticBatch& sb,
                         const RunOptions& options);

// Each allocates and poisons its outputs, then runs the op through the public API.
Status run_score_blocks(const MsaConfig& config, const SyntheticBatch& sb,
                        const RunOptions& options, HostTensor* scores);
Status run_select_topk_blocks(const MsaConfig& config, const SyntheticBatch& sb,
                              const HostTensor& scores, const RunOptions& options,
                              HostTensor* topk);
Status run_index_topk(const MsaConfig& config, const SyntheticBatch& sb, const RunOptions& options,
                      HostTensor* topk);
Status run_sparse_attention(const MsaConfig& config, const SyntheticBatch& sb,
                            const HostTensor& topk, const RunOptions& options, HostTensor* out,
                            HostTensor* lse);

SparseAttentionArgs attention_args(const SyntheticBatch& sb, const HostTensor& topk,
                                   const HostTensor& out, const HostTensor& lse,
                                   bool use_kv_block_table);

} // namespace m3sa::testing
