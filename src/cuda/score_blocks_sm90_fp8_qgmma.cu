// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/score_blocks_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_score_blocks_sm90_fp8_qgmma(const ScoreBlocksSm90Params& p, int grid,
                                               cudaStream_t s) {
  return launch_score_blocks_sm90<__nv_fp8_e4m3, true>(p, grid, s);
}
bool score_blocks_sm90_fp8_qgmma_has_sm90a_code() {
  return score_blocks_sm90_has_sm90a_code<__nv_fp8_e4m3, true>();
}
} // namespace m3sa::cuda
