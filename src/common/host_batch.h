#pragma once
// Reads batch metadata that lives in host memory (reference and CPU backends, host validation).
#include <cstdint>

#include "m3sa/batch.h"

namespace m3sa::detail {

struct HostBatch {
  explicit HostBatch(const BatchMetadata& batch) : batch_(batch) {}

  int num_requests() const { return batch_.num_requests; }
  int num_tokens() const { return batch_.num_tokens; }
  int32_t q_begin(int r) const { return at(batch_.cu_q_lens, r); }
  // In int64: before validation cu_q_lens holds anything, and INT32_MIN - 3 overflows int32.
  int64_t q_len(int r) const {
    return int64_t{at(batch_.cu_q_lens, r + 1)} - at(batch_.cu_q_lens, r);
  }
  int32_t seq_len(int r) const { return at(batch_.seq_lens, r); }
  int64_t block_table_width() const { return batch_.block_table.shape[1]; }
  // The request that owns packed token t (cu_q_lens is non-decreasing: the last r with q_begin <=
  // t).
  int request_of_token(int64_t t) const {
    int lo = 0, hi = batch_.num_requests - 1, found = 0;
    while (lo <= hi) {
      const int mid = lo + (hi - lo) / 2;
      if (q_begin(mid) <= t)
        found = mid, lo = mid + 1;
      else
        hi = mid - 1;
    }
    return found;
  }
  int32_t page(const TensorView& table, int r, int64_t block) const {
    return table.ptr<const int32_t>()[r * table.strides[0] + block * table.strides[1]];
  }
  int32_t page(int r, int64_t block) const { return page(batch_.block_table, r, block); }

private:
  static int32_t at(const TensorView& v, int64_t i) {
    return v.ptr<const int32_t>()[i * v.strides[0]];
  }
  const BatchMetadata& batch_;
};

} // namespace m3sa::detail
