// norm_rope_insert: one CTA per token, 16 threads per 128-element row (8 values, one 16-byte
// load each), 16 rows at a time. The arithmetic is common/norm_rope_math.h, the CPU backend's:
// the sum of squares reduces over the 16 lanes in the butterfly order the CPU code replays, and
// NeoX pairs (i, i + 32) meet by one shuffle between lanes 4 apart.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/norm_rope_math.h"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

namespace nr = detail::norm_rope;

constexpr int kThreads = 256;
constexpr int kRowsPerPass = kThreads / nr::kParts;
constexpr int kPassesInFlight = 4;
constexpr unsigned kFullMask = 0xffffffffu;

enum RowKind : int { kQ, kIndexQ, kK, kV, kIndexK };

// Where one row comes from and goes to; `dst` null: computed but not stored (skipped slot).
struct RowJob {
  const __nv_bfloat16* src;
  void* dst;
  int gain; // norm_weights index, -1: no norm / RoPE (v)
  bool fp8;
  float scale;
};

__device__ RowJob row_job(const NormRopeInsertParams& p, int t, int row, int64_t slot,
                          int64_t index_slot) {
  const auto bf16_at = [](const void* base, int64_t offset) {
    return static_cast<const __nv_bfloat16*>(base) + offset;
  };
  RowJob job{};
  job.scale = 1.f;
  if (row < p.q_heads) {
    job.src = bf16_at(p.q, t * p.q_stride_token + row * p.q_stride_head);
    job.dst =
        static_cast<__nv_bfloat16*>(p.q_out) + t * p.q_out_stride_token + row * p.q_out_stride_head;
    job.gain = 0;
    return job;
  }
  row -= p.q_heads;
  if (row < p.index_heads) {
    job.src = bf16_at(p.index_q, t * p.index_q_stride_token + row * p.index_q_stride_head);
    const int64_t at = t * p.index_q_out_stride_token + row * p.index_q_out_stride_head;
    job.fp8 = p.index_is_fp8;
    job.dst = job.fp8 ? static_cast<void*>(static_cast<uint8_t*>(p.index_q_out) + at)
                      : static_cast<void*>(static_cast<__nv_bfloat16*>(p.index_q_out) + at);
    job.gain = 2;
    return job;
  }
  row -= p.index_heads;
  if (row < 2 * p.kv_heads) {
    const bool is_v = row >= p.kv_heads;
    const int h = is_v ? row - p.kv_heads : row;
    job.src = is_v ? bf16_at(p.v, t * p.v_stride_token + h * p.v_stride_head)
                   : bf16_at(p.k, t * p.k_stride_token + h * p.k_stride_head);
    job.gain = is_v ? -1 : 1;
    job.fp8 = p.kv_is_fp8;
    job.scale = is_v ? p.v_scale : p.k_scale;
    if (slot >= 0) {
      const int64_t at =
          is_v ? (slot / 128) * p.v_cache_stride_page + (slot % 128) * p.v_cache_stride_token +
                     h * p.v_cache_stride_head
               : (slot / 128) * p.k_cache_stride_page + (slot % 128) * p.k_cache_stride_token +
                     h * p.k_cache_stride_head;
      void* base = is_v ? p.v_cache : p.k_cache;
      job.dst = job.fp8 ? static_cast<void*>(static_cast<uint8_t*>(base) + at)
                        : static_cast<void*>(static_cast<__nv_bfloat16*>(base) + at);
    }
    return job;
  }
  job.src = bf16_at(p.index_k, t * p.index_k_stride_token);
  job.gain = 3;
  job.fp8 = p.index_is_fp8;
  if (index_slot >= 0) {
    const int64_t at = (index_slot / 128) * p.index_cache_stride_page +
                       (index_slot % 128) * p.index_cache_stride_token;
    job.dst = job.fp8 ? static_cast<void*>(static_cast<uint8_t*>(p.index_k_cache) + at)
                      : static_cast<void*>(static_cast<__nv_bfloat16*>(p.index_k_cache) + at);
  }
  return job;
}

