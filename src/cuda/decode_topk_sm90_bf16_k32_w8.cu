// One instantiation per translation unit keeps CI's 2-core build short.
#include "cuda/kernels/decode_topk_sm90.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
cudaError_t launch_decode_topk_sm90_bf16_k32_w8(const DecodeTopkSm90Params& p, dim3 grid,
                                                cudaStream_t s) {
  return launch_decode_topk_sm90<__nv_bfloat16, 32, kDecodeSm90WideWarps>(p, grid, s);
}
bool decode_topk_sm90_bf16_k32_w8_has_sm90a_code() {
  return decode_topk_sm90_has_sm90a_code<__nv_bfloat16, 32, kDecodeSm90WideWarps>();
}
} // namespace m3sa::cuda
