#pragma once
// Sparse attention for decode rows (docs/contract.md, "Sparse attention"): one query token per
// work item, so each item reads its own selected blocks once.
//
// Work item = (token, KV head, split): the token's selection is cut into `splits` ranges of slots
// (batch 1 gets one or two selected blocks per CTA, a full batch one range), CTAs are persistent
// (as many as are resident) and stride over the items. A CTA's 4 warps share the 16 query rows of
// the GQA group and take 16 keys each of every 64-key stage; K and V of a stage arrive by cp.async,
// kStages - 1 stages ahead of the MMAs (bf16 3 stages, e4m3 4: its stages are half the bytes, and
// the copy rate needs the bytes in flight); e4m3 awaits a range of one selected block (batch 1)
// whole and each warp takes 32 consecutive keys of it in one pass. The warps merge their (m, l, O)
// in shared memory. With splits on SM90 (kMergeInCluster), the splits of a (token, KV head) are the
// CTAs of one thread-block cluster: each pushes its merged partial of every row into the shared
// memory of the CTA that merges that row (st.async, counted down that CTA's mbarrier), which merges
// its rows and writes them (no global traffic, fence or atomic: the global merge below was ~6 us of
// batch 1; no cluster-wide barrier after the kernel's first, bench/NOTES.md s12). Elsewhere each
// CTA writes its merged partial to the workspace and the last CTA to arrive for a (token, KV head)
// merges them (log-sum-exp) and writes the output, then resets the arrival counter. Keys past the
// token's position are zero-filled by the copy, never read. Bad metadata is flagged
// (attention_common.cuh) and contributes no key.
// fp8 KV: each warp widens the e4m3 rows its MMAs read into a bf16 tile in shared memory (exact).
// Batch 1 is latency: what needs no memory (the first item's coordinates, the split divisor) is
// worked out before the PDL wait, and the queries load where they delay neither the selection nor
// the first MMAs (kDecodeQueryLoad: bf16 after the selection, e4m3 after the first copies).
#include "cuda/decode_splits.h"
#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/decode_stamps.cuh"
#include "cuda/prepared_divisor.h"

