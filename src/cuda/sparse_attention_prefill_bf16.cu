// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/sparse_attention_prefill.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_attend_block_members_bf16(const SparseAttentionParams& p, int grid,
                                           cudaStream_t s) {
  return launch_with_shared_memory(attend_block_members_kernel<false>, dim3(grid), kPrefillThreads,
                                   kPrefillSmemBytes<false>, s, p);
}
} // namespace m3sa::cuda
