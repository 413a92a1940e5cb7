#pragma once
#include "m3sa/m3sa.h"
#include "testing/synthetic_batch.h"

namespace m3sa::cli {

// The demo's indexer stages on the GPU: uploads the batch, runs insert_index_k and index_topk with
// CUDA-event timing (transfers excluded), and brings the updated index cache and the selections
// back into `sb` and `topk`.
Status run_indexer_on_cuda(const MsaConfig& config, testing::SyntheticBatch& sb,
                           const testing::HostTensor& rows, const testing::HostTensor& slots,
                           testing::HostTensor& topk, double* insert_ms, double* topk_ms);

} // namespace m3sa::cli
