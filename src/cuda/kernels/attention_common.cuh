#pragma once
// Building blocks of the sparse attention kernels (decode: sparse_attention_decode.cuh, prefill:
// sparse_attention_prefill.cuh): the 16 query heads of one GQA group form the 16 rows of an
// mma.sync m16n8k16 tile (bf16 operands, fp32 accumulation, SM80+), keys and values are staged in
// shared memory as bf16 rows, and a row group's result travels as a partial (m, l, O) that
// log-sum-exp merges combine.
//
// Numerics: logits are q·k in fp32 times 1/sqrt(128) * k_scale, kept in the log2 domain (exp2);
// P·V multiplies P split into a bf16 high part and the bf16 rounding of the rest (two MMAs), so
// the weights keep ~16 bits: P rounded to bf16 alone (8 bits) costs ~1e-3 relative error in the
// output, and P in fp16 with V scaled to fp16 (11 bits, one MMA) was measured at 1.0e-3 relative
// L2 against the CPU backend after the bf16 rounding of both outputs (bench/NOTES.md).
// v_scale and 1/l are applied once at the end.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/attention_math.h"
#include "cuda/attention_params.h"
#include "cuda/indexer_params.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/sm90/hopper.cuh"

namespace m3sa::cuda {

// bf16 per staged row: +16 B spreads ldmatrix rows over banks
inline constexpr int kRowStride = 136;
inline constexpr int kRowBytes = kRowStride * 2;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.69314718055994531f;

__device__ __forceinline__ float logit_scale_log2(float k_scale) {
  return k_scale * 0.08838834764831845f * kLog2e; // 1/sqrt(128), log2 domain
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Byte address of key `row` of `page`, head g, in a K or V cache (strides in elements).
template <bool kFp8>
__device__ __forceinline__ const unsigned char* cache_row(const void* cache, int64_t stride_page,
                                                          int64_t stride_token, int64_t stride_head,
                                                          int64_t page, int row, int g) {
  return static_cast<const unsigned char*>(cache) +
         (page * stride_page + int64_t{row} * stride_token + g * stride_head) * (kFp8 ? 1 : 2);
}

// Issues the copy of `rows` K and V rows (starting at key `first_key` of `page`, head g) into the
// staged tiles k_dst / v_dst (bf16: kRowBytes per row; e4m3: 128 B per row, widened later).
// Rows at or past `visible` are zero-filled and not read: pages hold whatever the engine left
// there, and 0 x NaN would poison the MMA.
template <bool kFp8>
__device__ __forceinline__ void
copy_kv_rows(const SparseAttentionParams& p, int64_t page, int g, int first_key, int rows,
             int visible, unsigned char* k_dst, unsigned char* v_dst, int thread, int threads) {
  constexpr int kElementBytes = kFp8 ? 1 : 2;
  constexpr int kChunks = 128 * kElementBytes / 16; // 16-byte chunks per row
  constexpr int kDstRowBytes = kFp8 ? 128 : kRowBytes;
  const unsigned char* k_base = cache_row<kFp8>(p.k_cache, p.k_stride_page, p.k_stride_token,
                                                p.k_stride_head, page, first_key, g);
  const unsigned char* v_base = cache_row<kFp8>(p.v_cache, p.v_stride_page, p.v_stride_token,
                                                p.v_stride_head, page, first_key, g);
  for (int i = thread; i < rows * kChunks; i += threads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool fill = row < visible;
    const int64_t src_row = fill ? row : 0;
    cp_async_16(k_dst + row * kDstRowBytes + chunk * 16,
                k_base + src_row * p.k_stride_token * kElementBytes + chunk * 16, fill);
    cp_async_16(v_dst + row * kDstRowBytes + chunk * 16,
                v_base + src_row * p.v_stride_token * kElementBytes + chunk * 16, fill);
  }
}

// `rows` staged e4m3 rows (128 B each) -> bf16 rows (kRowBytes each), exact.
__device__ __forceinline__ void widen_rows(const unsigned char* src, unsigned char* dst, int rows,
                                           int thread, int threads) {
  for (int i = thread; i < rows * 8; i += threads) {
    const int row = i / 8, chunk = i % 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(src + row * 128 + chunk * 16);
    widen_e4m3x16_to_bf16(raw, reinterpret_cast<uint4*>(dst + row * kRowBytes + chunk * 32));
  }
}

// The KV page of selection slot `slot` of token t (position `position`, request r) for head g, or
// -1 when the slot holds no visible key: padding (-1), a block past the token's causal blocks,
// a block past the block table (flagged: seq_len beyond the table) or a page id out of range
// (flagged). The selections are the caller's (contract: ascending, causal); the device only
// refuses to read what it must not. checked_page takes `entry`, the table's entry for the block
// as loaded before the position was known (table_entry; any value where the block fails the
// position's checks, which come first); selected_page reads it after them.
__device__ __forceinline__ int64_t checked_page(const SparseAttentionParams& p, int position,
                                                int32_t block, int64_t entry) {
  if (block < 0 || position < 0 || block > position / 128) return -1;
  if (block >= p.block_table_width) {
    atomicOr(p.error_flags, kSeqLenBeyondTable);
    return -1;
  }
  if (entry < 0 || entry >= p.num_pages) {
    atomicOr(p.error_flags, kPageOutOfRange);
    return -1;
  }
  return entry;
}
__device__ __forceinline__ int64_t selected_page(const SparseAttentionParams& p, int request,
                                                 int position, int32_t block) {
  const bool visible = block >= 0 && position >= 0 && block <= position / 128;
  return checked_page(p, position, block,
                      visible && block < p.block_table_width
                          ? p.block_table[request * p.block_table_stride + block]
                          : -1);
}
// Request r's block-table entry for `block` where the table has one (-1 elsewhere), loaded at once
// (load_before_branch), before the token's position is known: an in-bounds read of the table
// whatever the block, whose page checked_page checks.
__device__ __forceinline__ int64_t table_entry(const SparseAttentionParams& p, int request,
                                               int32_t block) {
  return block >= 0 && block < p.block_table_width
             ? load_before_branch(p.block_table + request * p.block_table_stride + block)
             : -1;
}

// Position of packed token t of `request`, or -1 (padding, or q_len > seq_len: flagged when
// `flag_bad`, so that the many threads of one token can leave the flag to one of them).
// The same from the request's loaded q_begin = cu_q_lens[r], q_end = cu_q_lens[r + 1] and seq_len.
__device__ __forceinline__ int token_position(const SparseAttentionParams& p, int q_begin,
                                              int q_end, int seq_len, int t, bool flag_bad) {
  const int q_len = q_end - q_begin;
  if (seq_len > 0 && q_len > seq_len) {
    if (flag_bad) atomicOr(p.error_flags, kSeqLenBeyondTable);
    return -1;
  }
  return seq_len > 0 ? seq_len - q_len + (t - q_begin) : -1;
}
__device__ __forceinline__ int token_position(const SparseAttentionParams& p, int request, int t,
                                              bool flag_bad = true) {
  return token_position(p, p.cu_q_lens[request], p.cu_q_lens[request + 1], p.seq_lens[request], t,
                        flag_bad);
}

// One warp's running softmax state for its 16 rows: thread (gid, tid) holds rows gid and gid + 8.
struct RowState {
  float m[2], l[2]; // max (log2-scaled logits) and this thread's share of the denominator
  float o[16][4];   // [n-tile of 8 dims][c0..c3] unnormalised output
  __device__ void reset() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  }
  // Each thread's share of a row's denominator summed over the row's four threads (the quad).
  __device__ void sum_denominators_over_quad() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }
};

