#pragma once
// Sampled tokens of a SyntheticBatch as a batch of single-token requests that share its caches: a
// lone token at position p sees exactly what it saw in the batch when its seq_len is p + 1. Lets
// the reference (or the CPU backend) check chosen rows of a batch too large to recompute whole.
#include <cstdint>
#include <vector>

#include "testing/host_tensor.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

struct SampleBatch {
  std::vector<int64_t> tokens;
  HostTensor cu_q_lens, seq_lens, block_table, kv_block_table, index_q, q;
  BatchMetadata batch() const {
    BatchMetadata b;
    b.cu_q_lens = cu_q_lens.view();
    b.seq_lens = seq_lens.view();
    b.block_table = block_table.view();
    b.num_requests = static_cast<int>(tokens.size());
    b.num_tokens = static_cast<int>(tokens.size());
    return b;
  }
};

SampleBatch make_sample(const SyntheticBatch& sb, std::vector<int64_t> tokens);

// Copies rows `tokens` of a [.., T, ...] tensor along `token_dim` (0 or 1) into a new tensor.
HostTensor gather_tokens(const HostTensor& src, const std::vector<int64_t>& tokens, int token_dim);

} // namespace m3sa::testing
