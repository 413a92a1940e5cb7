#pragma once
// Synthetic MSA batches for tests, the CLI demo and benchmarks: varlen paged metadata with shuffled
// page ids, index-Q/K and main-attention tensors, and fills (random, integer-valued, per-block
// constants). Cache slots past each request's seq_len hold NaN so that a read beyond it shows.
#include <cstdint>
#include <vector>

#include "m3sa/m3sa.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {

struct BatchSpec {
  std::vector<int32_t> q_lens;   // per request; decode requests first
  std::vector<int32_t> seq_lens; // per request, including this step's tokens; 0 = padding
  int num_decode = 0;
  int decode_q_len = 1;
  int index_heads = 4;
  DType index_dtype = DType::bf16;
  int q_heads = 0; // main attention tensors are built when > 0
  int kv_heads = 0;
  DType kv_dtype = DType::bf16;
  bool shuffle_pages = true;
  bool separate_kv_table = true; // false: the KV cache uses the index cache's block table
  int extra_columns = 0;         // block-table width beyond what the longest request needs
  int min_width = 0;             // block-table width at least this
  uint64_t seed = 1;
};

class SyntheticBatch {
public:
  explicit SyntheticBatch(const BatchSpec& spec);
  // Not OK when a tensor could not be allocated: nothing is filled then, and nothing else of the
  // batch may be used.
  Status status() const { return status_; }

  BatchMetadata batch() const;
  Capacities capacities() const;
  const BatchSpec& spec() const { return spec_; }
  int num_tokens() const { return num_tokens_; }
  int num_pages() const { return num_pages_; }
  int width() const { return width_; }
  int request_of(int64_t token) const;
  int64_t position(int64_t token) const; // -1 for padding rows
  int32_t page(int r, int64_t block) const {
    return block_table.data<int32_t>()[r * width_ + block];
  }

  // Index branch. value(request, key position, dim) and value(token, head, dim) are rounded to the
  // index dtype.
  template <typename KeyFn, typename QueryFn>
  void fill_index(KeyFn&& key_value, QueryFn&& query_value) {
    for (int r = 0; r < static_cast<int>(spec_.seq_lens.size()); ++r)
      for (int64_t j = 0; j < spec_.seq_lens[r]; ++j)
        for (int d = 0; d < kHeadDim; ++d) set_index_k(r, j, d, key_value(r, j, d));
    for (int64_t t = 0; t < num_tokens_; ++t)
      for (int h = 0; h < spec_.index_heads; ++h)
        for (int d = 0; d < kHeadDim; ++d)
          store(spec_.index_dtype, index_q.view().data, (t * spec_.index_heads + h) * kHeadDim + d,
                query_value(t, h, d));
  }
  void fill_index_random(uint64_t seed);                   // uniform in [-2, 2)
  void fill_index_integers(uint64_t seed, int lo, int hi); // exact in bf16 and e4m3 for |v| <= 16
  void fill_attention_random(uint64_t seed);               // q, k, v uniform in [-2, 2)
  void set_index_k(int r, int64_t j, int d, float value);

  HostTensor cu_q_lens, seq_lens, block_table, kv_block_table;
  HostTensor index_q, index_k_cache; // [T, H, 128], [P, 128, 128]
  HostTensor q, k_cache, v_cache;    // [T, Hq, 128], [P, 128, Hkv, 128] x2

private:
  // Index-K rows and index-q rows from draw(rng), each row from its own stream (parallel).
  template <typename DrawFn> void fill_index_rows(uint64_t seed, DrawFn&& draw);

  Status status_;
  BatchSpec spec_;
  int num_tokens_ = 0;
  int num_pages_ = 0;
  int width_ = 0;
  std::vector<int32_t> token_request_;
};

// Owns a plan's workspace, 64-byte aligned.
struct PlannedOp {
  OpPlan plan;
  HostTensor workspace_buffer;
  Status status;
  PlannedOp(const PlanRequest& request);
  Workspace workspace() const { return {workspace_buffer.view().data, workspace_buffer.bytes()}; }
};

} // namespace m3sa::testing
