#pragma once
// The launch every decode_topk_<dtype>_k<K>.cu instantiates once.
#include "cuda/kernels/decode_topk.cuh"

namespace m3sa::cuda {

template <typename StoredT, int MaxK>
cudaError_t launch_decode_topk_kernel(const DecodeTopkParams& params, dim3 grid,
                                      cudaStream_t stream) {
  constexpr auto kernel = decode_topk_kernel<StoredT, MaxK>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kScoreThreads, kDecodeSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
