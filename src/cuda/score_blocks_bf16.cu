// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/score_blocks.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_score_blocks_bf16(const ScoreBlocksParams& p, dim3 grid, cudaStream_t s) {
  return launch_with_shared_memory(score_blocks_kernel<__nv_bfloat16>, grid, kScoreThreads,
                                   kScoreSmemBytes, s, p);
}
} // namespace m3sa::cuda