// A warp's 16 query rows of token t, KV head g as MMA A fragments (zero rows past the group).
// kPermuted: the dims of each k-step permuted as the e4m3 key fragments of the Hopper decode
// kernel read them (lane tid's logical k 2 tid, 2 tid + 1, 2 tid + 8, 2 tid + 9 of k-step ks are
// dims 16 (2 tid + ks / 4) + 4 (ks % 4) + 0..3, so that one 16-byte row chunk of e4m3 keys gives
// a lane four k-steps): q.k sums over the same dims in another order.
template <bool kPermuted = false>
__device__ __forceinline__ void load_query(const SparseAttentionParams& p, int t, int g, bool live,
                                           uint32_t (&q)[8][4]) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const uint16_t* rows[2] = {nullptr, nullptr};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = gid + 8 * r;
    if (live && h < p.group)
      rows[r] = static_cast<const uint16_t*>(p.q) + int64_t{t} * p.q_stride_token +
                int64_t{g * p.group + h} * p.q_stride_head;
  }
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int dim = kPermuted ? 16 * (2 * tid + ks / 4) + 4 * (ks % 4) + 2 * half
                                : 16 * ks + 8 * half + 2 * tid;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        q[ks][2 * half + r] = rows[r] ? *reinterpret_cast<const uint32_t*>(rows[r] + dim) : 0u;
    }
}

