#pragma once
// Sparse attention for prefill rows, block-major (docs/contract.md, "Sparse attention").
//
// A prefill chunk's tokens select blocks that overlap (every token of a query block shares its
// local block; short contexts and heavy-hitter blocks are selected by most tokens), and what
// bounds a token-major kernel is the K and V bytes it reads: 2048 keys x 512 B per token and KV
// head. So the chunk is turned around, in passes of up to `pass_tokens` tokens:
//   1. gather_selection_entries: one entry per (KV head, token, slot) that holds a visible block,
//      keyed by (KV head, page) - bad metadata is flagged here and dropped;
//   2. a stable sort groups the entries of each (KV head, page): on sm90 plans with few keys by
//      counting (the gather marks each token in its key's bitmap, rank_key_tokens and
//      scatter_selection_entries place it at its rank), else CUB's radix sort;
//   3. attend_block_members: CTAs stride over runs of 64 sorted entries; for each distinct
//      (head, page) in its run a CTA copies the 128 keys and values once (cp.async, the next
//      page's copy in flight during this one's MMAs) and computes the softmax partial (m, l, O) of
//      every member token over that block: 8 warps, one member token per warp (16 query heads of
//      the GQA group = 16 MMA rows) when the page has 8 or more members, else the warps split the
//      128 keys between fewer members and merge in shared memory;
//   4. merge_token_partials: one 128-thread group per (token, KV head) merges its (up to top_k)
//      partials by log-sum-exp and writes the bf16 output and lse.
// A page read once serves all its members (with an 8K chunk, hundreds per pass at 8K tokens of
// context, tens at 128K, on random selections); what a (token, block) costs instead is its
// compact partial, 4.2 KB written and read once against 64 KB of K and V read by a token-major
// kernel, plus its MMAs (bench/NOTES.md: those two now bound it).
// Keys past the largest visible key of a page's members are zero-filled, never read.
#include "cuda/kernels/attention_common.cuh"

