// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/decode_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

cudaError_t launch_decode_topk_fp8(const DecodeTopkParams& params, dim3 grid, cudaStream_t stream) {
  const cudaError_t e =
      cudaFuncSetAttribute(decode_topk_kernel<__nv_fp8_e4m3>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmemBytes);
  if (e != cudaSuccess) return e;
  decode_topk_kernel<__nv_fp8_e4m3><<<grid, kScoreThreads, kDecodeSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