// Where a staged bf16 K or V tile keeps 16-byte chunk c (dims 8c .. 8c + 7) of row r.
// Padded rows (the cp.async kernels): kRowBytes apart, conflict-free for ldmatrix.
struct PaddedRows {
  const unsigned char* base;
  __device__ const unsigned char* chunk(int row, int c) const {
    return base + row * kRowBytes + c * 16;
  }
};
// Two 128 B-swizzled halves (TMA boxes of 64 dims: dims 0-63, then 64-127), `half_bytes` apart,
// each from a 1024-byte-aligned base: chunk c of row r at (c % 8) ^ (r % 8), also conflict-free.
struct SwizzledHalves {
  const unsigned char* base;
  int half_bytes;
  __device__ int offset(int row, int c) const {
    return (c >> 3) * half_bytes + static_cast<int>(sm90::swizzled_offset(row, c & 7));
  }
  __device__ const unsigned char* chunk(int row, int c) const { return base + offset(row, c); }
};

// Two weights of one row as A-fragment halves: their bf16 rounding (hi) and the bf16 rounding of
// the rest (lo), so that P.V with both keeps ~16 bits of each weight.
__device__ __forceinline__ void split_weights(float w0, float w1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(w0, w1);
  const float2 h_f = __bfloat1622float2(h);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = pack_bf16x2(w0 - h_f.x, w1 - h_f.y);
}

