#pragma once
// Exact selections from inexact scores: cuda.index_topk.sm90's prefill rows on e4m3 caches are
// scored by e4m3 wgmma (QGMMA, score_blocks_sm90_kernel<e4m3, true>), whose sums are not fp32
// sums (about 1 % of random-data rows select differently, bench/NOTES.md s17 r2), then selected
// by select_topk as usual; these kernels make every row's selection the one the exact scores give
// (contract §5 order: score descending, NaN last, lower id first).
//
// Contract: the approximate block score a_b of a row differs from the exact s_b by at most
// E_b = error_scale * sum over the k32 steps j of |q_{<=j}| * key_norm_b[j], where q_{<=j} is the
// query's dims up to step j's end and key_norm_b[j] the largest L2 norm of those dims over block
// b's visible keys (key_norms_kernel), error_scale = kQgmmaStepError * |scale| (indexer_traits.h
// gives the error model behind it, measured on the H200). With S the row's selected candidates,
// lb = a - E and ub = a + E:
//   - a candidate j outside S with ub_j < min over S of lb is beaten by every block of S: out;
//   - a block i of S with lb_i > U = max over the candidates outside S of ub beats each of them:
//     in (only blocks of S can beat it, and there are fill - 1 of those).
// So when U < min_S lb the selection is exact and the row is left as it is. Otherwise, with A_in
// the blocks of S with lb <= U (in doubt) and A_out the candidates outside S with ub >= min_S lb,
// A_out is rescored exactly (fp32 sums of the exact e4m3 products: as exact as the widened bf16
// wgmma path, within the comparison's near-tie bound of the double reference); a block of A_in
// whose lb is above every exact score of A_out keeps its slot (only |A_in| - 1 others compete for
// A_in's slots); the rest of A_in is rescored, and the best of those and A_out take their slots.
// NaN scores and blocks with a NaN key get an infinite bound: rescored. A row whose rescoring meets
// an invalid page is left as it is (the scorer flagged the page and did not read it).
//
// Mapping: key_norms_kernel: a CTA of 128 threads per (block range, request), a thread per key,
// blocks strided over gridDim.x. certify_selection_kernel: a warp per row, rows numbered as
// select_topk_kernel's (kSelectWarps a CTA); the warp reads the row's scores and bounds in chunks
// of 32 candidates; a rescore is the warp's, 8 lanes a key (exact_block_score).
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "cuda/indexer_params.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/indexer_traits.h"
#include "cuda/kernels/select_topk.cuh"

namespace m3sa::cuda {

// Rounding of the fp32 norms (128 squares summed): a factor that keeps them upper bounds.
inline constexpr float kNormRoundingMargin = 1.0f + 0x1p-16f;
static_assert(kQgmmaSteps == 4, "a block's prefix norms are one float4");

// Four e4m3 values (one 32-bit word, element order kept) as floats: exact (e4m3 -> half -> float).
__device__ __forceinline__ void e4m3x4_to_float(uint32_t word, float (&f)[4]) {
  const float2 lo = __half22float2(
      __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word), __NV_E4M3)));
  const float2 hi = __half22float2(__half2(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3)));
  f[0] = lo.x, f[1] = lo.y, f[2] = hi.x, f[3] = hi.y;
}

// Sixteen e4m3 values (16 bytes, element order kept) as floats.
__device__ __forceinline__ void e4m3x16_to_float(uint4 v, float (&f)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float four[4];
    e4m3x4_to_float(words[w], four);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[4 * w + i] = four[i];
  }
}

