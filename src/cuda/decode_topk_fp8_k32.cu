// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/decode_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_decode_topk_fp8_k32(const DecodeTopkParams& p, dim3 grid, cudaStream_t s) {
  return launch_with_shared_memory(decode_topk_kernel<__nv_fp8_e4m3, 32>, grid, kScoreThreads,
                                   kDecodeSmemBytes, s, p);
}
} // namespace m3sa::cuda