// Online softmax over kTiles x 8 logits of the warp's 16 rows, each the sum of two MMA chains
// (chains[c][nt]: keys key_row + 8 nt + 2 tid + {0, 1} of rows gid, gid + 8, raw q.k; two chains
// of dependent MMAs instead of one twice as long, since a warp's stage is latency-bound,
// bench/NOTES.md s9 r3): keys past `last_key` masked, the running max,
// denominator and O rescaled, and the weights returned as A fragments of kTiles / 2 k-steps of
// 16 keys, split into a bf16 high part and the bf16 rounding of the rest (kHalf: fp16 parts, for
// P·V on fp16 values; the weights are in [0, 1], where fp16's 11 bits keep more of each than
// bf16's 8).
template <int kTiles, bool kHalf = false>
__device__ __forceinline__ void softmax_weights(RowState& st, const float (&chains)[2][kTiles][4],
                                                int key_row, int last_key, float logit_scale,
                                                uint32_t (&p_hi)[kTiles / 2][4],
                                                uint32_t (&p_lo)[kTiles / 2][4]) {
  const int tid = threadIdx.x & 3;
  float s[kTiles][4];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = chains[0][nt][e] + chains[1][nt][e];
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_row + nt * 8 + 2 * tid + (e & 1);
      s[nt][e] = key <= last_key ? s[nt][e] * logit_scale : -INFINITY;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], s[nt][e]);
    }
  float scale[2], m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
    const float m_new = fmaxf(st.m[r], row_max[r]);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new; // a row with no key yet keeps exp2 finite
    scale[r] = exp2f(st.m[r] - m_use[r]);
    st.m[r] = m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float w0 = exp2f(s[nt][2 * r] - m_use[r]), w1 = exp2f(s[nt][2 * r + 1] - m_use[r]);
      sum[r] += w0 + w1;
      if constexpr (kHalf) {
        const __half2 hi = __floats2half2_rn(w0, w1);
        const float2 hi_f = __half22float2(hi);
        const __half2 lo = __floats2half2_rn(w0 - hi_f.x, w1 - hi_f.y);
        p_hi[nt / 2][2 * (nt % 2) + r] = *reinterpret_cast<const uint32_t*>(&hi);
        p_lo[nt / 2][2 * (nt % 2) + r] = *reinterpret_cast<const uint32_t*>(&lo);
      } else {
        split_weights(w0, w1, p_hi[nt / 2][2 * (nt % 2) + r], p_lo[nt / 2][2 * (nt % 2) + r]);
      }
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = st.l[r] * scale[r] + sum[r];
  // Past the first keys a row's max rarely grows: skip the 64 multiplies by 1 unless some row of
  // the warp needs them (warp-uniform branch; the result is the same either way).
  if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      st.o[nt][0] *= scale[0], st.o[nt][1] *= scale[0];
      st.o[nt][2] *= scale[1], st.o[nt][3] *= scale[1];
    }
  }
}

// O += P V for one k-step of 16 keys (rows key_row .. key_row + 15 of the V tile: bf16, or fp16
// with kHalf, P then from softmax_weights<.., true>). With kMaskValues, V elements of keys past
// `last_key` are zeroed in the fragments: their weights are 0, but such rows may hold NaN where
// the tile was not zero-filled (TMA boxes of whole pages).
template <bool kMaskValues, bool kHalf = false, typename VTile>
__device__ __forceinline__ void accumulate_values(RowState& st, const uint32_t (&p_hi)[4],
                                                  const uint32_t (&p_lo)[4], const VTile& v_tile,
                                                  int key_row, int last_key) {
  const int lane = threadIdx.x & 31, tid = lane & 3, matrix = lane >> 3;
  uint32_t keep[2] = {0xffffffffu, 0xffffffffu}; // keys key_row + 2 tid (+ 8) and the next one
  const bool masked = kMaskValues && last_key < key_row + 15; // warp-uniform
  if (masked) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key_row + 8 * h + 2 * tid;
      keep[h] = (key <= last_key ? 0x0000ffffu : 0u) | (key + 1 <= last_key ? 0xffff0000u : 0u);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t b[4];
    ldmatrix_x4_trans(b,
                      v_tile.chunk(key_row + (matrix & 1) * 8 + (lane & 7), 2 * j + (matrix >> 1)));
    if (masked) b[0] &= keep[0], b[1] &= keep[1], b[2] &= keep[0], b[3] &= keep[1];
    mma_16816<kHalf>(st.o[2 * j], p_hi, b[0], b[1]);
    mma_16816<kHalf>(st.o[2 * j], p_lo, b[0], b[1]);
    mma_16816<kHalf>(st.o[2 * j + 1], p_hi, b[2], b[3]);
    mma_16816<kHalf>(st.o[2 * j + 1], p_lo, b[2], b[3]);
  }
}