namespace m3sa::cuda {

inline constexpr int kPrefillThreads = 256;
inline constexpr int kPrefillWarps = kPrefillThreads / 32;
template <bool kFp8>
inline constexpr int kPrefillBufferBytes = 2 * 128 * (kFp8 ? 128 : kRowBytes); // K, V of a page
template <bool kFp8>
inline constexpr int kPrefillSmemBytes = 2 * kPrefillBufferBytes<kFp8> +
                                         (kFp8 ? 2 * 128 * kRowBytes : 0) +
                                         kPrefillWarps * kPartialFloats * 4;
static_assert(kPrefillSmemBytes<false> <= 227 * 1024 && kPrefillSmemBytes<true> <= 227 * 1024,
              "one CTA per SM");

// Entry value: token within the pass (bits 13..31), slot (8..12), visible keys of the block - 1
// (0..7).
__device__ __forceinline__ uint32_t pack_entry(int token, int slot, int visible) {
  return (static_cast<uint32_t>(token) << 13) | (static_cast<uint32_t>(slot) << 8) |
         static_cast<uint32_t>(visible - 1);
}
__device__ __forceinline__ int entry_token(uint32_t v) { return static_cast<int>(v >> 13); }
__device__ __forceinline__ int entry_slot(uint32_t v) { return (v >> 8) & 31; }
__device__ __forceinline__ int entry_visible(uint32_t v) { return static_cast<int>(v & 255) + 1; }

// Sorted entries the attend step reads: the live ones where the pass sorted by counting (the
// rest of the buffer is stale), else all of them (sentinels last).
__device__ __forceinline__ int sorted_entries(const SparseAttentionParams& p) {
  return p.live_entries ? min(*p.live_entries, p.entry_count) : p.entry_count;
}

// True where the pass's gather listed every tile (none went block-major): every entry is a
// sentinel, so the counting sort and the merge have nothing to do.
__device__ __forceinline__ bool every_tile_token_major(const SparseAttentionParams& p) {
  return p.block_major_flag != nullptr && *p.block_major_flag == 0;
}

// Page-union tiles of a KV head in the pass.
__device__ __forceinline__ int union_tiles(const SparseAttentionParams& p) {
  return union_tiles_of(p.token_end - p.token_begin);
}

// Compact partial of (pass token, KV head, slot).
__device__ __forceinline__ unsigned char* prefill_partial(const SparseAttentionParams& p, int token,
                                                          int g, int slot) {
  return p.prefill_partials +
         ((int64_t{token} * p.kv_heads + g) * p.top_k + slot) * kCompactPartialBytes;
}

template <bool kFp8>
__global__ void __launch_bounds__(kPrefillThreads, 1)
    attend_block_members_kernel(const SparseAttentionParams p) {
  constexpr int kBufferBytes = kPrefillBufferBytes<kFp8>;
  constexpr int kRawTileBytes = kBufferBytes / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* widened = smem + 2 * kBufferBytes; // fp8 only
  float* warp_partials =
      reinterpret_cast<float*>(smem + 2 * kBufferBytes + (kFp8 ? 2 * 128 * kRowBytes : 0));
  __shared__ int32_t run_begin[kRunEntries + 1];
  __shared__ int32_t run_visible[kRunEntries];
  __shared__ int32_t run_count;
  const int warp = threadIdx.x >> 5;
  const float logit_scale = logit_scale_log2(p.k_scale);
  const int entries = sorted_entries(p);
  const int64_t items = (int64_t{entries} + kRunEntries - 1) / kRunEntries;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t base = item * kRunEntries;
    const int n = static_cast<int>(min(int64_t{kRunEntries}, int64_t{entries} - base));
    const uint32_t* keys = p.sorted_keys + base;
    const uint32_t* values = p.sorted_values + base;
    if (threadIdx.x < 32) { // runs of equal keys (one page of one head each); sentinels last
      const int lane = threadIdx.x;
      int count = 0, valid_total = 0;
      for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + lane;
        const uint32_t key = i < n ? keys[i] : p.entry_sentinel;
        const bool valid = key != p.entry_sentinel;
        const bool head = valid && (i == 0 || keys[i - 1] != key);
        const unsigned heads = __ballot_sync(0xffffffffu, head);
        if (head) run_begin[count + __popc(heads & ((1u << lane) - 1))] = i;
        if (valid) run_visible[i] = entry_visible(values[i]);
        count += __popc(heads);
        valid_total += __popc(__ballot_sync(0xffffffffu, valid));
      }
      if (lane == 0) run_begin[count] = valid_total, run_count = count;
    }
    __syncthreads();
    const int runs = run_count;
    if (runs == 0) break; // sentinels sort last: every later item is empty too
    // Rows each run must copy: its members' largest visible key count.
    const auto run_rows = [&](int r) {
      int rows = 0;
      for (int i = run_begin[r]; i < run_begin[r + 1]; ++i) rows = max(rows, run_visible[i]);
      return rows;
    };
    const auto issue = [&](int r) {
      if (r < runs) {
        const uint32_t key = keys[run_begin[r]];
        const int g = static_cast<int>(key / p.num_pages);
        const int64_t page = key % p.num_pages;
        unsigned char* dst = smem + (r % 2) * kBufferBytes;
        copy_kv_rows<kFp8>(p, page, g, 0, 128, run_rows(r), dst, dst + kRawTileBytes, threadIdx.x,
                           kPrefillThreads);
      }
      cp_async_commit();
    };
    issue(0);
    for (int r = 0; r < runs; ++r) {
      cp_async_wait<0>();
      __syncthreads(); // page r landed; the other buffer (page r - 1) is free
      issue(r + 1);
      const unsigned char* k_tile = smem + (r % 2) * kBufferBytes;
      if constexpr (kFp8) {
        widen_rows(k_tile, widened, 256, threadIdx.x, kPrefillThreads);
        __syncthreads();
        k_tile = widened;
      }
      const unsigned char* v_tile = k_tile + 128 * kRowBytes;
      const int g = static_cast<int>(keys[run_begin[r]] / p.num_pages);
      const int members = run_begin[r + 1] - run_begin[r];
      // Warps per member: 1 when the page has 8 members or more, else up to 8 sharing the keys.
      const int groups = members >= 8 ? 8 : (members >= 4 ? 4 : (members >= 2 ? 2 : 1));
      const int warps_per_member = kPrefillWarps / groups;
      const int keys_per_warp = 128 / warps_per_member;
      const int group = warp / warps_per_member, slice = warp % warps_per_member;
      for (int round = 0; round * groups < members; ++round) {
        const int member = round * groups + group;
        const bool live = member < members;
        const uint32_t value = live ? values[run_begin[r] + member] : 0u;
        const int token = entry_token(value), visible = live ? entry_visible(value) : 0;
        uint32_t q[8][4];
        load_query(p, p.token_begin + token, g, live, q);
        RowState st;
        st.reset();
        for (int c = slice * keys_per_warp; c < (slice + 1) * keys_per_warp && c < visible; c += 16)
          attend_keys(st, q, k_tile, v_tile, c, visible - 1, logit_scale);
        if (warps_per_member == 1) {
          if (live) store_compact_partial(st, prefill_partial(p, token, g, entry_slot(value)));
        } else {
          store_partial(st, warp_partials + warp * kPartialFloats);
          __syncthreads();
          // 128 threads per member merge its warps' partials.
          for (int m = threadIdx.x / 128; m < groups && round * groups + m < members;
               m += kPrefillThreads / 128) {
            const uint32_t v = values[run_begin[r] + round * groups + m];
            store_merged_compact_partial(
                merge_rows<false>(warp_partials + m * warps_per_member * kPartialFloats,
                                  kPartialFloats * sizeof(float), warps_per_member,
                                  threadIdx.x % 128),
                prefill_partial(p, entry_token(v), g, entry_slot(v)), threadIdx.x % 128);
          }
          __syncthreads();
        }
      }
    }
    __syncthreads(); // the run list and buffers are reused by the next item
  }
}

} // namespace m3sa::cuda
