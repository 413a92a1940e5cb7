// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/score_blocks_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_score_blocks_sm90_fp8(const ScoreBlocksSm90Params& p, int grid, cudaStream_t s) {
  return launch_with_shared_memory(score_blocks_sm90_kernel<__nv_fp8_e4m3>, dim3(grid),
                                   kSm90ScoreThreads, Sm90ScoreTraits<__nv_fp8_e4m3>::kSmemBytes, s,
                                   p);
}
// Built for sm_90a (a kernel JIT-compiled from the portable PTX has an empty body: ptxVersion 80),
// with the launch allocation its register split assumes (score_blocks_sm90.cuh).
bool score_blocks_sm90_fp8_has_sm90a_code() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, score_blocks_sm90_kernel<__nv_fp8_e4m3>) ==
             cudaSuccess &&
         attributes.ptxVersion >= 90 && attributes.numRegs >= kSm90LaunchRegisters;
}
} // namespace m3sa::cuda
