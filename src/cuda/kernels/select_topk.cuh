#pragma once
// Top-k block selection (contract §5), one warp per (index head, token) row. Each lane keeps the
// MaxK best of its strided share of the candidates in registers (a branch-free compare-exchange
// chain, constant indices only), then the warp merges the lane lists by repeated warp-wide max.
// Keys pack (rank of the score, ~block id) into 64 bits, so "larger key" is exactly the contract's
// order: score descending, NaN last, lower id first on ties.
#include <cstdint>

#include "cuda/indexer_params.h"
#include "cuda/kernels/common.cuh"

namespace m3sa::cuda {

inline constexpr int kSelectWarps = 8;

__device__ __forceinline__ uint64_t selection_key(float score, int32_t block) {
  return (static_cast<uint64_t>(rank_key(score)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(block));
}

// Where a row's selection stands after its trivial cases are handled.
struct SelectionRow {
  int32_t* out;
  const float* scores;
  int n, fill, local_begin;
  bool done; // written already (padding, n <= K, or refused)
};

// Position and causal block count of (h, t); writes the rows that need no ranking. Lanes of one
// warp share the writes (`writer` false: another warp writes).
__device__ __forceinline__ SelectionRow begin_selection_row(const SelectTopkParams& p, int h, int t,
                                                            int lane, bool writer) {
  const int r = request_of_token(p.cu_q_lens, p.num_requests, t);
  const int seq_len = p.seq_lens[r];
  const int q_len = p.cu_q_lens[r + 1] - p.cu_q_lens[r];
  const int position = seq_len == 0 ? -1 : seq_len - q_len + (t - p.cu_q_lens[r]);
  SelectionRow row;
  row.n = position < 0 ? 0 : position / 128 + 1;
  row.out = p.topk + h * p.topk_stride_head + t * p.topk_stride_token;
  row.scores = p.scores + h * p.score_stride_head + t * p.score_stride_token;
  row.fill = p.top_k - p.init_blocks - p.local_blocks;
  row.local_begin = row.n - p.local_blocks;
  row.done = true;
  if (row.n > p.score_width) { // seq_len beyond the block table: nothing valid to read
    if (writer) {
      for (int slot = lane; slot < p.top_k; slot += 32) row.out[slot * p.topk_stride_k] = -1;
      if (lane == 0) atomicOr(p.error_flags, kSeqLenBeyondTable);
    }
  } else if (row.n <= p.top_k) {
    if (writer)
      for (int slot = lane; slot < p.top_k; slot += 32)
        row.out[slot * p.topk_stride_k] = slot < row.n ? slot : -1;
  } else {
    row.done = false;
  }
  return row;
}

// Inserts `key` into a lane's descending list (compare-exchange chain: constant indices only).
template <int MaxK>
__device__ __forceinline__ void insert_key(uint64_t (&best)[MaxK], uint64_t key) {
  if (key <= best[MaxK - 1]) return;
#pragma unroll
  for (int i = 0; i < MaxK; ++i) {
    const uint64_t hi = max(best[i], key);
    key = min(best[i], key);
    best[i] = hi;
  }
}

// Candidates b = first, first + step, ... below `end`, ranked into the lane's list.
template <int MaxK>
__device__ __forceinline__ void rank_candidates(uint64_t (&best)[MaxK], const SelectTopkParams& p,
                                                const float* scores, int first, int end, int step) {
#pragma unroll
  for (int i = 0; i < MaxK; ++i) best[i] = 0; // 0 is below every real key
  for (int b = first; b < end; b += step)
    insert_key(best, selection_key(scores[b * p.score_stride_block], b));
}

// `fill` rounds of "the largest list head wins, its lane pops it": lane i returns round i's key.
template <int MaxK>
__device__ __forceinline__ uint64_t merge_warp(uint64_t (&best)[MaxK], int fill, int lane) {
  uint64_t mine = 0;
  for (int round = 0; round < fill; ++round) {
    uint64_t top = best[0];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      top = max(top, __shfl_xor_sync(0xffffffffu, top, offset));
    if (best[0] == top) { // keys are unique (they hold the block id), so one lane pops
#pragma unroll
      for (int i = 0; i < MaxK - 1; ++i) best[i] = best[i + 1];
      best[MaxK - 1] = 0;
    }
    if (lane == round) mine = top;
  }
  return mine;
}

// Writes init blocks, the chosen blocks in ascending order, then the local blocks.
__device__ __forceinline__ void write_selection(const SelectTopkParams& p, const SelectionRow& row,
                                                uint64_t chosen_key, int lane) {
  const int32_t chosen = lane < row.fill
                             ? static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(chosen_key))
                             : 0x7fffffff;
  int rank = 0; // among the chosen ids: the ascending slot after the forced init blocks
  for (int i = 0; i < row.fill; ++i) rank += __shfl_sync(0xffffffffu, chosen, i) < chosen;
  if (lane < row.fill) row.out[(p.init_blocks + rank) * p.topk_stride_k] = chosen;
  for (int slot = lane; slot < p.init_blocks; slot += 32) row.out[slot * p.topk_stride_k] = slot;
  for (int i = lane; i < p.local_blocks; i += 32)
    row.out[(p.init_blocks + row.fill + i) * p.topk_stride_k] = row.local_begin + i;
}

// One warp per row: rows of up to a few thousand blocks (prefill, small decode contexts).
template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32)
    select_topk_kernel(const __grid_constant__ SelectTopkParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row_index = blockIdx.x * kSelectWarps + warp;
  const int h = row_index / p.token_capacity, t = row_index % p.token_capacity;
  if (h >= p.heads || t >= p.num_tokens) return;
  const SelectionRow row = begin_selection_row(p, h, t, lane, true);
  if (row.done) return;
  uint64_t best[MaxK];
  rank_candidates(best, p, row.scores, p.init_blocks + lane, row.local_begin, 32);
  write_selection(p, row, merge_warp(best, row.fill, lane), lane);
}

// One CTA per row for long contexts (up to 8192+ blocks): each warp ranks a 1/8 share, then
// warp 0 merges the eight lists. Used by plans whose rows are few and wide (decode).
template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32)
    select_topk_wide_kernel(const __grid_constant__ SelectTopkParams p) {
  __shared__ uint64_t lists[kSelectWarps][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.x / p.token_capacity, t = blockIdx.x % p.token_capacity;
  if (h >= p.heads || t >= p.num_tokens) return;
  const SelectionRow row = begin_selection_row(p, h, t, lane, warp == 0);
  if (row.done) return; // uniform across the CTA: every warp computed the same row
  uint64_t best[MaxK];
  rank_candidates(best, p, row.scores, p.init_blocks + warp * 32 + lane, row.local_begin,
                  32 * kSelectWarps);
  lists[warp][lane] = merge_warp(best, row.fill, lane); // lanes >= fill hold 0
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < MaxK; ++i) best[i] = 0;
  for (int w = 0; w < kSelectWarps; ++w) insert_key(best, lists[w][lane]);
  write_selection(p, row, merge_warp(best, row.fill, lane), lane);
}

} // namespace m3sa::cuda