__global__ void __launch_bounds__(128) key_norms_kernel(const __grid_constant__ KeyNormParams p) {
  __shared__ float4 warp_max[4];
  wait_for_prior_grids(); // the cache may be the previous kernel's output
  allow_next_grid();
  const ScoreBlocksParams& s = p.scoring;
  const int r = p.first_request + static_cast<int>(blockIdx.y);
  if (r >= p.num_requests) return;
  const int seq_len = s.seq_lens[r];
  const int blocks =
      min(seq_len <= 0 ? 0 : (seq_len - 1) / 128 + 1, min(s.block_table_width, p.key_norm_stride));
  const int key = threadIdx.x, warp = threadIdx.x / 32;
  for (int b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int page = s.block_table[r * s.block_table_stride + b];
    // The squared norms of the key's dims up to the end of each k32 step (0 past the visible keys).
    float prefix[kQgmmaSteps] = {};
    bool unbounded = page < 0 || page >= s.num_pages; // an invalid page, or (below) a NaN key
    if (!unbounded && b * 128 + key < seq_len) {
      const uint4* k =
          reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(s.index_k_cache) +
                                         page * s.cache_stride_page + key * s.cache_stride_token);
      uint4 raw[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) raw[c] = __ldg(k + c);
      float norm2 = 0.f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        float f[16];
        e4m3x16_to_float(raw[c], f);
#pragma unroll
        for (int i = 0; i < 16; ++i) norm2 = fmaf(f[i], f[i], norm2);
        if (c % 2 == 1) prefix[c / 2] = norm2;
      }
      unbounded = !(norm2 <= FLT_MAX); // a NaN key: its block is always rescored
    }
    if (unbounded)
#pragma unroll
      for (int j = 0; j < kQgmmaSteps; ++j) prefix[j] = INFINITY;
    // Non-negative floats (and +inf) order as their bits.
    float most[kQgmmaSteps];
#pragma unroll
    for (int j = 0; j < kQgmmaSteps; ++j)
      most[j] = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(prefix[j])));
    if (key % 32 == 0) warp_max[warp] = make_float4(most[0], most[1], most[2], most[3]);
    __syncthreads();
    if (key == 0) {
      const auto largest = [&](float float4::*c) {
        const float m =
            fmaxf(fmaxf(warp_max[0].*c, warp_max[1].*c), fmaxf(warp_max[2].*c, warp_max[3].*c));
        return sqrtf(m) * kNormRoundingMargin;
      };
      p.key_norms[r * int64_t{p.key_norm_stride} + b] = make_float4(
          largest(&float4::x), largest(&float4::y), largest(&float4::z), largest(&float4::w));
    }
    __syncthreads();
  }
}

__device__ __forceinline__ uint64_t warp_min_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block b's exact score (scale x the largest q . k over its keys at positions <= position); false
// (uniform) for an invalid page. Lane 8 g + part reads 16 dims [16 part, 16 part + 16) of keys
// g, g + 4, ... (a key's 128 bytes by 8 lanes: 4 lines a load instruction) and holds the query's
// same 16 dims in `q`; the 8 partial sums of a key are added across its lanes.
__device__ __forceinline__ bool exact_block_score(const CertifySelectionParams& p, int request,
                                                  int position, int b, const float (&q)[16],
                                                  int lane, float* score) {
  const ScoreBlocksParams& s = p.scoring;
  const int page = s.block_table[request * s.block_table_stride + b];
  if (page < 0 || page >= s.num_pages) return false;
  const int visible = position - b * 128; // keys 0..visible (>= 0 for a causal block)
  const int group = lane / 8, part = lane % 8;
  const uint8_t* keys =
      static_cast<const uint8_t*>(s.index_k_cache) + page * s.cache_stride_page + 16 * part;
  float m = -INFINITY;
  // 32 keys a pass, their 8 loads issued together (one at a time, a rescore waited 32 load
  // latencies: s17 r4).
  for (int first = 0; first <= visible && first < 128; first += 32) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int key = first + 4 * u + group;
      v[u] = key <= visible
                 ? __ldg(reinterpret_cast<const uint4*>(keys + key * s.cache_stride_token))
                 : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      float f[16], sum = 0.f;
      e4m3x16_to_float(v[u], f);
#pragma unroll
      for (int i = 0; i < 16; ++i) sum = fmaf(q[i], f[i], sum);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      if (first + 4 * u + group <= visible) m = nan_propagating_max(m, sum);
    }
  }
  m = nan_propagating_max(m, __shfl_xor_sync(0xffffffffu, m, 8));
  m = nan_propagating_max(m, __shfl_xor_sync(0xffffffffu, m, 16));
  *score = m * s.scale;
  return true;
}

