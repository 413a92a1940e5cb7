// One kernel per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/sparse_attention_prefill_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_attend_block_members_sm90_fp8(const SparseAttentionPrefillSm90Params& p,
                                                 int grid, cudaStream_t s) {
  return launch_attend_block_members_sm90<true>(p, grid, s);
}
bool attend_block_members_sm90_fp8_has_sm90a_code() {
  return attend_block_members_sm90_has_sm90a_code<true>();
}
} // namespace m3sa::cuda
