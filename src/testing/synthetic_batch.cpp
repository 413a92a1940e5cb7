#include "testing/synthetic_batch.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace m3sa::testing {

SyntheticBatch::SyntheticBatch(const BatchSpec& spec) : spec_(spec) {
  const int requests = static_cast<int>(spec.q_lens.size());
  int max_blocks = 1;
  for (int r = 0; r < requests; ++r) {
    const int blocks = (spec.seq_lens[r] + kBlockTokens - 1) / kBlockTokens;
    num_pages_ += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  num_pages_ = std::max(num_pages_, 1);
  width_ = std::max(max_blocks + spec.extra_columns, spec.min_width);

  int64_t tokens = 0;
  for (int32_t q_len : spec.q_lens) tokens += q_len;
  cu_q_lens.reset(DType::i32, {requests + 1});
  seq_lens.reset(DType::i32, {requests});
  block_table.reset(DType::i32, {requests, width_});
  kv_block_table.reset(DType::i32, {requests, width_});
  index_q.reset(spec.index_dtype, {tokens, spec.index_heads, kHeadDim});
  index_k_cache.reset(spec.index_dtype, {num_pages_, kBlockTokens, kHeadDim});
  if (spec.q_heads > 0) {
    q.reset(DType::bf16, {tokens, spec.q_heads, kHeadDim});
    k_cache.reset(spec.kv_dtype, {num_pages_, kBlockTokens, spec.kv_heads, kHeadDim});
    v_cache.reset(spec.kv_dtype, {num_pages_, kBlockTokens, spec.kv_heads, kHeadDim});
  }
  status_ = check_allocated({&cu_q_lens, &seq_lens, &block_table, &kv_block_table, &index_q,
                             &index_k_cache, &q, &k_cache, &v_cache},
                            "synthetic batch");
  if (!status_.ok()) return;

  cu_q_lens.data<int32_t>()[0] = 0;
  for (int r = 0; r < requests; ++r) {
    cu_q_lens.data<int32_t>()[r + 1] = cu_q_lens.data<int32_t>()[r] + spec.q_lens[r];
    seq_lens.data<int32_t>()[r] = spec.seq_lens[r];
    for (int i = 0; i < spec.q_lens[r]; ++i) token_request_.push_back(r);
  }
  num_tokens_ = cu_q_lens.data<int32_t>()[requests];

  // Two independent page permutations: one for the index cache, one for the KV cache.
  Rng rng(spec.seed);
  for (HostTensor* table : {&block_table, &kv_block_table}) {
    std::vector<int32_t> pages(num_pages_);
    std::iota(pages.begin(), pages.end(), 0);
    if (spec.shuffle_pages)
      for (int i = num_pages_ - 1; i > 0; --i) std::swap(pages[i], pages[rng.uniform_int(0, i)]);
    table->fill_bytes(0xff); // -1: columns past a request's blocks name no page
    int next = 0;
    for (int r = 0; r < requests; ++r)
      for (int b = 0; b < (spec.seq_lens[r] + kBlockTokens - 1) / kBlockTokens; ++b)
        table->data<int32_t>()[r * width_ + b] = pages[next++];
  }
  if (!spec.separate_kv_table)
    std::copy_n(block_table.data<int32_t>(), requests * width_, kv_block_table.data<int32_t>());

  // NaN everywhere first: slots no request covers must never be read.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < index_k_cache.view().numel(); ++i)
    store(spec.index_dtype, index_k_cache.view().data, i, nan);
  index_q.fill_bytes(0);
  if (spec.q_heads > 0) {
    for (HostTensor* cache : {&k_cache, &v_cache})
      for (int64_t i = 0; i < cache->view().numel(); ++i)
        store(spec.kv_dtype, cache->view().data, i, nan);
    q.fill_bytes(0);
  }
}

BatchMetadata SyntheticBatch::batch() const {
  BatchMetadata b;
  b.cu_q_lens = cu_q_lens.view();
  b.seq_lens = seq_lens.view();
  b.block_table = block_table.view();
  b.num_requests = static_cast<int>(spec_.q_lens.size());
  b.num_decode_requests = spec_.num_decode;
  b.decode_q_len = spec_.decode_q_len;
  b.num_tokens = num_tokens_;
  return b;
}

Capacities SyntheticBatch::capacities() const {
  return {std::max<int64_t>(1, static_cast<int64_t>(spec_.q_lens.size())), std::max(1, num_tokens_),
          width_};
}

int SyntheticBatch::request_of(int64_t token) const { return token_request_[token]; }

int64_t SyntheticBatch::position(int64_t token) const {
  const int r = request_of(token);
  if (spec_.seq_lens[r] == 0) return -1;
  return spec_.seq_lens[r] - spec_.q_lens[r] + (token - cu_q_lens.data<int32_t>()[r]);
}

void SyntheticBatch::set_index_k(int r, int64_t j, int d, float value) {
  const int64_t page = this->page(r, j / kBlockTokens);
  store(spec_.index_dtype, index_k_cache.view().data,
        (page * kBlockTokens + j % kBlockTokens) * kHeadDim + d, value);
}

void SyntheticBatch::fill_index_random(uint64_t seed) {
  Rng rng(seed);
  fill_index([&](int, int64_t, int) { return static_cast<float>(rng.uniform() * 4 - 2); },
             [&](int64_t, int, int) { return static_cast<float>(rng.uniform() * 4 - 2); });
}

void SyntheticBatch::fill_index_integers(uint64_t seed, int lo, int hi) {
  Rng rng(seed);
  fill_index([&](int, int64_t, int) { return static_cast<float>(rng.uniform_int(lo, hi)); },
             [&](int64_t, int, int) { return static_cast<float>(rng.uniform_int(lo, hi)); });
}

void SyntheticBatch::fill_attention_random(uint64_t seed) {
  Rng rng(seed);
  const auto uniform = [&] { return static_cast<float>(rng.uniform() * 4 - 2); };
  for (int64_t i = 0; i < q.view().numel(); ++i) store(DType::bf16, q.view().data, i, uniform());
  const int64_t row = int64_t{spec_.kv_heads} * kHeadDim;
  for (int r = 0; r < static_cast<int>(spec_.seq_lens.size()); ++r)
    for (int64_t j = 0; j < spec_.seq_lens[r]; ++j) {
      const int64_t page = kv_block_table.data<int32_t>()[r * width_ + j / kBlockTokens];
      const int64_t base = (page * kBlockTokens + j % kBlockTokens) * row;
      for (int64_t i = 0; i < row; ++i) {
        store(spec_.kv_dtype, k_cache.view().data, base + i, uniform());
        store(spec_.kv_dtype, v_cache.view().data, base + i, uniform());
      }
    }
}

PlannedOp::PlannedOp(const PlanRequest& request) {
  status = make_plan(request, &plan);
  if (status.ok()) {
    workspace_buffer.reset(DType::i32, {static_cast<int64_t>((plan.workspace_bytes + 3) / 4)});
    workspace_buffer.fill_bytes(0xcd); // poisoned: nothing may rely on its contents
  }
}

} // namespace m3sa::testing
