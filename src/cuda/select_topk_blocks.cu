#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

cudaError_t launch_select_topk(const SelectTopkParams& params, cudaStream_t stream) {
  const int rows = params.heads * params.token_capacity;
  const dim3 grid((rows + kSelectWarps - 1) / kSelectWarps);
  // K <= 16 keeps half the registers per lane list; both lists cover every K in 1..32.
  if (params.top_k - params.init_blocks - params.local_blocks <= 16)
    select_topk_kernel<16><<<grid, kSelectWarps * 32, 0, stream>>>(params);
  else
    select_topk_kernel<32><<<grid, kSelectWarps * 32, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