// attend_keys in two halves over 16 x kKeySteps keys, for a caller that fills the V rows only
// once K's are read (e4m3's widened tile, one block in one pass): the logits and softmax, whose
// weights key_weights returns, then P·V. Two k-steps in one pass make one chain of dependent
// latencies where two passes of one k-step made two: a warp's pass is latency-bound (s9 r3).
template <int kKeySteps, typename KTile>
__device__ __forceinline__ void key_weights(RowState& st, const uint32_t (&q)[8][4],
                                            const KTile& k_tile, int key_row, int last_key,
                                            float logit_scale, uint32_t (&p_hi)[kKeySteps][4],
                                            uint32_t (&p_lo)[kKeySteps][4]) {
  const int lane = threadIdx.x & 31, matrix = lane >> 3;
  float chains[2][2 * kKeySteps][4] = {}; // [k-step % 2]
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int h = 0; h < kKeySteps; ++h) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile.chunk(key_row + 16 * h + (matrix >> 1) * 8 + (lane & 7),
                                  2 * ks + (matrix & 1)));
      mma_bf16_16816(chains[ks & 1][2 * h], q[ks], b[0], b[1]);
      mma_bf16_16816(chains[ks & 1][2 * h + 1], q[ks], b[2], b[3]);
    }
  softmax_weights<2 * kKeySteps>(st, chains, key_row, last_key, logit_scale, p_hi, p_lo);
}
template <bool kMaskValues, int kKeySteps, typename VTile>
__device__ __forceinline__ void accumulate_key_steps(RowState& st,
                                                     const uint32_t (&p_hi)[kKeySteps][4],
                                                     const uint32_t (&p_lo)[kKeySteps][4],
                                                     const VTile& v_tile, int key_row,
                                                     int last_key) {
#pragma unroll
  for (int h = 0; h < kKeySteps; ++h)
    accumulate_values<kMaskValues>(st, p_hi[h], p_lo[h], v_tile, key_row + 16 * h, last_key);
}
// Logits, online softmax and P·V for the 16 keys at row `key_row` of the staged K and V tiles;
// keys past `last_key` (block-relative, like key_row) are masked.
template <bool kMaskValues = false, typename KTile, typename VTile>
__device__ __forceinline__ void attend_keys(RowState& st, const uint32_t (&q)[8][4],
                                            const KTile& k_tile, const VTile& v_tile, int key_row,
                                            int last_key, float logit_scale) {
  uint32_t p_hi[1][4], p_lo[1][4];
  key_weights<1>(st, q, k_tile, key_row, last_key, logit_scale, p_hi, p_lo);
  accumulate_key_steps<kMaskValues, 1>(st, p_hi, p_lo, v_tile, key_row, last_key);
}
// The cp.async kernels' form: padded bf16 rows.
__device__ __forceinline__ void attend_keys(RowState& st, const uint32_t (&q)[8][4],
                                            const unsigned char* k_tile,
                                            const unsigned char* v_tile, int key_row, int last_key,
                                            float logit_scale) {
  attend_keys(st, q, PaddedRows{k_tile}, PaddedRows{v_tile}, key_row, last_key, logit_scale);
}

// Writes a warp's state as a partial [m 16][l 16][O 16 x 128 in Layout] (denominator summed over
// the quad) to shared or global memory.
template <typename Layout = PlainPartialLayout>
__device__ __forceinline__ void store_partial(RowState& st, float* partial) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  st.sum_denominators_over_quad();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (tid == 0) {
      partial[gid + 8 * r] = st.m[r];
      partial[kAttentionRows + gid + 8 * r] = st.l[r];
    }
  }
  float* o = partial + 2 * kAttentionRows;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) // dims nt * 8 + 2 * tid and + 1: one chunk
      *reinterpret_cast<float2*>(o + Layout::offset(gid + 8 * r, nt * 8 + 2 * tid)) =
          make_float2(st.o[nt][2 * r], st.o[nt][2 * r + 1]);
}

// Compact partials (the prefill's, one per token, KV head and selected block, written once and
// read once from HBM): m and l as above, then per row a power of two `a` at or above the row's
// largest |O| and O / a in 16-bit fixed point (step 1 / 32767), half the bytes of the fp32 form;
// its error is at most 2^-16 of the row's largest element (fp16, 2^-12 of it, was part of a
// variant measured beyond the output bound; bench/NOTES.md).
struct CompactPartialView {
  float* m;   // [16]
  float* l;   // [16]
  float* a;   // [16]
  int16_t* o; // [16][128] round(O / a * kFixedLevels)
  __device__ explicit CompactPartialView(void* base)
      : m(static_cast<float*>(base)), l(m + kAttentionRows), a(l + kAttentionRows),
        o(reinterpret_cast<int16_t*>(a + kAttentionRows)) {}
};

