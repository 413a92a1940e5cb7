#pragma once
// The index branch of a SyntheticBatch on the device.
#include "gpu/cuda_test_util.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

struct DeviceBatch {
  DeviceBuffer cu_q_lens, seq_lens, block_table, index_q, index_k_cache;
  int num_requests, num_decode, decode_q_len, num_tokens;
  explicit DeviceBatch(const SyntheticBatch& sb)
      : cu_q_lens(sb.cu_q_lens), seq_lens(sb.seq_lens), block_table(sb.block_table),
        index_q(sb.index_q), index_k_cache(sb.index_k_cache), num_requests(sb.batch().num_requests),
        num_decode(sb.spec().num_decode), decode_q_len(sb.spec().decode_q_len),
        num_tokens(sb.num_tokens()) {}
  BatchMetadata batch() const {
    return {cu_q_lens.view(), seq_lens.view(), block_table.view(), num_requests,
            num_decode,       decode_q_len,    num_tokens};
  }
};

} // namespace m3sa::testing
