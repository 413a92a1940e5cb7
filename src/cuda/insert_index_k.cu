// insert_index_k: 16 threads per row, 8 values each (16-byte bf16 loads), one rounding from fp32
// to the cache dtype (contract §3).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda/kernels/common.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

constexpr int kInsertThreads = 256;
constexpr int kRowsPerCta = kInsertThreads / 16;

__global__ void __launch_bounds__(kInsertThreads)
    insert_index_k_kernel(const __grid_constant__ InsertIndexKParams p) {
  const int t = blockIdx.x * kRowsPerCta + threadIdx.x / 16;
  const int part = threadIdx.x % 16; // values [8 * part, 8 * part + 8)
  if (t >= p.num_tokens) return;
  const int64_t slot = p.slot_mapping[t * p.slot_stride];
  if (slot < 0) return;
  if (slot >= static_cast<int64_t>(p.num_pages) * 128) {
    if (part == 0) atomicOr(p.error_flags, kSlotOutOfRange);
    return;
  }
  float v[8];
  if (p.k_is_f32) {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.index_k) +
                                                        t * p.k_stride_token) +
                        2 * part;
    const float4 a = src[0], b = src[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    widen_bf16x8(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.index_k) +
                                                t * p.k_stride_token)[part],
                 v);
  }
  const int64_t row = (slot / 128) * p.cache_stride_page + (slot % 128) * p.cache_stride_token;
  if (p.cache_is_fp8)
    reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.index_k_cache) + row)[part] =
        round_to_e4m3x8(v);
  else
    reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.index_k_cache) + row)[part] =
        round_to_bf16x8(v);
}

} // namespace

cudaError_t launch_insert_index_k(const InsertIndexKParams& params, int token_capacity,
                                  cudaStream_t stream) {
  const int grid = (token_capacity + kRowsPerCta - 1) / kRowsPerCta;
  insert_index_k_kernel<<<grid, kInsertThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