// The largest of N values (N a power of two; NaN only where all are), as a tree of depth
// log2 N: a chain of N dependent FMNMX is latency the prefill consumers' softmax and epilogue
// could not hide (bench/NOTES.md s48). Overwrites v.
template <int N, int kWidth = N / 2> __device__ __forceinline__ float tree_max(float (&v)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  if constexpr (kWidth == 0) {
    return v[0];
  } else {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v[i] = fmaxf(v[i], v[i + kWidth]);
    return tree_max<N, kWidth / 2>(v); // a template per level: every index a constant
  }
}

// A warp's state as a compact partial: m, l and a to the partial at `base`, and each word of O
// (two values: row, dims 8 nt + 2 tid and + 1, as 16-bit fixed point) through
// store_word(row, nt, word) - to the partial itself, or to a staging tile that a bulk copy writes.
template <typename StoreWord>
__device__ __forceinline__ void store_compact_partial(RowState& st, void* base,
                                                      StoreWord&& store_word) {
  const CompactPartialView part(base);
  const int lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  st.sum_denominators_over_quad();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float pairs[16];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
      pairs[nt] = fmaxf(fabsf(st.o[nt][2 * r]), fabsf(st.o[nt][2 * r + 1]));
    float largest = tree_max(pairs);
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
    const float a = power_of_two_at_least(largest), scale = kFixedLevels / a;
    const int row = gid + 8 * r;
    if (tid == 0) part.m[row] = st.m[r], part.l[row] = st.l[r], part.a[row] = a;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
      store_word(row, nt, pack_fixed2(st.o[nt][2 * r], st.o[nt][2 * r + 1], scale));
  }
}
__device__ __forceinline__ void store_compact_partial(RowState& st, void* base) {
  int16_t* o = CompactPartialView(base).o + 2 * (threadIdx.x & 3);
  store_compact_partial(st, base, [&](int row, int nt, uint32_t word) {
    *reinterpret_cast<uint32_t*>(o + row * 128 + nt * 8) = word;
  });
}

// One row of merged partials, as a group of 128 threads holds it: row thread / 8, dims
// 16 * (thread % 8) .. + 16.
struct MergedRow {
  float m, l;
  float4 o[4];
};

template <bool kCoherent> __device__ __forceinline__ float load_partial(const float* x) {
  if constexpr (kCoherent)
    return __ldcg(x); // written by other CTAs: bypass L1
  else
    return *x;
}
template <bool kCoherent> __device__ __forceinline__ float4 load_partial4(const float* x) {
  if constexpr (kCoherent)
    return __ldcg(reinterpret_cast<const float4*>(x));
  else
    return *reinterpret_cast<const float4*>(x);
}

// Merges `count` partials (`stride` bytes apart; fp32 form in Layout) by log-sum-exp. Partials
// whose row max is -inf hold no key for that row and are skipped unread.
template <bool kCoherent, typename Layout = PlainPartialLayout>
__device__ __forceinline__ MergedRow merge_rows(const void* first, int64_t stride, int count,
                                                int thread) {
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  const auto partial = [&](int i) {
    return reinterpret_cast<const float*>(static_cast<const unsigned char*>(first) + i * stride);
  };
  MergedRow merged{-INFINITY, 0.f, {}};
#pragma unroll 8
  for (int i = 0; i < count; ++i)
    merged.m = fmaxf(merged.m, load_partial<kCoherent>(partial(i) + row));
  const float m_use = merged.m == -INFINITY ? 0.f : merged.m;
#pragma unroll 4
  for (int i = 0; i < count; ++i) {
    const float* part = partial(i);
    const float m_i = load_partial<kCoherent>(part + row);
    if (m_i == -INFINITY) continue; // no key for this row: O is not read
    const float w = exp2f(m_i - m_use);
    merged.l += w * load_partial<kCoherent>(part + kAttentionRows + row);
    const float* po = part + 2 * kAttentionRows;
#pragma unroll
    for (int d = 0; d < 4; ++d) {
      const float4 v = load_partial4<kCoherent>(po + Layout::offset(row, d0 + 4 * d));
      float4& o = merged.o[d];
      o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
    }
  }
  return merged;
}