namespace m3sa::cuda {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeStageKeys = 64;
template <bool kFp8> inline constexpr int kDecodeStages = kFp8 ? 4 : 3;
// Cluster merge: the receiving CTA's slots (decode_splits.h says which), a row's (O[128], m, l)
// from one split each, 16 B aligned.
inline constexpr int kClusterSlotFloats = 132;
inline constexpr int kClusterReceiveBytes = kClusterMergeSlots * kClusterSlotFloats * 4;
inline constexpr int kClusterSlotBytesPushed = (128 + 2) * 4; // O, m and l; not the padding
// clang-format reads the template arguments below as comparisons:
// clang-format off
template <bool kFp8>
inline constexpr int kDecodeRawStageBytes = 2 * kDecodeStageKeys * (kFp8 ? 128 : kRowBytes); // K, V
// The stages, the widened bf16 K|V tile (e4m3 only), then the cluster merge's slots, which peers
// fill while this CTA may still stream (so they have their own bytes).
template <bool kFp8>
inline constexpr int kDecodeStreamBytes =
    kDecodeStages<kFp8> * kDecodeRawStageBytes<kFp8> + (kFp8 ? 2 * kDecodeStageKeys * kRowBytes : 0);
template <bool kFp8>
inline constexpr int kDecodeSmemBytes = kDecodeStreamBytes<kFp8> + kClusterReceiveBytes;
// clang-format on
static_assert(kDecodeStreamBytes<true> >= 4 * kSharedPartialFloats * 4 &&
                  kDecodeStreamBytes<false> >= 4 * kSharedPartialFloats * 4,
              "the warps' partials reuse the stage buffers");
static_assert(kDecodeThreads == 128, "the cluster merge gives a thread one of a row's 128 dims");
// Two CTAs an SM (kAttentionCtasPerSm): an SM's 228 KB of shared memory, less 1 KB reserved a
// CTA and 2 KB of static shared memory (the selection and the barrier: 1,440 B, cuobjdump
// -res-usage).
inline constexpr bool fits_two_ctas_an_sm(int dynamic_bytes) {
  return kAttentionCtasPerSm * (dynamic_bytes + 1024 + 2 * 1024) <= 228 * 1024;
}
static_assert(fits_two_ctas_an_sm(kDecodeSmemBytes<true>) &&
                  fits_two_ctas_an_sm(kDecodeSmemBytes<false>),
              "two CTAs per SM (kAttentionCtasPerSm)");

// Issues the copy of keys first_row .. first_row + 63 of `page` (head g) into the stage's K and V
// tiles (bf16: kRowBytes per row; e4m3: 128 B, widened later), rows at or past `visible` zero-
// filled and not read. The thread's rows and chunk are fixed (rows row0 + j * kRowsPerPass, one
// 16-byte chunk), so a row costs one pointer step per cache instead of copy_kv_rows' index math:
// the copies were a third of the kernel's instructions (session 6 SASS, bench/NOTES.md).
template <bool kFp8>
__device__ __forceinline__ void copy_stage_rows(const SparseAttentionParams& p, int64_t page, int g,
                                                int first_row, int visible, unsigned char* k_dst,
                                                unsigned char* v_dst) {
  constexpr int kElementBytes = kFp8 ? 1 : 2;
  constexpr int kChunks = 128 * kElementBytes / 16; // 16-byte chunks per row
  constexpr int kRowsPerPass = kDecodeThreads / kChunks;
  constexpr int kDstRowBytes = kFp8 ? 128 : kRowBytes;
  static_assert(kDecodeStageKeys % kRowsPerPass == 0, "whole passes per stage");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const int64_t k_step = p.k_stride_token * kElementBytes * kRowsPerPass;
  const int64_t v_step = p.v_stride_token * kElementBytes * kRowsPerPass;
  const unsigned char* k_src = cache_row<kFp8>(p.k_cache, p.k_stride_page, p.k_stride_token,
                                               p.k_stride_head, page, first_row + row0, g) +
                               chunk * 16;
  const unsigned char* v_src = cache_row<kFp8>(p.v_cache, p.v_stride_page, p.v_stride_token,
                                               p.v_stride_head, page, first_row + row0, g) +
                               chunk * 16;
  k_dst += row0 * kDstRowBytes + chunk * 16;
  v_dst += row0 * kDstRowBytes + chunk * 16;
#pragma unroll
  for (int j = 0; j < kDecodeStageKeys / kRowsPerPass; ++j) {
    const bool fill = row0 + j * kRowsPerPass < visible; // else: zeros, the first row not read
    cp_async_16(k_dst + j * kRowsPerPass * kDstRowBytes, fill ? k_src + j * k_step : k_src, fill);
    cp_async_16(v_dst + j * kRowsPerPass * kDstRowBytes, fill ? v_src + j * v_step : v_src, fill);
  }
}

// fp8: this warp's 16 K rows and 16 V rows of a stage (the only rows its MMAs read), widened from
// the raw e4m3 stage (K rows, then V rows, 128 B each) into `widened` (same order, bf16 rows):
// no barrier beyond the warp.
__device__ __forceinline__ void widen_warp_rows(const unsigned char* raw, unsigned char* widened,
                                                int warp, int lane) {
  __syncwarp(); // the warp's MMAs of the previous stage have read these rows
#pragma unroll
  for (int i = lane; i < 2 * 16 * 8; i += 32) {
    const int r = i / 8, chunk = i % 8; // r: K rows 0..15, then V rows
    const int row = warp * 16 + r + (r < 16 ? 0 : kDecodeStageKeys - 16);
    const uint4 bits = *reinterpret_cast<const uint4*>(raw + row * 128 + chunk * 16);
    widen_e4m3x16_to_bf16(bits, reinterpret_cast<uint4*>(widened + row * kRowBytes + chunk * 32));
  }
  __syncwarp();
}

// The token's valid selected blocks in ascending order, with their pages.
struct DecodeSelection {
  int32_t position;
  int32_t count;
  int32_t block[kMaxSelection];
  int64_t page[kMaxSelection];
  int32_t last_arrival;
};

#ifndef M3SA_ATTENTION_DECODE_PREFETCH_TABLE // diagnostic builds only: 0 = no prefetch
#define M3SA_ATTENTION_DECODE_PREFETCH_TABLE 1
#endif
inline constexpr bool kDecodePrefetchTableRow = M3SA_ATTENTION_DECODE_PREFETCH_TABLE != 0;
#ifndef M3SA_ATTENTION_DECODE_ONE_BLOCK_PASS // diagnostic builds only: 0 = e4m3 in two passes
#define M3SA_ATTENTION_DECODE_ONE_BLOCK_PASS 1
#endif
inline constexpr bool kDecodeOneBlockPass = M3SA_ATTENTION_DECODE_ONE_BLOCK_PASS != 0;
// Where load_query's 32 loads a thread go: ahead of the selection (in flight during its loads),
// after it (ahead of the first copies), or after the item's first copies are issued (the queries
// are needed only at the first MMAs). Measured on the cp.async kernel at batch 1 (H100):
// - ahead of the selection (before s42): the selection's first round of loads took ~1.9-2.5K
//   cycles, queued behind the queries' (s41 r2, s42 r1-r2 selection stamps).
// - after the first copies: the selection's loads came back ~1K cycles sooner, but bf16's first
//   MMAs waited ~1.7K cycles longer, for queries queued behind two stages of copies: bf16
//   +0.55-0.65 us; e4m3 -0.13-0.22 us (its stages widen to bf16 before the MMAs, which hides the
//   queries' wait), -0.6 us with the first item's coordinates before the PDL wait (s42 r1).
// - after the selection: the first round back in ~0.7K cycles, the queries ahead of the copies:
//   bf16 -0.33-0.43 us, e4m3 +0.3 us against after the copies (s42 r2).
// So bf16 loads them after the selection and e4m3 after the first copies. The TMA kernel (kTma:
// the batches of 32 and more; not measured otherwise) loads them ahead of the selection.
// Diagnostic builds: M3SA_ATTENTION_DECODE_QUERIES_FIRST=1 ahead of the selection everywhere,
// 2 after it (the cp.async kernel; the TMA kernel ahead), 0 after the first copies everywhere.
enum class QueryLoad { kBeforeSelection, kAfterSelection, kAfterFirstCopies };
#ifndef M3SA_ATTENTION_DECODE_QUERIES_FIRST
#define M3SA_ATTENTION_DECODE_QUERIES_FIRST -1
#endif
template <bool kFp8, bool kTma = false>
inline constexpr QueryLoad kDecodeQueryLoad =
    M3SA_ATTENTION_DECODE_QUERIES_FIRST == 0            ? QueryLoad::kAfterFirstCopies
    : M3SA_ATTENTION_DECODE_QUERIES_FIRST == 1 || kTma  ? QueryLoad::kBeforeSelection
    : M3SA_ATTENTION_DECODE_QUERIES_FIRST == 2 || !kFp8 ? QueryLoad::kAfterSelection
                                                        : QueryLoad::kAfterFirstCopies;
// Token t's request under the decode layout's guess (t / decode_q_len, within the batch), which
// select_blocks checks against the request's bounds; and the address of its KV head g's slot k.
__device__ __forceinline__ int guessed_request(const SparseAttentionParams& p, int t) {
  return min(t / max(1, p.decode_q_len), p.num_requests - 1);
}
__device__ __forceinline__ const int32_t* selection_slot(const SparseAttentionParams& p, int t,
                                                         int g, int k) {
  return p.topk + g * p.topk_stride_head + int64_t{t} * p.topk_stride_token + k * p.topk_stride_k;
}
// The lines select_blocks reads, brought into L2 before the PDL wait (prefetches only: L2 is
// where the previous grid's writes land, so a line prefetched early is never stale): the token's
// selection slots and its request's bounds and length under the decode layout's guess (request t
// / decode_q_len), and, with splits (the small batches, where the selection's dependent round
// trips - the slot, then its page in the block table - are a quarter of the time: s12 r1 stamps,
// 2.1 us of batch 1's 8.8), the request's block-table row, known under the same guess: warps 1-3
// of the pair's CTAs take a 128-byte line a thread, the CTAs interleaved, the whole allocated row
// (3072 x splits blocks at most), since the positions are not known yet. s23 r4: -0.02-0.13 us at
// batch 1 over the prefetch after the wait.
__device__ __forceinline__ void prefetch_selection_metadata(const SparseAttentionParams& p, int t,
                                                            int g, int split, int request) {
  if (p.num_requests <= 0) return;
  if (kDecodePrefetchTableRow && threadIdx.x >= 32 && p.splits > 1) {
    constexpr int kEntriesPerLine = 128 / sizeof(int32_t);
    const int entry = ((threadIdx.x - 32) * p.splits + split) * kEntriesPerLine;
    if (entry < p.block_table_width)
      prefetch_to_l2(p.block_table + int64_t{request} * p.block_table_stride + entry);
  }
  if (threadIdx.x < p.top_k) prefetch_to_l2(selection_slot(p, t, g, threadIdx.x));
  if (threadIdx.x == 0) prefetch_to_l2(p.cu_q_lens + request), prefetch_to_l2(p.seq_lens + request);
}

// `guess`: guessed_request(p, t), worked out before the PDL wait (its division, placed among the
// loads below, let ptxas put the slot's wait ahead of the bounds' loads: one more round trip).
__device__ __forceinline__ void select_blocks(const SparseAttentionParams& p, int t, int g,
                                              int guess, DecodeSelection& sel) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) { // one warp: ballot-compact the slots that hold a visible block
    // Two rounds of loads, where there were three (s40 r1: -0.15 us at batch 1): the
    // selection slot, then its block-table entry (table_entry: before the position is known;
    // checked_page checks it after), with the request's bounds and length under the decode
    // layout's guess in either round (load_before_branch: a plain load was sunk behind the check
    // of the bounds, a round of its own; ptxas issues the slot first). A binary search replaces
    // the guess only where the metadata does not follow that layout.
    int request = guess;
    int q_begin = load_before_branch(p.cu_q_lens + request);
    int q_end = load_before_branch(p.cu_q_lens + request + 1);
    int seq_len = load_before_branch(p.seq_lens + request);
    const int32_t block = load_before_branch(selection_slot(p, t, g, min(lane, p.top_k - 1)));
    M3SA_DECODE_SELECT_STAMP(0, block + q_begin + q_end + seq_len);
    int64_t entry = table_entry(p, request, block);
    M3SA_DECODE_SELECT_STAMP(1, entry);
    if (!(q_begin <= t && t < q_end)) {
      request = request_of_token(p.cu_q_lens, p.num_requests, t);
      q_begin = p.cu_q_lens[request], q_end = p.cu_q_lens[request + 1];
      seq_len = p.seq_lens[request];
      entry = table_entry(p, request, block);
    }
    const int position = lane == 0 ? token_position(p, q_begin, q_end, seq_len, t, true) : 0;
    const int pos = __shfl_sync(0xffffffffu, position, 0);
    const int64_t page = lane < p.top_k ? checked_page(p, pos, block, entry) : -1;
    const unsigned valid = __ballot_sync(0xffffffffu, page >= 0);
    if (page >= 0) {
      const int slot = __popc(valid & ((1u << lane) - 1));
      sel.block[slot] = block;
      sel.page[slot] = page;
    }
    if (lane == 0) sel.position = pos, sel.count = __popc(valid);
    M3SA_DECODE_SELECT_STAMP(2, 0);
  }
  __syncthreads();
  M3SA_DECODE_SELECT_STAMP(3, 0);
}

