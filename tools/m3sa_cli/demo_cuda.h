#pragma once
#include "m3sa/m3sa.h"
#include "testing/synthetic_batch.h"

namespace m3sa::cli {

// The demo's indexer stages on the GPU: uploads the batch and this step's projections, runs
// norm_rope_insert and index_topk with CUDA-event timing (transfers excluded), and brings the
// written outputs (q, index-Q, KV and index caches) and the selections back into the host
// tensors `step` points at, and `topk`.
Status run_indexer_on_cuda(const MsaConfig& config, const testing::SyntheticBatch& sb,
                           const NormRopeInsertArgs& step, testing::HostTensor& topk,
                           double* norm_rope_ms, double* topk_ms);

} // namespace m3sa::cli
