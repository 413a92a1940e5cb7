#include "testing/synthetic_batch.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

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
  fill_value(spec.index_dtype, index_k_cache.view().data, index_k_cache.view().numel(), nan);
  index_q.fill_bytes(0);
  if (spec.q_heads > 0) {
    for (HostTensor* cache : {&k_cache, &v_cache})
      fill_value(spec.kv_dtype, cache->view().data, cache->view().numel(), nan);
    q.fill_bytes(0);
  }
}

namespace {

// Rng::for_row's streams: each row of random test data draws from its own, keyed by what the row
// is, so rows fill in parallel (the GPU suite's batches hold up to ~10^9 cache values) and the data
// depends on the seed alone, not on the number of threads.
enum RowStream : uint64_t { kIndexKeyRow = 1, kIndexQueryRow, kKeyValueRow, kQueryRow };
uint64_t position_row(int r, int64_t j) { return (static_cast<uint64_t>(r) << 32) | j; }
float uniform_pm2(Rng& rng) { return static_cast<float>(rng.uniform() * 4 - 2); }

// row(r, j) for every cached position j of every request r, in parallel by 128-token block.
template <typename RowFn> void for_each_cached_position(const BatchSpec& spec, RowFn&& row) {
  std::vector<std::pair<int, int64_t>> blocks; // (request, first position)
  for (int r = 0; r < static_cast<int>(spec.seq_lens.size()); ++r)
    for (int64_t j = 0; j < spec.seq_lens[r]; j += kBlockTokens) blocks.emplace_back(r, j);
#pragma omp parallel for schedule(dynamic, 8)
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [r, first] = blocks[i];
    for (int64_t j = first; j < std::min<int64_t>(first + kBlockTokens, spec.seq_lens[r]); ++j)
      row(r, j);
  }
}

// row(i) for i in [0, count), in parallel.
template <typename RowFn> void for_each_row(int64_t count, RowFn&& row) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) row(i);
}

} // namespace

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

template <typename DrawFn> void SyntheticBatch::fill_index_rows(uint64_t seed, DrawFn&& draw) {
  for_each_cached_position(spec_, [&](int r, int64_t j) {
    Rng rng = Rng::for_row(seed, kIndexKeyRow, position_row(r, j));
    const int64_t slot = int64_t{page(r, j / kBlockTokens)} * kBlockTokens + j % kBlockTokens;
    store_run(spec_.index_dtype, index_k_cache.view().data, slot * kHeadDim, kHeadDim,
              [&](int64_t) { return draw(rng); });
  });
  for_each_row(int64_t{num_tokens_} * spec_.index_heads, [&](int64_t row) {
    Rng rng = Rng::for_row(seed, kIndexQueryRow, row);
    store_run(spec_.index_dtype, index_q.view().data, row * kHeadDim, kHeadDim,
              [&](int64_t) { return draw(rng); });
  });
}

void SyntheticBatch::fill_index_random(uint64_t seed) { fill_index_rows(seed, uniform_pm2); }

void SyntheticBatch::fill_index_integers(uint64_t seed, int lo, int hi) {
  fill_index_rows(seed, [lo, hi](Rng& rng) { return static_cast<float>(rng.uniform_int(lo, hi)); });
}

void SyntheticBatch::fill_attention_random(uint64_t seed) {
  if (spec_.q_heads <= 0) return; // no q or KV caches
  const int64_t q_row = int64_t{spec_.q_heads} * kHeadDim;
  for_each_row(num_tokens_, [&](int64_t t) {
    Rng rng = Rng::for_row(seed, kQueryRow, t);
    store_run(DType::bf16, q.view().data, t * q_row, q_row,
              [&](int64_t) { return uniform_pm2(rng); });
  });
  const int64_t kv_row = int64_t{spec_.kv_heads} * kHeadDim;
  for_each_cached_position(spec_, [&](int r, int64_t j) {
    Rng rng = Rng::for_row(seed, kKeyValueRow, position_row(r, j));
    const int64_t page = kv_block_table.data<int32_t>()[r * width_ + j / kBlockTokens];
    const int64_t base = (page * kBlockTokens + j % kBlockTokens) * kv_row;
    for (HostTensor* cache : {&k_cache, &v_cache})
      store_run(spec_.kv_dtype, cache->view().data, base, kv_row,
                [&](int64_t) { return uniform_pm2(rng); });
  });
}

PlannedOp::PlannedOp(const PlanRequest& request) {
  status = make_plan(request, &plan);
  if (status.ok()) {
    workspace_buffer.reset(DType::i32, {static_cast<int64_t>((plan.workspace_bytes + 3) / 4)});
    workspace_buffer.fill_bytes(0xcd); // poisoned: nothing may rely on its contents
  }
}

} // namespace m3sa::testing
