// One translation unit for the two cluster instantiations (decode_topk_sm90.cuh): e4m3 caches, 16
// ranked slots at most, 4 and 8 warps - the launches the plan makes in clusters.
#include "cuda/kernels/decode_topk_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_decode_topk_sm90_fp8_k16_cluster(const DecodeTopkSm90Params& p, dim3 grid,
                                                    cudaStream_t s) {
  return launch_decode_topk_sm90<__nv_fp8_e4m3, 16, kDecodeSm90NarrowWarps, true>(p, grid, s);
}
cudaError_t launch_decode_topk_sm90_fp8_k16_w8_cluster(const DecodeTopkSm90Params& p, dim3 grid,
                                                       cudaStream_t s) {
  return launch_decode_topk_sm90<__nv_fp8_e4m3, 16, kDecodeSm90WideWarps, true>(p, grid, s);
}
int decode_topk_sm90_fp8_k16_cluster_active_clusters(int cluster) {
  return decode_topk_sm90_active_clusters<__nv_fp8_e4m3, 16, kDecodeSm90NarrowWarps>(cluster);
}
int decode_topk_sm90_fp8_k16_w8_cluster_active_clusters(int cluster) {
  return decode_topk_sm90_active_clusters<__nv_fp8_e4m3, 16, kDecodeSm90WideWarps>(cluster);
}
} // namespace m3sa::cuda