// Lane `part`'s 8 values of a row, divided by the row's scale and rounded once.
__device__ void store_row_part(const RowJob& job, int part, const float (&x)[nr::kPartElems]) {
  if (job.fp8) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t two = __nv_cvt_float2_to_fp8x2(
          make_float2(nr::divide(x[2 * i], job.scale), nr::divide(x[2 * i + 1], job.scale)),
          __NV_SATFINITE, __NV_E4M3);
      if (i < 2)
        lo |= two << (16 * i);
      else
        hi |= two << (16 * (i - 2));
    }
    reinterpret_cast<uint2*>(job.dst)[part] = make_uint2(lo, hi);
  } else {
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(nr::divide(x[2 * i], job.scale),
                                                     nr::divide(x[2 * i + 1], job.scale));
      out[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
    reinterpret_cast<uint4*>(job.dst)[part] = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

__device__ float load_scalar(const void* base, int64_t i, bool is_f32) {
  return is_f32 ? static_cast<const float*>(base)[i]
                : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__global__ void __launch_bounds__(kThreads)
    norm_rope_insert_kernel(const __grid_constant__ NormRopeInsertParams p) {
  const int t = blockIdx.x;
  if (t >= p.num_tokens) return;
  __shared__ float cos_s[nr::kRotaryPairs], sin_s[nr::kRotaryPairs];
  __shared__ float gains[4][128];

  const int part = threadIdx.x % nr::kParts;
  const int rows = p.q_heads + p.index_heads + 2 * p.kv_heads + 1;
  const int64_t position = p.positions[t * p.positions_stride];
  int64_t slot = p.slot_mapping[t * p.slot_stride];
  int64_t index_slot = p.index_slot_mapping[t * p.index_slot_stride];
  // Rows are taken kPassesInFlight passes at a time: all their loads are issued first (the first
  // group's before the cos/sin and gain prologue), so each thread keeps several 16-byte loads in
  // flight. Both halves of a warp run every pass (their shuffles need all 32 lanes); rows past the
  // end compute on zeros and store nothing.
  for (int base = 0; base < rows; base += kRowsPerPass * kPassesInFlight) {
    uint4 raw[kPassesInFlight];
#pragma unroll
    for (int u = 0; u < kPassesInFlight; ++u) {
      const int row = base + u * kRowsPerPass + threadIdx.x / nr::kParts;
      raw[u] = row < rows ? reinterpret_cast<const uint4*>(row_job(p, t, row, -1, -1).src)[part]
                          : make_uint4(0, 0, 0, 0);
    }
    if (base == 0) {
      const int64_t max_position =
          p.cos_sin_cache ? min(p.cos_sin_rows, int64_t{1} << 24) : int64_t{1} << 24;
      if (position < 0 || position >= max_position) { // uniform: nothing of this token is written
        if (threadIdx.x == 0) atomicOr(p.error_flags, kPositionOutOfRange);
        return;
      }
      if (slot >= p.kv_pages * 128 || index_slot >= p.index_pages * 128) {
        if (threadIdx.x == 0) atomicOr(p.error_flags, kSlotOutOfRange);
        if (slot >= p.kv_pages * 128) slot = -1;
        if (index_slot >= p.index_pages * 128) index_slot = -1;
      }
      if (threadIdx.x < nr::kRotaryPairs) {
        const int i = threadIdx.x;
        if (p.cos_sin_cache) {
          cos_s[i] =
              load_scalar(p.cos_sin_cache, position * p.cos_sin_stride + i, p.cos_sin_is_f32);
          sin_s[i] =
              load_scalar(p.cos_sin_cache, position * p.cos_sin_stride + i + nr::kRotaryPairs,
                          p.cos_sin_is_f32);
        } else {
          nr::rope_cos_sin(position, p.inv_freq[i], &cos_s[i], &sin_s[i]);
        }
      }
      for (int i = threadIdx.x; i < 4 * 128; i += kThreads)
        gains[i / 128][i % 128] =
            nr::add(p.weight_offset,
                    load_scalar(p.norm_weights[i / 128], i % 128, p.norm_weight_is_f32[i / 128]));
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kPassesInFlight; ++u) {
      const int row = base + u * kRowsPerPass + threadIdx.x / nr::kParts;
      const bool active = row < rows;
      const RowJob job = active ? row_job(p, t, row, slot, index_slot) : RowJob{};
      float x[nr::kPartElems];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(pairs[i]);
        x[2 * i] = f.x, x[2 * i + 1] = f.y;
      }
      float sum = nr::part_sum_of_squares(x);
#pragma unroll
      for (int partner = nr::kParts / 2; partner > 0; partner /= 2)
        sum = nr::add(sum, __shfl_xor_sync(kFullMask, sum, partner));
      const bool transform = active && job.gain >= 0;
      const float inv_rms = nr::inverse_rms(sum, p.eps);
      float y[nr::kPartElems];
#pragma unroll
      for (int e = 0; e < nr::kPartElems; ++e)
        y[e] = transform ? nr::normalize(x[e], inv_rms, gains[job.gain][part * nr::kPartElems + e])
                         : x[e];
#pragma unroll
      for (int e = 0; e < nr::kPartElems; ++e) {
        const float other = __shfl_xor_sync(kFullMask, y[e], 4); // the pair's other half
        const int i = (part % 4) * nr::kPartElems + e;
        if (transform && part < 4)
          x[e] = nr::rotate_first(y[e], other, cos_s[i], sin_s[i]);
        else if (transform && part < 8)
          x[e] = nr::rotate_second(other, y[e], cos_s[i], sin_s[i]);
        else
          x[e] = y[e];
      }
      if (active && job.dst != nullptr) store_row_part(job, part, x);
    }
  }
}

} // namespace

cudaError_t launch_norm_rope_insert(const NormRopeInsertParams& params, int token_capacity,
                                    cudaStream_t stream) {
  norm_rope_insert_kernel<<<token_capacity, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