// Batch 1's bf16 clusters: the warps split the keys of Q K^T, as attend_keys does, but P.V by
// output dims, so that no warp holds a partial of all 128 dims and the four warps' fp32 (m, l, O)
// need no merge through shared memory (s43 r1 stamps at 64/4: finish 3.85K -> 2.68K cycles, first
// stage +0.4K; -0.12 to -0.23 us). A stage costs two more CTA barriers: one after the logits
// (every warp's row maxima in; the stage's K rows read), one after the weights (written as MMA A
// fragments over those K rows, with the row sums). e4m3 keeps the partials: its one-pass block
// (no CTA barrier) measured level with this split (s43 r2, -0.02 to +0.02 us),
// bench/patches/s43-decode-attention-split-dims-e4m3.patch. M3SA_ATTENTION_DECODE_SPLIT_DIMS=0:
// off.
#ifndef M3SA_ATTENTION_DECODE_SPLIT_DIMS
#define M3SA_ATTENTION_DECODE_SPLIT_DIMS 1
#endif
inline constexpr bool kDecodeSplitDims = M3SA_ATTENTION_DECODE_SPLIT_DIMS != 0;

// One warp's state when the warps split P.V by dims: rows gid and gid + 8 (m and l of the whole
// row, the same in every warp and lane of a quad), O of the warp's 32 dims (n-tiles of 8).
struct ColumnState {
  float m[2], l[2];
  float o[4][4];
  __device__ void reset() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  }
};
// A stage's row maxima and row sums of each warp's 16 keys.
struct StageExchange {
  float max[4][kAttentionRows], sum[4][kAttentionRows];
};