// merge_rows for compact partials (`stride` bytes apart), in the same order of terms (partial 0
// first; a row's partials with m = -inf skipped, their bytes unread), but with the loads of
// kBatch partials issued together before any is used, rather than each partial's behind its own
// m test: the merge streams every partial once from HBM, and it went from 82 to 84 % of DRAM
// (ncu), the prefill 1.3 % faster (bench/NOTES.md s50 r3).
template <int kBatch>
__device__ __forceinline__ MergedRow merge_compact_rows(const void* first, int64_t stride,
                                                        int count, int thread) {
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  const auto partial = [&](int i) {
    return reinterpret_cast<const float*>(static_cast<const unsigned char*>(first) + i * stride);
  };
  MergedRow merged{-INFINITY, 0.f, {}};
#pragma unroll 16
  for (int i = 0; i < count; ++i) merged.m = fmaxf(merged.m, partial(i)[row]);
  const float m_use = merged.m == -INFINITY ? 0.f : merged.m;
#pragma unroll 1
  for (int base = 0; base < count; base += kBatch) {
    float m[kBatch], l[kBatch], a[kBatch];
    uint4 o[kBatch][2];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) { // m from L1 (the pass above), then the rest from HBM
      const float* part = partial(min(base + j, count - 1));
      m[j] = base + j < count ? part[row] : -INFINITY;
      l[j] = a[j] = 0.f;
      o[j][0] = o[j][1] = make_uint4(0u, 0u, 0u, 0u);
      if (m[j] != -INFINITY) {
        l[j] = part[kAttentionRows + row];
        a[j] = part[2 * kAttentionRows + row];
        const uint4* po =
            reinterpret_cast<const uint4*>(part + 3 * kAttentionRows) + (row * 128 + d0) / 8;
        o[j][0] = po[0];
        o[j][1] = po[1];
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (m[j] == -INFINITY) continue;
      const float w = exp2f(m[j] - m_use);
      merged.l += w * l[j];
      const float wa = w * a[j] * kFixedStep;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint32_t words[4] = {o[j][c].x, o[j][c].y, o[j][c].z, o[j][c].w};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float4& out = merged.o[2 * c + k];
          out.x += wa * static_cast<float>(static_cast<int16_t>(words[2 * k] & 0xffffu));
          out.y += wa * static_cast<float>(static_cast<int16_t>(words[2 * k] >> 16));
          out.z += wa * static_cast<float>(static_cast<int16_t>(words[2 * k + 1] & 0xffffu));
          out.w += wa * static_cast<float>(static_cast<int16_t>(words[2 * k + 1] >> 16));
        }
      }
    }
  }
  return merged;
}

// merge_rows of a CTA's kCount warp partials in shared memory (Layout), without its skip: a warp
// without keys for a row left that row m = -inf, l = O = 0 (RowState's reset, which masked keys
// keep: their weights are exp2(-inf) and their V rows zero), which adds exact zeros, so every m,
// l and O element is loaded at once instead of each partial's behind its m, and the sums are
// merge_rows' in the same order.
template <int kCount, typename Layout>
__device__ __forceinline__ MergedRow merge_warp_rows(const float* first, int64_t stride,
                                                     int thread) {
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  float m[kCount], l[kCount];
  float4 o[kCount][4];
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const float* part =
        reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(first) + i * stride);
    m[i] = part[row];
    l[i] = part[kAttentionRows + row];