__global__ void __launch_bounds__(kSelectWarps * 32)
    certify_selection_kernel(const __grid_constant__ CertifySelectionParams p) {
  wait_for_prior_grids(); // the selection (and, before it, the scores and norms)
  allow_next_grid();
  const SelectTopkParams& sp = p.select;
  const int lane = threadIdx.x & 31;
  int h, t;
  if (!warp_row(sp.rows, &h, &t)) return;
  if (t < sp.rows.cu_q_lens[sp.first_request]) return; // decode rows: the decode kernel's
  const SelectionRow row = selection_row_of(sp.rows, h, t);
  // Nothing ranked, or a row past the block table (flagged; its scores were not written).
  if (row.n > sp.score_width || row.n > p.scoring.block_table_width || row.n <= row.top_k ||
      row.fill <= 0)
    return;
  const int r = request_of_token(sp.rows.cu_q_lens, sp.rows.num_requests, t);
  const int position = row.n > 0 ? sp.rows.seq_lens[r] - (sp.rows.cu_q_lens[r + 1] - t) : -1;

  // The query's dims [16 (lane % 8), + 16) as floats (exact), and the norms of its dims up to the
  // end of each k32 step (lanes 8 g + part hold the same dims for every g; a step is two parts).
  float query[16], q2 = 0.f;
  e4m3x16_to_float(*reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.scoring.index_q) +
                                                   t * p.scoring.q_stride_token +
                                                   h * p.scoring.q_stride_head + 16 * (lane % 8)),
                   query);
#pragma unroll
  for (int i = 0; i < 16; ++i) q2 = fmaf(query[i], query[i], q2);
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) { // inclusive prefix sum over the parts
    const float below = __shfl_up_sync(0xffffffffu, q2, o, 8);
    if (lane % 8 >= o) q2 += below;
  }
  float radius[kQgmmaSteps]; // error_scale |q_{<=j}|
