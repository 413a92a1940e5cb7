#include <algorithm>

#include "cuda/kernels/certify_selection.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

cudaError_t launch_key_norms(const KeyNormParams& params, int request_capacity,
                             cudaStream_t stream) {
  // About 2,048 CTAs in all, at most one a block (a 1M-token request alone: 1,024 CTAs of 8
  // blocks each).
  const int requests = std::max(1, request_capacity - params.first_request);
  const int per_request = std::clamp(2048 / requests, 1, 1024);
  const dim3 grid(
      static_cast<unsigned>(std::clamp(params.scoring.block_table_width, 1, per_request)),
      static_cast<unsigned>(requests));
  LaunchOptions options;
  options.overlap_prior = true;
  return launch_with_shared_memory(key_norms_kernel, grid, 128, 0, stream, params, options);
}

cudaError_t launch_certify_selection(const CertifySelectionParams& params, cudaStream_t stream) {
  const int64_t rows = int64_t{params.select.rows.heads} * params.select.rows.token_capacity;
  const dim3 grid(static_cast<unsigned>((rows + kSelectWarps - 1) / kSelectWarps));
  LaunchOptions options;
  options.overlap_prior = true;
  return launch_with_shared_memory(certify_selection_kernel, grid, kSelectWarps * 32, 0, stream,
                                   params, options);
}

} // namespace m3sa::cuda
