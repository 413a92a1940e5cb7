// The dtype-independent steps of the block-major prefill: gather the selection entries, sort them
// by (KV head, page) with CUB, merge the per-block partials of every token.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/kernels/sparse_attention_prefill.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

// One thread per (KV head, pass token, slot).
__global__ void gather_selection_entries_kernel(const SparseAttentionParams p) {
  const int pass_tokens = p.token_end - p.token_begin;
  const int64_t entries = int64_t{pass_tokens} * p.kv_heads * p.top_k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < entries;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int slot = static_cast<int>(e % p.top_k);
    const int g = static_cast<int>((e / p.top_k) % p.kv_heads);
    const int token = static_cast<int>(e / (int64_t{p.top_k} * p.kv_heads));
    const int t = p.token_begin + token;
    const int request = request_of_token(p.cu_q_lens, p.num_requests, t);
    // A bad position is flagged once per token, by slot 0 of head 0.
    const int position = token_position(p, request, t, slot == 0 && g == 0);
    const int32_t block =
        p.topk[g * p.topk_stride_head + int64_t{t} * p.topk_stride_token + slot * p.topk_stride_k];
    const int64_t page = selected_page(p, request, position, block);
    const int64_t index = (int64_t{g} * pass_tokens + token) * p.top_k + slot;
    if (page >= 0) {
      p.entry_keys[index] = static_cast<uint32_t>(g * p.num_pages + page);
      p.entry_values[index] =
          pack_entry(token, slot, min(128, position - block * 128 + 1));
    } else {
      p.entry_keys[index] = p.entry_sentinel; // sorts last; its partial holds no key
      p.entry_values[index] = 0;
      // Every row's max -inf: the merge skips this slot unread.
      const CompactPartialView partial(prefill_partial(p, token, g, slot));
#pragma unroll
      for (int r = 0; r < kAttentionRows; ++r) partial.m[r] = -INFINITY;
    }
  }
}

// One 128-thread group per (pass token, KV head).
__global__ void __launch_bounds__(128) merge_token_partials_kernel(const SparseAttentionParams p) {
  const int pass_tokens = p.token_end - p.token_begin;
  const int64_t pairs = int64_t{pass_tokens} * p.kv_heads;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const int g = static_cast<int>(pair % p.kv_heads), token = static_cast<int>(pair / p.kv_heads);
    store_output_row(p,
                     merge_rows<true, false>(prefill_partial(p, token, g, 0),
                                             kCompactPartialBytes, p.top_k, threadIdx.x),
                     p.token_begin + token, g, threadIdx.x);
  }
}

cudaError_t launch_gather_selection_entries(const SparseAttentionParams& p, int grid,
                                            cudaStream_t s) {
  gather_selection_entries_kernel<<<grid, kGatherThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t selection_sort_temp_bytes(int entries, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const uint32_t*>(nullptr),
                                         static_cast<uint32_t*>(nullptr),
                                         static_cast<const uint32_t*>(nullptr),
                                         static_cast<uint32_t*>(nullptr), entries, 0, 32);
}

cudaError_t sort_selection_entries(const SparseAttentionParams& p, uint32_t* sorted_keys,
                                   uint32_t* sorted_values, int key_bits, void* temp,
                                   size_t temp_bytes, cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, p.entry_keys, sorted_keys,
                                         p.entry_values, sorted_values, p.entry_count, 0, key_bits,
                                         s);
}

cudaError_t launch_merge_token_partials(const SparseAttentionParams& p, int grid, cudaStream_t s) {
  merge_token_partials_kernel<<<grid, 128, 0, s>>>(p);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
