#pragma once
#include "m3sa/m3sa.h"
#include "testing/synthetic_batch.h"

namespace m3sa::cli {

// The demo's layer on the GPU: uploads the batch and this step's projections, runs
// norm_rope_insert and index_topk, and with `attention` (non-null) sparse_attention on what they
// wrote, each timed with CUDA events after one untimed call (the first call of a kernel loads
// its module); transfers are excluded. Brings the written outputs (q, index-Q, KV and index
// caches), the selections and the attention's out / lse back into the host tensors.
struct GpuAttention {
  testing::HostTensor* out; // [T, Hq, 128] bf16
  testing::HostTensor* lse; // [T, Hq] f32
  double* ms;
};
Status run_layer_on_cuda(const MsaConfig& config, const testing::SyntheticBatch& sb,
                         const NormRopeInsertArgs& step, testing::HostTensor& topk,
                         double* norm_rope_ms, double* topk_ms, const GpuAttention* attention);

} // namespace m3sa::cli
