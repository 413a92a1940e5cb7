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

template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32)
    select_topk_kernel(const __grid_constant__ SelectTopkParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * kSelectWarps + warp;
  const int h = row / p.token_capacity, t = row % p.token_capacity;
  if (h >= p.heads || t >= p.num_tokens) return;
  const int r = request_of_token(p.cu_q_lens, p.num_requests, t);
  const int seq_len = p.seq_lens[r];
  const int q_len = p.cu_q_lens[r + 1] - p.cu_q_lens[r];
  const int position = seq_len == 0 ? -1 : seq_len - q_len + (t - p.cu_q_lens[r]);
  const int n = position < 0 ? 0 : position / 128 + 1;
  int32_t* out = p.topk + h * p.topk_stride_head + t * p.topk_stride_token;
  const int k = p.top_k;

  if (n > p.score_width) { // seq_len beyond the block table: nothing valid to read
    for (int slot = lane; slot < k; slot += 32) out[slot * p.topk_stride_k] = -1;
    if (lane == 0) atomicOr(p.error_flags, kSeqLenBeyondTable);
    return;
  }
  if (n <= k) {
    for (int slot = lane; slot < k; slot += 32) out[slot * p.topk_stride_k] = slot < n ? slot : -1;
    return;
  }
  const int fill = k - p.init_blocks - p.local_blocks;
  const int local_begin = n - p.local_blocks;
  const float* scores = p.scores + h * p.score_stride_head + t * p.score_stride_token;

  uint64_t best[MaxK]; // descending; 0 is below every real key
#pragma unroll
  for (int i = 0; i < MaxK; ++i) best[i] = 0;
  if (fill > 0) {
    for (int b = p.init_blocks + lane; b < local_begin; b += 32) {
      uint64_t key = selection_key(scores[b * p.score_stride_block], b);
      if (key <= best[MaxK - 1]) continue;
#pragma unroll
      for (int i = 0; i < MaxK; ++i) {
        const uint64_t hi = max(best[i], key);
        key = min(best[i], key);
        best[i] = hi;
      }
    }
  }
  // Warp merge: `fill` rounds of "largest head wins, its lane pops it"; lane i keeps round i's id.
  int32_t chosen = 0x7fffffff;
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
    if (lane == round) chosen = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(top));
  }
  // Ranks among the chosen ids give their ascending slots after the forced init blocks.
  int rank = 0;
  for (int i = 0; i < fill; ++i) rank += __shfl_sync(0xffffffffu, chosen, i) < chosen;
  if (lane < fill) out[(p.init_blocks + rank) * p.topk_stride_k] = chosen;
  for (int slot = lane; slot < p.init_blocks; slot += 32) out[slot * p.topk_stride_k] = slot;
  for (int i = lane; i < p.local_blocks; i += 32)
    out[(p.init_blocks + fill + i) * p.topk_stride_k] = local_begin + i;
}

} // namespace m3sa::cuda