// One 64-key stage of padded bf16 rows (k_tile: K, then reused for the weights; v_tile: V), keys
// past `last_key` (stage-relative) masked: warp w's logits of keys 16 w .. 16 w + 15, the stage's
// row maxima across the warps, the weights (bf16 hi / lo, as softmax_weights) written as A
// fragments, then each warp's P.V over the 64 keys for its 32 dims. Called by every warp of the
// CTA the same number of times (its barriers are CTA-wide).
__device__ __forceinline__ void attend_stage_by_dims(ColumnState& st, const uint32_t (&q)[8][4],
                                                     unsigned char* k_tile,
                                                     const unsigned char* v_tile, int last_key,
                                                     float logit_scale, StageExchange& exchange) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const int matrix = lane >> 3, key_row = 16 * warp;
  float chains[2][2][4] = {}; // [k-step % 2][n-tile of 8 keys]: two chains, as key_weights
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t b[4];
    ldmatrix_x4(b, PaddedRows{k_tile}.chunk(key_row + (matrix >> 1) * 8 + (lane & 7),
                                            2 * ks + (matrix & 1)));
    mma_bf16_16816(chains[ks & 1][0], q[ks], b[0], b[1]);
    mma_bf16_16816(chains[ks & 1][1], q[ks], b[2], b[3]);
  }
  float s[2][4], row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_row + nt * 8 + 2 * tid + (e & 1);
      s[nt][e] = key <= last_key ? (chains[0][nt][e] + chains[1][nt][e]) * logit_scale : -INFINITY;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], s[nt][e]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
    if (tid == 0) exchange.max[warp][gid + 8 * r] = row_max[r];
  }
  __syncthreads(); // every warp's maxima in; every warp's K reads done (the weights go there)
  float scale[2], m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float stage_max = exchange.max[0][gid + 8 * r];
