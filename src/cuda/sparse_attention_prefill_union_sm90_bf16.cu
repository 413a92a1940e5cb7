// One kernel per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/sparse_attention_prefill_union_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_attend_page_unions_sm90_bf16(const SparseAttentionPrefillSm90Params& p, int grid,
                                                cudaStream_t s) {
  return launch_attend_page_unions_sm90<false>(p, grid, s);
}
bool attend_page_unions_sm90_bf16_has_sm90a_code() {
  return attend_page_unions_sm90_has_sm90a_code<false>();
}
} // namespace m3sa::cuda
