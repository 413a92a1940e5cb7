// Context-parallel merge: every rank's candidate keys for a row, merged into its selection with
// the contract's order (one warp per row, the same list merge as the decode kernel's last CTA).
#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

__global__ void __launch_bounds__(kSelectWarps * 32)
    merge_candidates_kernel(const __grid_constant__ MergeCandidatesParams p) {
  const int lane = threadIdx.x & 31;
  int h, t;
  if (!warp_row(p.rows, &h, &t)) return;
  const SelectionRow row = selection_row_of(p.rows, h, t);
  if (write_short_row(row, lane)) return;
  uint64_t best[32];
  const ListSet ranks{p.candidates + (int64_t{h} * p.rows.token_capacity + t) * row.fill,
                      p.rank_stride, p.num_ranks, row.fill};
  rank_lists(best, ranks, lane, 32);
  write_selection(row, merge_warp(best, row.fill, lane), lane);
}

} // namespace

cudaError_t launch_merge_candidates(const MergeCandidatesParams& params, cudaStream_t stream) {
  const int rows = params.rows.heads * params.rows.token_capacity;
  merge_candidates_kernel<<<(rows + kSelectWarps - 1) / kSelectWarps, kSelectWarps * 32, 0,
                            stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
