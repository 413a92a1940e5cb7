// norm_rope_insert: four lanes per 128-element row, tiles of a few tokens, as many CTAs as are
// resident, each looping over tiles. The arithmetic is common/norm_rope_math.h, the CPU backend's,
// in the same order.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "common/norm_rope_math.h"
#include "cuda/kernels/common.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

namespace nr = detail::norm_rope;

// 256 threads held to 64 registers (8 bytes spill) so four CTAs share an SM, with tiles of two
// tokens: of the variants measured (tiles of 2/4/8 tokens, 2 or 4 CTAs per SM, bench/NOTES.md),
// the fastest; all persistent ones were within 3% of it.
constexpr int kThreads = 256;
constexpr int kMinCtasPerSm = 4;
constexpr int kTileTokens = 2;
constexpr int kRowsPerPass = kThreads / nr::kQuarters;
constexpr unsigned kFullMask = 0xffffffffu;

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

// Chunk c (8 dims, one 16-byte load of a bf16 row) of quarter q's 32 elements.
__device__ __forceinline__ int quarter_chunk(int q, int c) {
  return nr::quarter_dim(q, nr::kChunkElems * c) / nr::kChunkElems;
}

// Quarter q's 32 values of a row, divided by the row's scale and rounded once. The kernel is
// bound by instruction issue as much as by memory: an IEEE division is a dozen instructions, so
// it runs only where the scale is not 1 (dividing by 1 is exact: skipping it changes no bit).
__device__ void store_quarter(const RowJob& job, int q, float (&x)[nr::kQuarterElems]) {
  if (job.scale != 1.f)
#pragma unroll
    for (int k = 0; k < nr::kQuarterElems; ++k) x[k] = nr::divide(x[k], job.scale);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float* v = x + nr::kChunkElems * c;
    if (job.fp8)
      reinterpret_cast<uint2*>(job.dst)[quarter_chunk(q, c)] = round_to_e4m3x8(v);
    else
      reinterpret_cast<uint4*>(job.dst)[quarter_chunk(q, c)] = round_to_bf16x8(v);
  }
}