#pragma unroll
    for (int w = 1; w < 4; ++w) stage_max = fmaxf(stage_max, exchange.max[w][gid + 8 * r]);
    const float m_new = fmaxf(st.m[r], stage_max);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new; // a row with no key yet keeps exp2 finite
    scale[r] = exp2f(st.m[r] - m_use[r]);
    st.m[r] = m_new;
  }
  uint32_t p_hi[4], p_lo[4];
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float w0 = exp2f(s[nt][2 * r] - m_use[r]), w1 = exp2f(s[nt][2 * r + 1] - m_use[r]);
      sum[r] += w0 + w1;
      split_weights(w0, w1, p_hi[2 * nt + r], p_lo[2 * nt + r]);
    }
  // Lane-indexed fragments (hi for all warps, then lo), 16 B a lane: conflict-free.
  uint4* fragments = reinterpret_cast<uint4*>(k_tile);
  fragments[warp * 32 + lane] = make_uint4(p_hi[0], p_hi[1], p_hi[2], p_hi[3]);
  fragments[128 + warp * 32 + lane] = make_uint4(p_lo[0], p_lo[1], p_lo[2], p_lo[3]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    if (tid == 0) exchange.sum[warp][gid + 8 * r] = sum[r];
  }
  __syncthreads(); // every warp's weights and sums in
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float stage_sum = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) stage_sum += exchange.sum[w][gid + 8 * r];
    st.l[r] = st.l[r] * scale[r] + stage_sum;
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    st.o[nt][0] *= scale[0], st.o[nt][1] *= scale[0];
    st.o[nt][2] *= scale[1], st.o[nt][3] *= scale[1];
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) { // k-step w: the weights of keys 16 w .. 16 w + 15
    const uint4 hi = fragments[w * 32 + lane], lo = fragments[128 + w * 32 + lane];
    const uint32_t a_hi[4] = {hi.x, hi.y, hi.z, hi.w}, a_lo[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
    for (int j = 0; j < 2; ++j) { // this warp's dims 32 warp + 16 j .. + 15
      uint32_t b[4];
      ldmatrix_x4_trans(b, PaddedRows{v_tile}.chunk(16 * w + (matrix & 1) * 8 + (lane & 7),
                                                    2 * (2 * warp + j) + (matrix >> 1)));
      mma_bf16_16816(st.o[2 * j], a_hi, b[0], b[1]);
      mma_bf16_16816(st.o[2 * j], a_lo, b[0], b[1]);
      mma_bf16_16816(st.o[2 * j + 1], a_hi, b[2], b[3]);
      mma_bf16_16816(st.o[2 * j + 1], a_lo, b[2], b[3]);
    }
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Row `head` of token t from the `splits` slots at `slots` (kMaxSplits: the count, or with
// kMaxClusterSplits a bound): every split's m, l and O element loaded at once, then merged in
// split order as merge_rows does. A split without keys (m = -inf, l = O = 0) adds exact zeros
// (exp2 of -inf), so there is no branch: with one per split (s12 r5) the slot merge of batch 1
// took ~1,800 cycles, straight-line 860 (s12 r6 stamps).
template <int kMaxSplits>
__device__ __forceinline__ void merge_cluster_row(const SparseAttentionParams& p,
                                                  const float* slots, int splits, int t,
                                                  int64_t head, int d) {
  float m[kMaxSplits], l[kMaxSplits], o[kMaxSplits];
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) {
    const bool present = kMaxSplits == kMaxClusterSplits ? i < splits : true;
    const float* part = slots + (present ? i : 0) * kClusterSlotFloats;
    m[i] = present ? part[128] : -INFINITY;
    l[i] = present ? part[129] : 0.f;
    o[i] = present ? part[d] : 0.f;
  }
  float m_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) m_max = fmaxf(m_max, m[i]);
  const float m_use = m_max == -INFINITY ? 0.f : m_max;
  float l_sum = 0.f, o_sum = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxSplits; ++i) {
    const float w = exp2f(m[i] - m_use);
    l_sum += w * l[i];
    o_sum += w * o[i];
  }
  const float inverse = l_sum > 0.f ? p.v_scale / l_sum : 0.f;
  static_cast<__nv_bfloat16*>(
      p.out)[int64_t{t} * p.out_stride_token + head * p.out_stride_head + d] =
      __float2bfloat16_rn(o_sum * inverse);
  if (p.lse && d == 0)
    p.lse[int64_t{t} * p.lse_stride_token + head * p.lse_stride_head] = row_lse(m_max, l_sum);
}

// The receiving half of the cluster merge (below): this CTA's rows, once every split's slot of
// them is in.
__device__ __forceinline__ void merge_received_rows(const SparseAttentionParams& p, float* receive,
                                                    uint64_t* bar, uint32_t parity, int split,
                                                    int t, int g) {
  const int splits = p.splits;
  if (cluster_rows_owned(p.group, splits, split) == 0) return;
  sm90::mbarrier_wait(bar, parity);
  M3SA_DECODE_FINISH_STAMP(2);
  const int d = threadIdx.x;
  for (int row = split; row < p.group; row += splits) {
    const float* slots = receive + cluster_merge_slot(row, 0, splits) * kClusterSlotFloats;
    const int64_t head = int64_t{g} * p.group + row;
    // A thread a dim: the sm90 plan's clusters of 8 get an exact unroll, 16 is the bound itself.
    if (splits == 8)
      merge_cluster_row<8>(p, slots, splits, t, head, d);
    else
      merge_cluster_row<kMaxClusterSplits>(p, slots, splits, t, head, d);
  }
  M3SA_DECODE_FINISH_STAMP(3);
}

// The splits of a (token, KV head) as the p.splits CTAs of this cluster (split == rank). Row r of
// the group is merged by the CTA of rank r % splits; every CTA pushes its merged partial of row r
// (O, then m and l) into that CTA's `receive` slot (r / splits) * splits + split by st.async, which
// counts the bytes down the receiver's `bar`; each CTA then waits for its own rows' bytes only,
// merges them (a thread per dim; same order of terms as the workspace merge, merge_rows: split 0
// first) and writes token t's output. No fence and no cluster-wide barrier: the cluster.sync()
// version (a DSMEM read of every partial between two of them, each a MEMBAR.ALL.GPU) finished
// batch 1 in 7,000-7,800 cycles, this one in 3,400-4,000 (s12 r1 / r6 stamps).
// The peers' barriers exist only once the kernel's cluster barrier has completed: the caller has
// waited for it (sparse_attention_decode_kernel, while the first item's copies are in flight).
__device__ __forceinline__ void merge_splits_in_cluster(const SparseAttentionParams& p,
                                                        const MergedRow& mine, float* receive,
                                                        uint64_t* bar, uint32_t parity, int split,
                                                        int t, int g) {
  const int splits = p.splits;
  const int row = threadIdx.x >> 3, d0 = (threadIdx.x & 7) * 16;
  if (row < p.group) {
    const uint32_t owner = static_cast<uint32_t>(cluster_merge_owner(row, splits));
    const float* slot = receive + cluster_merge_slot(row, split, splits) * kClusterSlotFloats;
    const uint32_t peer_bar = sm90::peer_shared_address(bar, owner);
    const uint32_t peer_o = sm90::peer_shared_address(slot + d0, owner);
#pragma unroll
    for (int d = 0; d < 4; ++d) sm90::push_to_peer(peer_o + 16 * d, mine.o[d], peer_bar);
    if ((threadIdx.x & 7) == 0)
      sm90::push_to_peer(sm90::peer_shared_address(slot + 128, owner), make_float2(mine.m, mine.l),
                         peer_bar);
  }
  M3SA_DECODE_FINISH_STAMP(1);
  merge_received_rows(p, receive, bar, parity, split, t, g);
}

