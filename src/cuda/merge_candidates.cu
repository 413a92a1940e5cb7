// Context-parallel merge: every rank's candidate keys for a row, merged into its selection with
// the contract's order (one warp per row, the same list merge as the decode kernel's last CTA).
#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

__global__ void __launch_bounds__(kSelectWarps * 32)
    merge_candidates_kernel(const __grid_constant__ MergeCandidatesParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row_index = blockIdx.x * kSelectWarps + warp;
  const int h = row_index / p.token_capacity, t = row_index % p.token_capacity;
  if (h >= p.heads || t >= p.num_tokens) return;
  const int r = request_of_token(p.cu_q_lens, p.num_requests, t);
  const int seq_len = p.seq_lens[r];
  const int q_len = p.cu_q_lens[r + 1] - p.cu_q_lens[r];
  const int position = seq_len == 0 ? -1 : seq_len - q_len + (t - p.cu_q_lens[r]);
  const SelectionRow row =
      make_selection_row(p.topk + h * p.topk_stride_head + t * p.topk_stride_token, p.topk_stride_k,
                         position, p.top_k, p.init_blocks, p.local_blocks);
  if (write_short_row(row, lane)) return;
  uint64_t best[32];
  rank_lists(best, p.candidates + (int64_t{h} * p.token_capacity + t) * row.fill, p.rank_stride,
             row.fill, p.num_ranks, lane, 32);
  write_selection(row, merge_warp(best, row.fill, lane), lane);
}

} // namespace

cudaError_t launch_merge_candidates(const MergeCandidatesParams& params, cudaStream_t stream) {
  const int rows = params.heads * params.token_capacity;
  merge_candidates_kernel<<<(rows + kSelectWarps - 1) / kSelectWarps, kSelectWarps * 32, 0,
                            stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
