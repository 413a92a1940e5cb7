#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

template <int MaxK> void launch_for_width(const SelectTopkParams& params, cudaStream_t stream) {
  const int rows = params.rows.heads * params.rows.token_capacity;
  // Few, wide rows (long-context decode): a CTA per row; otherwise a warp per row.
  if (params.score_width >= 2048 && rows <= 2048)
    select_topk_wide_kernel<MaxK><<<rows, kSelectWarps * 32, 0, stream>>>(params);
  else
    select_topk_kernel<MaxK>
        <<<(rows + kSelectWarps - 1) / kSelectWarps, kSelectWarps * 32, 0, stream>>>(params);
}

} // namespace

cudaError_t launch_select_topk(const SelectTopkParams& params, cudaStream_t stream) {
  // K <= 16 keeps half the registers per lane list; both lists cover every K in 1..32.
  if (params.rows.top_k - params.rows.init_blocks - params.rows.local_blocks <= 16)
    launch_for_width<16>(params, stream);
  else
    launch_for_width<32>(params, stream);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