__device__ float load_scalar(const void* base, int64_t i, bool is_f32) {
  return is_f32 ? static_cast<const float*>(base)[i]
                : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// Per-token values of one tile, written by the tile's prologue; double-buffered so the next
// tile's prologue can run while slower warps still read this tile's.
struct TileTokens {
  float cos[kTileTokens][nr::kRotaryPairs], sin[kTileTokens][nr::kRotaryPairs];
  int64_t slot[kTileTokens], index_slot[kTileTokens];
  bool position_ok[kTileTokens];
};

// Positions, slots and cos/sin of tile `tile`'s tokens; threads [0, 32 x kTileTokens) take part.
__device__ void load_tile_tokens(const NormRopeInsertParams& p, int tile, TileTokens& out) {
  const int tok = threadIdx.x / nr::kRotaryPairs, i = threadIdx.x % nr::kRotaryPairs;
  const int t = tile * kTileTokens + tok;
  if (tok >= kTileTokens || t >= p.num_tokens) return;
  const int64_t position = p.positions[t * p.positions_stride];
  const int64_t max_position =
      p.cos_sin_cache ? min(p.cos_sin_rows, int64_t{1} << 24) : int64_t{1} << 24;
  const bool ok = position >= 0 && position < max_position;
  if (i == 0) {
    int64_t slot = p.slot_mapping[t * p.slot_stride];
    int64_t index_slot = p.index_slot_mapping[t * p.index_slot_stride];
    if (!ok) atomicOr(p.error_flags, kPositionOutOfRange);
    if (slot >= p.kv_pages * 128 || index_slot >= p.index_pages * 128) {
      atomicOr(p.error_flags, kSlotOutOfRange);
      if (slot >= p.kv_pages * 128) slot = -1;
      if (index_slot >= p.index_pages * 128) index_slot = -1;
    }
    out.position_ok[tok] = ok, out.slot[tok] = slot, out.index_slot[tok] = index_slot;
  }
  if (ok && p.cos_sin_cache) {
    out.cos[tok][i] =
        load_scalar(p.cos_sin_cache, position * p.cos_sin_stride + i, p.cos_sin_is_f32);
    out.sin[tok][i] = load_scalar(
        p.cos_sin_cache, position * p.cos_sin_stride + i + nr::kRotaryPairs, p.cos_sin_is_f32);
  } else if (ok) {
    nr::rope_cos_sin(position, p.inv_freq[i], &out.cos[tok][i], &out.sin[tok][i]);
  }
}

// Each CTA loops over tiles of kTileTokens tokens (tile, tile + gridDim.x, ...); a tile's
// rows (q heads, index-q heads, k heads, v heads, index k, per token) are spread over 64 groups of
// 4 lanes in passes, one quarter row per lane. The next pass's row (possibly the next tile's) is
// loaded during the current pass's math: four 16-byte loads in flight per lane. Lane q holds both
// halves of 8 RoPE pairs, so the rotation needs no shuffle; the sum of squares needs two.
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    norm_rope_insert_kernel(const __grid_constant__ NormRopeInsertParams p) {
  __shared__ TileTokens tile_tokens[2];
  __shared__ float gains[4][128];
  const int tiles = (p.num_tokens + kTileTokens - 1) / kTileTokens;
  int tile = blockIdx.x;
  if (tile >= tiles) return;
  const int rows_per_token = p.q_heads + p.index_heads + 2 * p.kv_heads + 1;
  const auto tile_rows = [&](int t) {
    return min(kTileTokens, p.num_tokens - t * kTileTokens) * rows_per_token;
  };
  const int q = threadIdx.x % nr::kQuarters, group = threadIdx.x / nr::kQuarters;
  const auto load_quarter = [&](int t, int row, uint4(&raw)[4]) {
    const bool active = t < tiles && row < tile_rows(t);
    const uint4* src =
        active ? reinterpret_cast<const uint4*>(row_job(p, t * kTileTokens + row / rows_per_token,
                                                        row % rows_per_token, -1, -1)
                                                    .src)
               : nullptr;
#pragma unroll
    for (int c = 0; c < 4; ++c) raw[c] = active ? src[quarter_chunk(q, c)] : make_uint4(0, 0, 0, 0);
  };
  uint4 raw[4];
  load_quarter(tile, group, raw); // in flight during the prologue

  load_tile_tokens(p, tile, tile_tokens[0]);
  for (int i = threadIdx.x; i < 4 * 128; i += kThreads)
    gains[i / 128][i % 128] = nr::add(p.weight_offset, load_scalar(p.norm_weights[i / 128], i % 128,
                                                                   p.norm_weight_is_f32[i / 128]));
  __syncthreads();

  for (int parity = 0; tile < tiles; tile += gridDim.x, parity ^= 1) {
    const TileTokens& tt = tile_tokens[parity];
    const int rows = tile_rows(tile);
    const int first_token = tile * kTileTokens;
    // Every lane runs every pass (the shuffles need all 32); rows past the end compute on zeros.
    for (int base = 0; base < rows; base += kRowsPerPass) {
      const int row = base + group;
      const bool active = row < rows;
      const int tok = active ? row / rows_per_token : 0;
      float x[nr::kQuarterElems];
#pragma unroll
      for (int c = 0; c < 4; ++c) widen_bf16x8(raw[c], x + nr::kChunkElems * c);
      if (base + kRowsPerPass < rows) // the next pass's row: this tile's, or the next tile's
        load_quarter(tile, row + kRowsPerPass, raw);
      else
        load_quarter(tile + gridDim.x, group, raw);
      const RowJob job = active && tt.position_ok[tok]
                             ? row_job(p, first_token + tok, row % rows_per_token, tt.slot[tok],
                                       tt.index_slot[tok])
                             : RowJob{};
      float sum = nr::quarter_sum_of_squares(x);
      sum = nr::add(sum, __shfl_xor_sync(kFullMask, sum, 1));
      sum = nr::add(sum, __shfl_xor_sync(kFullMask, sum, 2));
      if (job.dst == nullptr) continue; // inactive, bad position, or a skipped slot
      if (job.gain >= 0) {
        const float inv_rms = nr::inverse_rms(sum, p.eps);
#pragma unroll
        for (int k = 0; k < nr::kQuarterElems; ++k)
          x[k] = nr::normalize(x[k], inv_rms, gains[job.gain][nr::quarter_dim(q, k)]);
#pragma unroll
        for (int e = 0; e < nr::kChunkElems; ++e) {
          const int i = nr::kChunkElems * q + e;
          const float x1 = x[e], x2 = x[nr::kChunkElems + e], c = tt.cos[tok][i],
                      s = tt.sin[tok][i];
          x[e] = nr::rotate_first(x1, x2, c, s);
          x[nr::kChunkElems + e] = nr::rotate_second(x1, x2, c, s);
        }
      }
      store_quarter(job, q, x);
    }
    // The next tile's tokens into the other buffer; the barrier also retires this tile's buffer
    // for the tile after next.
    if (tile + gridDim.x < tiles) load_tile_tokens(p, tile + gridDim.x, tile_tokens[parity ^ 1]);
    __syncthreads();
  }
}

} // namespace

cudaError_t launch_norm_rope_insert(const NormRopeInsertParams& params, int token_capacity,
                                    int sm_count, cudaStream_t stream) {
  // As many CTAs as the launch bounds make resident (no partial last wave; 3 KB of shared memory
  // and 4 x 256 threads fit every SM80+ part), never more than there are tiles.
  const int tiles = (token_capacity + kTileTokens - 1) / kTileTokens;
  const int grid = std::max(1, std::min(tiles, kMinCtasPerSm * sm_count));
  norm_rope_insert_kernel<<<grid, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
