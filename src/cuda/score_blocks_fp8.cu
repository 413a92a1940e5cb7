// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/score_blocks.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

cudaError_t launch_score_blocks_fp8(const ScoreBlocksParams& params, dim3 grid,
                                    cudaStream_t stream) {
  const cudaError_t e =
      cudaFuncSetAttribute(score_blocks_kernel<__nv_fp8_e4m3>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kScoreSmemBytes);
  if (e != cudaSuccess) return e;
  score_blocks_kernel<__nv_fp8_e4m3><<<grid, kScoreThreads, kScoreSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
