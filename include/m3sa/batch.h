#pragma once
// Varlen paged batch layout (docs/contract.md §2). Decode requests come first, each with the same
// q_len; prefill requests (chunked prefill with any prefix) follow.
#include <cstdint>

#include "m3sa/tensor_view.h"

namespace m3sa {

struct BatchMetadata {
  TensorView cu_q_lens; // [num_requests + 1] i32, cu_q_lens[0] == 0, non-decreasing
  TensorView seq_lens;  // [num_requests] i32, cached tokens including this step's; 0 = padding row
  TensorView block_table; // [num_requests, max_blocks_per_request] i32, logical block -> page
  int num_requests = 0;
  int num_decode_requests = 0; // the first requests; each has q_len == decode_q_len
  int decode_q_len = 1;        // 1..16 (MTP)
  int num_tokens = 0;          // packed query tokens T == cu_q_lens[num_requests]
};

// Upper bounds a plan is sized for. run() rejects batches beyond them.
struct Capacities {
  int64_t max_requests = 0;
  int64_t max_tokens = 0;
  int64_t max_blocks_per_request = 0; // block-table width; 8192 blocks = 1M tokens
};

} // namespace m3sa