// The same pushes from a ColumnState (the warps split P.V by dims): thread (gid, tid) of warp w
// holds dims 32 w + 8 nt + 2 tid (+ 1) of rows gid and gid + 8, and every warp the rows' m and l;
// warp 0 pushes those. A slot gets the same 520 bytes as from merge_splits_in_cluster.
__device__ __forceinline__ void push_columns_to_cluster(const SparseAttentionParams& p,
                                                        const ColumnState& st, float* receive,
                                                        uint64_t* bar, int split) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = gid + 8 * r;
    if (row >= p.group) continue;
    const uint32_t owner = static_cast<uint32_t>(cluster_merge_owner(row, p.splits));
    const float* slot = receive + cluster_merge_slot(row, split, p.splits) * kClusterSlotFloats;
    const uint32_t peer_bar = sm90::peer_shared_address(bar, owner);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
      sm90::push_to_peer(sm90::peer_shared_address(slot + 32 * warp + 8 * nt + 2 * tid, owner),
                         make_float2(st.o[nt][2 * r], st.o[nt][2 * r + 1]), peer_bar);
    if (warp == 0 && tid == 0)
      sm90::push_to_peer(sm90::peer_shared_address(slot + 128, owner),
                         make_float2(st.m[r], st.l[r]), peer_bar);
  }
  M3SA_DECODE_FINISH_STAMP(1);
}
#endif

