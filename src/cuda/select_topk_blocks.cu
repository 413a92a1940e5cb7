#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

template <int MaxK>
cudaError_t launch_for_width(const SelectTopkParams& params, cudaStream_t stream,
                             LaunchOptions options) {
  const int rows = params.rows.heads * params.rows.token_capacity;
  // Few, wide rows (long-context decode): a CTA per row.
  if (params.score_width >= 2048 && rows <= 2048)
    return launch_with_shared_memory(select_topk_wide_kernel<MaxK>, dim3(rows), kSelectWarps * 32,
                                     0, stream, params, options);
  // Otherwise 8 lanes a row, and, where rows may have more candidates than a group takes (the
  // width is the plan's capacity, the rows' lengths are on the device), a warp per such row next.
  constexpr int kRowsPerCta = kSelectWarps * kGroupsPerWarp;
  cudaError_t e = launch_with_shared_memory(select_topk_groups_kernel<MaxK>,
                                            dim3((rows + kRowsPerCta - 1) / kRowsPerCta),
                                            kSelectWarps * 32, 0, stream, params, options);
  if (e != cudaSuccess || params.score_width <= kGroupMaxCandidates) return e;
  SelectTopkParams long_rows = params;
  long_rows.group_candidates = kGroupMaxCandidates;
  return launch_with_shared_memory(select_topk_kernel<MaxK>,
                                   dim3((rows + kSelectWarps - 1) / kSelectWarps),
                                   kSelectWarps * 32, 0, stream, long_rows, options);
}

} // namespace

cudaError_t launch_select_topk(const SelectTopkParams& params, cudaStream_t stream,
                               bool overlap_prior) {
  LaunchOptions options;
  options.overlap_prior = overlap_prior;
  // K <= 16 keeps half the registers per lane list; both lists cover every K in 1..32.
  if (params.rows.top_k - params.rows.init_blocks - params.rows.local_blocks <= 16)
    return launch_for_width<16>(params, stream, options);
  return launch_for_width<32>(params, stream, options);
}

} // namespace m3sa::cuda
