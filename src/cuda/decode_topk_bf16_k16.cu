// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/decode_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

cudaError_t launch_decode_topk_bf16_k16(const DecodeTopkParams& params, dim3 grid,
                                        cudaStream_t stream) {
  constexpr auto kernel = decode_topk_kernel<__nv_bfloat16, 16>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kScoreThreads, kDecodeSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
