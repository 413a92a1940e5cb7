// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/sparse_attention_decode.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_sparse_attention_decode_fp8(const SparseAttentionParams& p, int grid,
                                               int cluster, bool overlap_prior, cudaStream_t s) {
  return launch_decode_kernel<true>(p, grid, cluster, overlap_prior, s);
}
int sparse_attention_decode_fp8_active_clusters(int cluster) {
  return decode_kernel_active_clusters<true>(cluster);
}
} // namespace m3sa::cuda
