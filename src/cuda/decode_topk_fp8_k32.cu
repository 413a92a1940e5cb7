// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/decode_topk_launch.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_decode_topk_fp8_k32(const DecodeTopkParams& p, dim3 grid, cudaStream_t s) {
  return launch_decode_topk_kernel<__nv_fp8_e4m3, 32>(p, grid, s);
}
} // namespace m3sa::cuda