#pragma unroll
  for (int j = 0; j < kQgmmaSteps; ++j)
    radius[j] =
        p.error_scale * sqrtf(__shfl_sync(0xffffffffu, q2, 2 * j + 1, 8)) * kNormRoundingMargin;
  const float* scores = row_scores(sp, h, t);
  const int64_t step = sp.score_stride_block;
  const float4* norms = p.key_norms + r * p.key_norm_stride;
  // The bound interval of a block with approximate score a and prefix key norms `norm`; NaN scores
  // and infinite or NaN bounds (NaN keys, or a radius of 0 times an infinite norm) span
  // everything.
  const auto bound = [&](float a, float4 norm, float* lo, float* hi) {
    const float e =
        radius[0] * norm.x + radius[1] * norm.y + radius[2] * norm.z + radius[3] * norm.w;
    const bool known = a == a && e <= FLT_MAX;
    *lo = known ? a - e : -INFINITY;
    *hi = known ? a + e : INFINITY;
  };

  // The selection: lane i < fill holds its i-th chosen candidate.
  int32_t chosen = -1;
  uint64_t chosen_key = ~0ull;
  float lo = INFINITY;
  if (lane < row.fill) {
    chosen = row.out[(row.init_blocks + lane) * row.out_stride];
    if (chosen >= row.init_blocks && chosen < row.local_begin) {
      const float a = scores[chosen * step];
      chosen_key = selection_key(a, chosen);
      float hi;
      bound(a, norms[chosen], &lo, &hi);
    }
  }
  if (!__all_sync(0xffffffffu,
                  lane >= row.fill || (chosen >= row.init_blocks && chosen < row.local_begin)))
    return; // not select's output (a flagged row): nothing to certify
  float min_lo = lo;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) min_lo = fminf(min_lo, __shfl_xor_sync(0xffffffffu, min_lo, o));
  const uint64_t least_chosen = warp_min_u64(chosen_key);

  // Whether candidate b (approximate score a, key norm `norm`) is outside the selection (its key
  // is below the least chosen key), and then its upper bound.
  const auto outside = [&](int b, float a, float4 norm, float* hi) {
    if (b >= row.local_begin || selection_key(a, b) >= least_chosen) return false;
    float lo_b;
    bound(a, norm, &lo_b, hi);
    return true;
  };
  // U: the largest upper bound outside the selection, 8 loads of scores and of norms in flight a
  // lane (the row was read at the rate of its loads' latency otherwise).
  float most_hi = -INFINITY;
  for (int base = row.init_blocks; base < row.local_begin; base += 32 * 8) {
    float a[8];
    float4 norm[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int b = base + 32 * u + lane;
      a[u] = b < row.local_begin ? scores[b * step] : 0.f;
      norm[u] = b < row.local_begin ? norms[b] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      float hi_b;
      if (outside(base + 32 * u + lane, a[u], norm[u], &hi_b)) most_hi = fmaxf(most_hi, hi_b);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    most_hi = fmaxf(most_hi, __shfl_xor_sync(0xffffffffu, most_hi, o));
  if (most_hi < min_lo) return; // every block outside is beaten by every chosen one: exact
  const unsigned in_doubt = __ballot_sync(0xffffffffu, lane < row.fill && lo <= most_hi);
  const int slots = __popc(in_doubt);
  if (slots == 0) return; // every chosen block beats every block outside: exact

  // First the blocks outside: best (lane i: the i-th largest exact key, 0 for none yet) keeps the
  // `slots` best of them, out_most their largest exact score (NaN ranks last: left out).
  // A doubtful chosen block whose lower bound is above out_most beats every one of them, and only
  // slots - 1 others compete for the doubtful slots: it stays without a rescore. The others are
  // rescored into best, whose first `redo` keys then take their slots.
  uint64_t best = 0;
  float out_most = -INFINITY;
  bool readable = true;
  const auto rescore = [&](int b) {
    float s;
    if (!exact_block_score(p, r, position, b, query, lane, &s)) {
      readable = false;
      return -INFINITY;
    }
    const uint64_t key = selection_key(s, b);
    const int rank = __popc(__ballot_sync(0xffffffffu, best > key));
    if (rank < slots) {
      const uint64_t above = __shfl_up_sync(0xffffffffu, best, 1);
      if (lane > rank) best = above;
      if (lane == rank) best = key;
    }
    return s;
  };
  for (int base = row.init_blocks; base < row.local_begin && readable; base += 32) {
    const int b = base + lane;
    float hi_b;
    const bool in_doubt_outside =
        b < row.local_begin && outside(b, scores[b * step], norms[b], &hi_b) && hi_b >= min_lo;
    const unsigned near = __ballot_sync(0xffffffffu, in_doubt_outside);
    for (unsigned m = near; m != 0 && readable; m &= m - 1) {
      const float s = rescore(base + __ffs(m) - 1);
      if (s == s) out_most = fmaxf(out_most, s);
    }
  }
  const unsigned redo = __ballot_sync(0xffffffffu, ((in_doubt >> lane) & 1u) && lo <= out_most);
  for (unsigned m = redo; m != 0 && readable; m &= m - 1)
    rescore(__shfl_sync(0xffffffffu, chosen, __ffs(m) - 1));
  if (!readable) return; // an invalid page: flagged by the scorer, the row left as selected

  // The redone slots take the best rescored blocks, then the row is written in order.
  const int slot = __popc(redo & ((1u << lane) - 1u));
  const uint64_t replacement = __shfl_sync(0xffffffffu, best, slot < 32 ? slot : 0);
  const int32_t id = (redo >> lane) & 1u ? block_of_key(replacement) : chosen;
  write_selection(row, selection_key(0.f, id), lane);
}

} // namespace m3sa::cuda