#pragma unroll
    for (int d = 0; d < 4; ++d)
      o[i][d] = *reinterpret_cast<const float4*>(part + 2 * kAttentionRows +
                                                 Layout::offset(row, d0 + 4 * d));
  }
  MergedRow merged{-INFINITY, 0.f, {}};
#pragma unroll
  for (int i = 0; i < kCount; ++i) merged.m = fmaxf(merged.m, m[i]);
  const float m_use = merged.m == -INFINITY ? 0.f : merged.m;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const float w = exp2f(m[i] - m_use);
    merged.l += w * l[i];
#pragma unroll
    for (int d = 0; d < 4; ++d) {
      const float4 v = o[i][d];
      float4& acc = merged.o[d];
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
  }
  return merged;
}

// A merged row as an fp32 partial.
__device__ __forceinline__ void store_merged_partial(const MergedRow& merged, float* out,
                                                     int thread) {
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  if ((thread & 7) == 0) out[row] = merged.m, out[kAttentionRows + row] = merged.l;
  float4* po = reinterpret_cast<float4*>(out + 2 * kAttentionRows + row * 128 + d0);
#pragma unroll
  for (int d = 0; d < 4; ++d) po[d] = merged.o[d];
}

// A merged row as a compact partial (the 8 threads of a row agree on its scale).
__device__ __forceinline__ void store_merged_compact_partial(const MergedRow& merged, void* base,
                                                             int thread) {
  const CompactPartialView part(base);
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  float largest = 0.f;
#pragma unroll
  for (int d = 0; d < 4; ++d)
    largest = fmaxf(largest, fmaxf(fmaxf(fabsf(merged.o[d].x), fabsf(merged.o[d].y)),
                                   fmaxf(fabsf(merged.o[d].z), fabsf(merged.o[d].w))));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1)
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, o));
  const float a = power_of_two_at_least(largest), scale = kFixedLevels / a;
  if ((thread & 7) == 0) part.m[row] = merged.m, part.l[row] = merged.l, part.a[row] = a;
  uint32_t* po = reinterpret_cast<uint32_t*>(part.o + row * 128 + d0);
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    po[2 * d] = pack_fixed2(merged.o[d].x, merged.o[d].y, scale);
    po[2 * d + 1] = pack_fixed2(merged.o[d].z, merged.o[d].w, scale);
  }
}

// A row's lse (natural log) from its max m (log2 domain, scaled logits) and denominator l; -inf
// for a row without keys (l = 0).
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.f ? (m + __log2f(l)) * kLn2 : -INFINITY;
}

// A merged row as token t's bf16 output (times v_scale / l) and lse; zeros and -inf without keys.
__device__ __forceinline__ void store_output_row(const SparseAttentionParams& p,
                                                 const MergedRow& merged, int t, int g,
                                                 int thread) {
  const int row = thread >> 3, d0 = (thread & 7) * 16;
  if (row >= p.group) return;
  const float inverse = merged.l > 0.f ? p.v_scale / merged.l : 0.f;
  const int64_t head = int64_t{g} * p.group + row;
  uint16_t* out = static_cast<uint16_t*>(p.out) + int64_t{t} * p.out_stride_token +
                  head * p.out_stride_head + d0;
  uint32_t packed[8];
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    packed[2 * d] = pack_bf16x2(merged.o[d].x * inverse, merged.o[d].y * inverse);
    packed[2 * d + 1] = pack_bf16x2(merged.o[d].z * inverse, merged.o[d].w * inverse);
  }
  reinterpret_cast<uint4*>(out)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  reinterpret_cast<uint4*>(out)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  if (p.lse && (thread & 7) == 0)
    p.lse[int64_t{t} * p.lse_stride_token + head * p.lse_stride_head] = row_lse(merged.m, merged.l);
}

} // namespace m3sa::cuda
