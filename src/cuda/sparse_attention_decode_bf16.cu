// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/sparse_attention_decode.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_sparse_attention_decode_bf16(const SparseAttentionParams& p, int grid,
                                               cudaStream_t s) {
  return launch_with_shared_memory(sparse_attention_decode_kernel<false>, dim3(grid), kDecodeThreads,
                                   kDecodeSmemBytes<false>, s, p);
}
} // namespace m3sa::cuda