// The end of a decode item (token t, KV head g, `split` of the pair's selection), once each of the
// CTA's four warps has stored its partial (`warp_stride` bytes apart from `warp_partials`): the
// warps' partials merged, then the output written (one split), or the splits merged in the
// cluster (`cluster`: the receiving slots and their barrier), or through the workspace by the
// last CTA to arrive (`last_arrival`: a shared flag), or left in the workspace for
// merge_decode_splits_kernel.
struct ClusterMerge {
  float* receive;
  uint64_t* bar;
  uint32_t parity;
};
__device__ __forceinline__ void finish_decode_item(const SparseAttentionParams& p,
                                                   const float* warp_partials, int64_t warp_stride,
                                                   const ClusterMerge& cluster, int64_t pair,
                                                   int split, int t, int g, int32_t* last_arrival) {
  __syncthreads();
  const MergedRow warps =
      merge_warp_rows<4, SharedPartialLayout>(warp_partials, warp_stride, threadIdx.x);
  M3SA_DECODE_FINISH_STAMP(0);
  if (p.splits == 1) {
    store_output_row(p, warps, t, g, threadIdx.x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  } else if (p.split_merge == kMergeInCluster) {
    merge_splits_in_cluster(p, warps, cluster.receive, cluster.bar, cluster.parity, split, t, g);
#endif
  } else {
    store_merged_partial(warps, p.partials + (pair * p.splits + split) * kPartialFloats,
                         threadIdx.x);
    if (p.split_merge == kMergeByNextKernel) return; // the merge kernel waits for this grid
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int arrived = atomicAdd(p.arrivals + pair, 1);
      *last_arrival = arrived == p.splits - 1;
      if (*last_arrival) atomicExch(p.arrivals + pair, 0); // ready for the next launch
    }
    __syncthreads();
    if (*last_arrival) {
      __threadfence();
      store_output_row(p,
                       merge_rows<true>(p.partials + pair * p.splits * kPartialFloats,
                                        kPartialFloats * sizeof(float), p.splits, threadIdx.x),
                       t, g, threadIdx.x);
    }
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kDecodeThreads, kAttentionCtasPerSm)
    sparse_attention_decode_kernel(const __grid_constant__ SparseAttentionParams p) {
  constexpr int kStages = kDecodeStages<kFp8>;
  constexpr int kRawStageBytes = kDecodeRawStageBytes<kFp8>;
  constexpr int kRawTileBytes = kRawStageBytes / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ DecodeSelection sel;
  unsigned char* widened = smem + kStages * kRawStageBytes; // fp8 only
  const int warp = threadIdx.x >> 5;
  const float logit_scale = logit_scale_log2(p.k_scale);
  __shared__ uint64_t cluster_bar; // the cluster merge's receiving slots are complete
  float* cluster_receive = reinterpret_cast<float*>(smem + kDecodeStreamBytes<kFp8>);
  // Batch 1's bf16 clusters split P.V by dims (attend_stage_by_dims; the cluster merge is SM90's).
  __shared__ StageExchange exchange;
  bool by_dims = false;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool clustered = p.split_merge == kMergeInCluster && p.splits > 1;
  by_dims = kDecodeSplitDims && !kFp8 && clustered;
  // The barrier exists before any peer pushes (the first item's cluster_wait). A CTA barrier and
  // a release arrive, not a relaxed one after the init fence: racecheck reported the relaxed form
  // (s12 r3, r4), and here, before any global access, the release's fence waits for nothing.
  if (clustered) {
    if (threadIdx.x == 0) sm90::mbarrier_init(&cluster_bar, 1), sm90::fence_barrier_init();
    __syncthreads();
    sm90::cluster_arrive_release();
  }
#endif

  M3SA_DECODE_STAMPS_BEGIN();
  M3SA_DECODE_STAMP(0);
  touch_parameters(p); // into the constant cache while the previous grid runs
  const int64_t items = int64_t{p.token_end - p.token_begin} * p.kv_heads * p.splits;
  // Item `item`: token t, KV head g (the pair), split of the pair's selection.
  const auto pair_of = [&](int64_t item) { return item / p.splits; };
  const auto token_of = [&](int64_t item) {
    return p.token_begin + static_cast<int>(pair_of(item) / p.kv_heads);
  };
  const auto head_of = [&](int64_t item) { return static_cast<int>(pair_of(item) % p.kv_heads); };
  const auto split_of = [&](int64_t item) { return static_cast<int>(item % p.splits); };
  // An item's coordinates and its request under the decode layout's guess (select_blocks): the
  // first item's before the PDL wait, the next's while this one's first copies are in flight, so
  // that no division runs between the wait (or a selection) and the selection's loads. (Computed
  // in the loop, the first item's three divisions - 32-bit reciprocal sequences - ran after the
  // wait, ahead of the selection's loads: s41 SASS.)
  struct Item {
    int64_t pair; // (token, KV head)
    int t, g, split, rows_owned, guess;
  };
  const auto item_at = [&](int64_t item) {
    Item it;
    it.pair = pair_of(item);
    it.t = token_of(item), it.g = head_of(item), it.split = split_of(item);
    it.rows_owned = cluster_rows_owned(p.group, p.splits, it.split);
    it.guess = guessed_request(p, it.t);
    return it;
  };
  Item next{};
  if (blockIdx.x < items) {
    next = item_at(blockIdx.x);
    prefetch_selection_metadata(p, next.t, next.g, next.split, next.guess);
  }
  // The split's range of the selection is a division by p.splits once the selection is back:
  // prepared here, a multiply-high there.
  const PreparedDivisor splits_divisor(p.splits);
  // Launched to overlap the previous kernel (PDL) by SM90 plans.
  wait_for_prior_grids();
  allow_next_grid();
  M3SA_DECODE_STAMP(1);
  uint32_t parity = 0; // of cluster_bar's phase for this item
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const Item cur = next;
    const int split = cur.split, g = cur.g, t = cur.t, guess = cur.guess;
    const int64_t pair = cur.pair;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (clustered && threadIdx.x == 0) // this item's rows: a (O, m, l) slot from every split
      sm90::mbarrier_arrive_expect_tx(&cluster_bar,
                                      cur.rows_owned * p.splits * kClusterSlotBytesPushed);
#endif
    uint32_t q[8][4];
    if (item != blockIdx.x) prefetch_selection_metadata(p, t, g, split, guess); // the first: above
    // In flight during the selection's loads (unused without keys).
    if (kDecodeQueryLoad<kFp8> == QueryLoad::kBeforeSelection) load_query(p, t, g, true, q);
    select_blocks(p, t, g, guess, sel);
    M3SA_DECODE_STAMP(2);
    if (kDecodeQueryLoad<kFp8> == QueryLoad::kAfterSelection) load_query(p, t, g, true, q);
    const int position = sel.position;
    RowState st;
    st.reset();
    ColumnState columns;
    columns.reset();

    const SelectionRange range = split_selection_range(sel.count, split, splits_divisor);
    const int b_begin = range.begin, stages = 2 * (range.end - range.begin);
    const auto issue = [&](int s) {
      if (s < stages) {
        const int b = b_begin + s / 2, first_key = sel.block[b] * 128 + (s % 2) * kDecodeStageKeys;
        unsigned char* dst = smem + (s % kStages) * kRawStageBytes;
        copy_stage_rows<kFp8>(p, sel.page[b], g, (s % 2) * kDecodeStageKeys,
                              position - first_key + 1, dst, dst + kRawTileBytes);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    if (kDecodeQueryLoad<kFp8> == QueryLoad::kAfterFirstCopies) load_query(p, t, g, true, q);
    // The next item's coordinates and guess, divided while this item's first copies are in flight.
    if (item + gridDim.x < items) next = item_at(item + gridDim.x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The kernel's cluster barrier, before the first push to a peer's barrier (the finish), waited
    // for while the first copies are in flight rather than on the finish's path.
    if (clustered && item == blockIdx.x) sm90::cluster_wait();
#endif
    // e4m3, one selected block (batch 1's ranges): both stages awaited at once, then each warp
    // widens 32 consecutive K rows of one of them (warps 0-1 stage 0, warps 2-3 stage 1) into its
    // quarter of the widened tile (which holds a stage's 64 K and 64 V rows), attends their logits,
    // widens its 32 V rows into the same rows and accumulates: one pass instead of two with a CTA
    // barrier between (s40 r1: -0.12 to -0.18 us at batch 1). bf16 keeps the two passes: the
    // same pass measured 0.15-0.2 us slower there, where the first stage's MMAs overlap the second
    // stage's landing, twice the bytes of e4m3's.
    const bool one_pass = kFp8 && kDecodeOneBlockPass && stages == 2;
    if constexpr (kFp8) {
      if (one_pass) {
        cp_async_wait<0>();
        __syncthreads();
        M3SA_DECODE_STAMP(3);
        const unsigned char* stage = smem + (warp >> 1) * kRawStageBytes;
        const int key_row = (warp & 1) * 32; // of the stage
        const int last_key =
            position - (sel.block[b_begin] * 128 + (warp >> 1) * kDecodeStageKeys + key_row);
        const int lane = threadIdx.x & 31;
        unsigned char* mine = widened + warp * 32 * kRowBytes;
        widen_rows(stage + key_row * 128, mine, 32, lane, 32);
        __syncwarp();
        uint32_t p_hi[2][4], p_lo[2][4];
        key_weights<2>(st, q, PaddedRows{mine}, 0, last_key, logit_scale, p_hi, p_lo);
        __syncwarp(); // every lane's K reads are done
        widen_rows(stage + kRawTileBytes + key_row * 128, mine, 32, lane, 32);
        __syncwarp();
        accumulate_key_steps<false, 2>(st, p_hi, p_lo, PaddedRows{mine}, 0, last_key);
      }
    }
    for (int s = 0; s < (one_pass ? 0 : stages); ++s) {
      cp_async_wait<kStages - 2>();
      __syncthreads(); // stage s landed for all; stage s - 1 is free for the next copy
      if (s == 0) M3SA_DECODE_STAMP(3);
      issue(s + kStages - 1);
      unsigned char* k_tile = smem + (s % kStages) * kRawStageBytes; // by dims: then the weights
      if constexpr (kFp8) {
        widen_warp_rows(k_tile, widened, warp, threadIdx.x & 31);
        k_tile = widened;
      }
      const unsigned char* v_tile = k_tile + kDecodeStageKeys * kRowBytes;
      const int first_key = sel.block[b_begin + s / 2] * 128 + (s % 2) * kDecodeStageKeys;
      if (by_dims)
        attend_stage_by_dims(columns, q, k_tile, v_tile, position - first_key, logit_scale,
                             exchange);
      else
        attend_keys(st, q, PaddedRows{k_tile}, PaddedRows{v_tile}, warp * 16, position - first_key,
                    logit_scale);
    }
    cp_async_wait<0>();
    __syncthreads(); // the stage buffers are free for the partials
    M3SA_DECODE_STAMP(4);

    const ClusterMerge cluster{cluster_receive, &cluster_bar, parity};
    parity ^= 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (by_dims) {
      M3SA_DECODE_FINISH_STAMP(0);
      push_columns_to_cluster(p, columns, cluster.receive, cluster.bar, split);
      merge_received_rows(p, cluster.receive, cluster.bar, cluster.parity, split, t, g);
    } else
#endif
    {
      float* partials = reinterpret_cast<float*>(smem);
      store_partial<SharedPartialLayout>(st, partials + warp * kSharedPartialFloats);
      finish_decode_item(p, partials, kSharedPartialFloats * sizeof(float), cluster, pair, split, t,
                         g, &sel.last_arrival);
    }
    M3SA_DECODE_STAMP(5);
    // The selection and the buffers are reused by the next item; so are the receiving slots
    // (no plan gives a clustered CTA two items, so the fence of a release is never paid).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (clustered && item + gridDim.x < items) sm90::cluster_arrive_release(), sm90::cluster_wait();
#endif
    __syncthreads();
  }
  M3SA_DECODE_STAMPS_END(p.splits, 0);
}

// How many clusters of `cluster` CTAs (2..16) of a decode kernel the current device holds at
// once (active_clusters). Plan time only.
template <typename Params>
int decode_active_clusters(void (*kernel)(Params), int smem, int cluster) {
  return cluster > kMaxClusterSplits ? 0
                                     : active_clusters(kernel, kDecodeThreads, smem, cluster, 1);
}

// Host side of the cp.async kernel, one instantiation per translation unit
// (sparse_attention_decode_{bf16,fp8}.cu).
template <bool kFp8>
cudaError_t launch_decode_kernel(const SparseAttentionParams& p, int grid, int cluster,
                                 bool overlap_prior, cudaStream_t stream) {
  return launch_with_shared_memory(sparse_attention_decode_kernel<kFp8>, dim3(grid), kDecodeThreads,
                                   kDecodeSmemBytes<kFp8>, stream, p,
                                   LaunchOptions{cluster, overlap_prior});
}
template <bool kFp8> int decode_kernel_active_clusters(int cluster) {
  return decode_active_clusters(sparse_attention_decode_kernel<kFp8>, kDecodeSmemBytes<kFp8>,
                                cluster);
}

} // namespace m3sa::cuda
