// insert_index_k: 16 threads per row, 8 values each (16-byte bf16 loads), one rounding from fp32
// to the cache dtype (contract §3). Also the row-tile schedule of the scoring kernel.
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

// Row tiles of the scoring kernel, in request order: one thread walks the requests (a few hundred
// at most), so the whole schedule costs one tiny launch and no host round trip.
__global__ void schedule_tiles_kernel(const __grid_constant__ ScheduleParams p) {
  if (threadIdx.x != 0) return;
  int count = 0;
  for (int r = p.first_request; r < p.num_requests; ++r) {
    const int begin = p.cu_q_lens[r], end = p.cu_q_lens[r + 1];
    // Padding requests get tiles too: exported scores of their rows are all -inf.
    for (int t = begin; t < end && count < p.tile_capacity; t += p.tile_tokens)
      p.tiles[count++] = RowTile{r, t, min(p.tile_tokens, end - t), 0};
  }
  *p.num_tiles = count;
}

} // namespace

cudaError_t launch_insert_index_k(const InsertIndexKParams& params, int token_capacity,
                                  cudaStream_t stream) {
  const int grid = (token_capacity + kRowsPerCta - 1) / kRowsPerCta;
  insert_index_k_kernel<<<grid, kInsertThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream) {
  schedule_tiles_kernel<<<1, 32, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
