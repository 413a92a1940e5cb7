// The dtype-independent steps of the prefill: gather the selection entries (and list the page-union
// tiles), sort them by (KV head, page) - by counting where the pass's keys are few, else with
// CUB's radix sort - and merge the per-block partials of every token.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "cuda/kernels/sparse_attention_prefill.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {

// One warp per page-union tile (KV head, kUnionTokens consecutive pass tokens): lane l resolves
// items l, l + 32, ... of the tile's kUnionTokens x top_k (token, slot) selections to pages. Where
// the plan has union tiles (union_counts), the warp lists the distinct pages, ascending, with each
// token's visible keys; a tile of at most min(kUnionPages, 2 top_k) pages, none selected twice by
// one token, attends token-major (sparse_attention_prefill_union_sm90.cuh) and its entries are
// sentinels; every other tile's (KV head, token, slot) entries are keyed by (KV head, page) for
// the block-major attend step. kItems: a lane's items, at most (top_k <= 32 kItems / kUnionTokens).
// A tile's listing is one warp's chain of ~18 rounds, each scanning every item of the lane, with
// ~14 warps an SM (s53 r3's ncu at 64/4: 7.3 cycles between a warp's instructions, 20 us a pass),
// so its length is the gather's time: top_k <= 16 gets a kernel with half kMaxSelection's items.
template <int kItems>
__global__ void gather_selection_entries_kernel(const SparseAttentionParams p) {
  constexpr uint32_t kNoPage = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int pass_tokens = p.token_end - p.token_begin;
  const int tiles_per_head = union_tiles(p);
  const int64_t tiles = int64_t{tiles_per_head} * p.kv_heads;
  const int items = kUnionTokens * p.top_k;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  // Item 32 j + lane of a tile starting at pass token `first`: its token and slot, false past the
  // tile's items or the pass.
  const auto item = [&](int first, int j, int& token, int& slot) {
    const int i = 32 * j + lane;
    token = first + i / p.top_k, slot = i % p.top_k;
    return i < items && token < pass_tokens;
  };
  for (int64_t tile = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; tile < tiles;
       tile += warps) {
    const int g = static_cast<int>(tile / tiles_per_head);
    const int first = static_cast<int>(tile % tiles_per_head) * kUnionTokens;
    uint32_t page[kItems];
    int visible[kItems];
    uint64_t share[kItems]; // visible in the byte of the item's token: its share of a page's bytes
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      int token, slot;
      page[j] = kNoPage, visible[j] = 0, share[j] = 0;
      if (!item(first, j, token, slot)) continue;
      const int t = p.token_begin + token;
      const int request = request_of_token(p.cu_q_lens, p.num_requests, t);
      // A bad position is flagged once per token, by slot 0 of head 0.
      const int position = token_position(p, request, t, slot == 0 && g == 0);
      const int32_t block = p.topk[g * p.topk_stride_head + int64_t{t} * p.topk_stride_token +
                                   slot * p.topk_stride_k];
      const int64_t selected = selected_page(p, request, position, block);
      if (selected >= 0)
        page[j] = static_cast<uint32_t>(selected),
        visible[j] = min(128, position - block * 128 + 1),
        share[j] = uint64_t(visible[j]) << (8 * (token - first));
    }
    int count = -1; // the tile's union size; -1: block-major
    if (p.union_counts) {
      const int limit = min(kUnionPages, 2 * p.top_k);
      // A lower bound of the union's size first: its pages' distinct hashes. Above the
      // limit (random selections: ~all 8 x top_k items distinct), the listing below would end
      // there after `limit` latency-bound rounds (s51 r3: 16-45 us a pass at S >= 32K).
      uint64_t hashes = 0;
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        if (page[j] != kNoPage) hashes |= uint64_t{1} << union_page_hash(page[j]);
      hashes = uint64_t{__reduce_or_sync(0xffffffffu, static_cast<uint32_t>(hashes))} |
               uint64_t{__reduce_or_sync(0xffffffffu, static_cast<uint32_t>(hashes >> 32))} << 32;
      // The list ascends, so the items not yet listed are those above the last listed page.
      uint32_t floor = 0;
      for (count = __popcll(hashes) > limit ? -1 : 0; count >= 0; ++count) {
        uint32_t next = kNoPage;
#pragma unroll
        for (int j = 0; j < kItems; ++j) next = min(next, page[j] >= floor ? page[j] : kNoPage);
        next = __reduce_min_sync(0xffffffffu, next); // one REDUX: this loop is latency-bound
        if (next == kNoPage) break;                  // every selected page listed
        floor = next + 1;
        uint64_t bytes = 0; // byte k: visible keys of the tile's token k
        int matches = 0;
#pragma unroll
        for (int j = 0; j < kItems; ++j)
          if (page[j] == next) bytes |= share[j], ++matches;
        bytes = uint64_t{__reduce_or_sync(0xffffffffu, static_cast<uint32_t>(bytes))} |
                uint64_t{__reduce_or_sync(0xffffffffu, static_cast<uint32_t>(bytes >> 32))} << 32;
        matches = static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<uint32_t>(matches)));
        // The tile's tokens that selected the page: its nonzero bytes (0xff each in vcmpne4).
        static_assert(kUnionTokens == 8, "a byte a token, in two words");
        const uint32_t low = static_cast<uint32_t>(bytes),
                       high = static_cast<uint32_t>(bytes >> 32);
        const int tokens = (__popc(__vcmpne4(low, 0u)) + __popc(__vcmpne4(high, 0u))) / 8;
        // Too many pages, or a page a token selected twice (two slots, one page: block-major
        // attends it twice, as the contract's per-slot sum does).
        if (count == limit || matches != tokens) {
          count = -1;
          break;
        }
        if (lane == 0) {
          p.union_pages[tile * kUnionPages + count] = next;
          p.union_visible[tile * kUnionPages + count] = bytes;
        }
      }
      if (lane == 0) {
        p.union_counts[tile] = count;
        // A store, not a count: a random pass sends every tile block-major, and a store needs no
        // atomic (s53 r1: with a count's atomics, 16/1's random cases took 2-6 us longer).
        if (count < 0 && p.block_major_flag) *p.block_major_flag = 1u;
        if (count >= 0) {
          const int bucket = union_size_bucket(count);
          p.union_listed[bucket * tiles + atomicAdd(p.union_queue + bucket, 1u)] =
              static_cast<uint32_t>(tile);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      int token, slot;
      if (!item(first, j, token, slot)) continue;
      const int64_t index = (int64_t{g} * pass_tokens + token) * p.top_k + slot;
      if (count < 0 && page[j] != kNoPage) {
        uint32_t key = static_cast<uint32_t>(g * p.num_pages + page[j]);
        if (p.key_tokens) { // the counting sort: the token's bit in the key's bitmap
          const uint32_t bit = 1u << (token & 31);
          if (atomicOr(p.key_tokens + int64_t{key} * p.token_words + token / 32, bit) & bit) {
            atomicAdd(p.key_repeats + key, 1u);
            key |= kRepeatedEntry;
          }
        }
        p.entry_keys[index] = key;
        p.entry_values[index] = pack_entry(token, slot, visible[j]);
      } else {
        p.entry_keys[index] = p.entry_sentinel; // sorts last
        p.entry_values[index] = 0;
        if (count < 0) { // every row's max -inf: the merge skips this slot unread
          // Four 16-byte stores, not sixteen scattered ones: the first 2K tokens of a chunk at
          // prefix 0 pad about half their slots (s48 r4: the gather took 28 us at 16/1 S=8K,
          // 8 us without padding).
          float4* m =
              reinterpret_cast<float4*>(CompactPartialView(prefill_partial(p, token, g, slot)).m);
#pragma unroll
          for (int r = 0; r < kAttentionRows / 4; ++r)
            m[r] = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
      }
    }
  }
}

// The counting sort's ranks: a warp a key scans the popcounts of its token bitmap's words, so that
// an entry's rank within its key is its word's rank plus the set bits below its token's.
__global__ void __launch_bounds__(256) rank_key_tokens_kernel(const SparseAttentionParams p) {
  const int lane = threadIdx.x & 31;
  const int key = static_cast<int>((blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32);
  if (key >= p.key_space || every_tile_token_major(p)) return; // the whole warp
  const uint32_t* words = p.key_tokens + int64_t{key} * p.token_words;
  uint32_t* ranks = p.key_token_ranks + int64_t{key} * p.token_words;
  uint32_t before = 0;
  for (int base = 0; base < p.token_words; base += 32) {
    const int w = base + lane;
    const uint32_t n = w < p.token_words ? __popc(words[w]) : 0u;
    uint32_t inclusive = n;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t other = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += other;
    }
    if (w < p.token_words) ranks[w] = before + inclusive - n;
    before += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  if (lane == 0) p.key_totals[key] = before + p.key_repeats[key];
}

// The counting sort's placement. Every CTA scans the keys' totals into its own shared memory -
// each key's first sorted position; the CTAs' scans agree, so none waits for another - then
// places a grid-stride share of the entries: at its key's start plus its token's rank, so a key's
// entries keep token order (CUB's stable order), and the rare repeated ones after them, in the
// order of their atomics. CTA 0 writes how many entries are live.
struct ScatterEntriesParams {
  SparseAttentionParams attention;
  uint32_t* sorted_keys;   // [entry_count]
  uint32_t* sorted_values; // [entry_count]
};
__global__ void __launch_bounds__(kScatterThreads)
    scatter_selection_entries_kernel(const __grid_constant__ ScatterEntriesParams params) {
  const SparseAttentionParams& p = params.attention;
  if (every_tile_token_major(p)) { // no live entry: skip the totals' scan too
    if (blockIdx.x == 0 && threadIdx.x == 0) *p.live_entries = 0;
    return;
  }
  constexpr int kPerThread = 8;
  constexpr int kTile = kScatterThreads * kPerThread;
  using Scan = cub::BlockScan<uint32_t, kScatterThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  extern __shared__ uint32_t key_start[]; // [key_space]
  uint32_t live = 0;                      // totals of the keys scanned so far
  for (int base = 0; base < p.key_space; base += kTile) {
    const int first = base + threadIdx.x * kPerThread;
    uint32_t totals[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      totals[i] = first + i < p.key_space ? p.key_totals[first + i] : 0u;
    uint32_t tile_live;
    Scan(scan_storage).ExclusiveSum(totals, totals, tile_live);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (first + i < p.key_space) key_start[first + i] = live + totals[i];
    live += tile_live;
    __syncthreads(); // scan_storage is reused; key_start complete
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.live_entries = static_cast<int32_t>(live);
  for (int64_t i = blockIdx.x * int64_t{kScatterThreads} + threadIdx.x; i < p.entry_count;
       i += int64_t{gridDim.x} * kScatterThreads) {
    const uint32_t entry_key = p.entry_keys[i];
    if (entry_key == p.entry_sentinel) continue;
    const uint32_t key = entry_key & ~kRepeatedEntry, value = p.entry_values[i];
    uint32_t at = key_start[key];
    if (entry_key & kRepeatedEntry) {
      at +=
          p.key_totals[key] - p.key_repeats[key] + atomicAdd(p.key_repeats + p.key_space + key, 1u);
    } else {
      const int token = entry_token(value);
      const int64_t w = int64_t{key} * p.token_words + token / 32;
      at += p.key_token_ranks[w] + __popc(p.key_tokens[w] & ((1u << (token & 31)) - 1u));
    }
    params.sorted_keys[at] = key;
    params.sorted_values[at] = value;
  }
}

// One 128-thread group per (pass token, KV head), kMergeTokenPartialsCtasPerSm an SM, each thread
// with the loads of kMergeBatch partials in flight (56 registers: 9 groups an SM).
constexpr int kMergeBatch = 2;
__global__ void __launch_bounds__(128, kMergeTokenPartialsCtasPerSm)
    merge_token_partials_kernel(const SparseAttentionParams p) {
  // Every tile token-major (structured selections): nothing to merge (s51 r2: a pass's 32K pairs
  // took 9 us to skip one by one).
  if (every_tile_token_major(p)) return;
  const int pass_tokens = p.token_end - p.token_begin;
  const int64_t pairs = int64_t{pass_tokens} * p.kv_heads;
  for (int64_t pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
    const int g = static_cast<int>(pair % p.kv_heads), token = static_cast<int>(pair / p.kv_heads);
    if (p.union_counts && p.union_counts[g * union_tiles(p) + token / kUnionTokens] >= 0)
      continue; // its tile attended token-major
    store_output_row(p,
                     merge_compact_rows<kMergeBatch>(prefill_partial(p, token, g, 0),
                                                     kCompactPartialBytes, p.top_k, threadIdx.x),
                     p.token_begin + token, g, threadIdx.x);
  }
}

// The union tiles' V in fp16, once a pass, before the page-union kernel (attention_params.h
// kUnionValueCells), in two kernels:
// - claim_union_value_cells_kernel, a warp a tile, lane i its entry i: each (KV head, page) takes
//   the first free cell from its hash on (atomicCAS), and the entries that name it find it there;
// - convert_union_values_kernel, a CTA a claimed cell (read back from the keys): its page's 128
//   keys x 128 dims of bf16 V to fp16 in one round of loads (eight 16-byte chunks a thread), and
//   the cell's form - fp16 where the page's largest |v| lies in [2^-6, 65280], else the union
//   kernel reads bf16 V and splits P for it.
// The whole page goes, keys past any token's visible ones too (the union kernel zeroes those rows
// in shared memory), so that a page's form does not depend on which tile names it: an engine's
// stale rows past a sequence's end may send its last page to bf16.
// Why a kernel of its own: converted in the union kernel's relay, per page and tile, the
// conversion lay on the consumers' path (bench/NOTES.md s55 r2: +66 %). Why two: converted by
// the warp whose lane took the cell, the first warps to run took most pages and converted them
// one after another, eight round trips a page (s56 r1: +155 us over no conversion at 16/1
// S=128K, +365 us at 64/4 S=8K with at most 256 pages); a CTA a page reads each in one round and
// the pass's pages (~1,000 at 16/1 S=128K: 64 MB read and written) at the copy rate.
__global__ void claim_union_value_cells_kernel(const SparseAttentionParams p) {
  const int lane = threadIdx.x & 31;
  const int tiles_per_head = union_tiles(p);
  const int64_t tiles = int64_t{tiles_per_head} * p.kv_heads;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t tile = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; tile < tiles;
       tile += warps) {
    const int count = p.union_counts[tile];
    if (count <= 0 || lane >= count) continue; // block-major, or no page
    const int g = static_cast<int>(tile / tiles_per_head);
    const uint32_t page = p.union_pages[tile * kUnionPages + lane];
    // Below 2^32 - 1: the plan bounds kv_heads x num_pages by the sort's 32-bit keys.
    const uint32_t key = static_cast<uint32_t>(int64_t{g} * p.num_pages + page) + 1u;
    uint32_t at = union_value_cell_hash(key), cell = kNoValueCell;
    for (int probe = 0; probe < kUnionValueProbes; ++probe) {
      const uint32_t held = atomicCAS(p.union_value_keys + at, 0u, key);
      if (held == 0u || held == key) {
        cell = at;
        break;
      }
      at = (at + 1) % kUnionValueCells;
    }
    p.union_value_cells[tile * kUnionPages + lane] = cell;
  }
}

inline constexpr int kConvertValuesThreads = 256; // x 8 chunks of 16 bytes: a 32 KB page
__global__ void __launch_bounds__(kConvertValuesThreads)
    convert_union_values_kernel(const SparseAttentionParams p) {
  __shared__ uint32_t warp_largest[kConvertValuesThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int c = blockIdx.x; c < kUnionValueCells; c += gridDim.x) {
    const uint32_t key = p.union_value_keys[c];
    if (key == 0u) continue; // free: no listed entry named it (uniform over the CTA)
    const int64_t g = (key - 1u) / static_cast<uint32_t>(p.num_pages);
    const int64_t page = (key - 1u) % static_cast<uint32_t>(p.num_pages);
    const uint16_t* v =
        static_cast<const uint16_t*>(p.v_cache) + page * p.v_stride_page + g * p.v_stride_head;
    uint16_t* out = static_cast<uint16_t*>(p.union_values) + int64_t{c} * 128 * 128;
    // 2,048 16-byte chunks (key i / 16, dims 8 (i % 16) ..); the rows are 16-byte aligned
    // wherever the plan took the TMA path (its maps need it).
    uint4 w[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = threadIdx.x + kConvertValuesThreads * u;
      w[u] = *reinterpret_cast<const uint4*>(v + (i >> 4) * p.v_stride_token + (i & 15) * 8);
    }
    uint32_t largest = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = threadIdx.x + kConvertValuesThreads * u;
      largest = __vmaxu2(largest, __vmaxu2(w[u].x & 0x7fff7fffu, w[u].y & 0x7fff7fffu));
      largest = __vmaxu2(largest, __vmaxu2(w[u].z & 0x7fff7fffu, w[u].w & 0x7fff7fffu));
      *reinterpret_cast<uint4*>(out + (i >> 4) * 128 + (i & 15) * 8) =
          make_uint4(bf16x2_to_half2(w[u].x), bf16x2_to_half2(w[u].y), bf16x2_to_half2(w[u].z),
                     bf16x2_to_half2(w[u].w));
    }
    largest = __reduce_max_sync(0xffffffffu, max(largest >> 16, largest & 0xffffu));
    if (lane == 0) warp_largest[warp] = largest;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < kConvertValuesThreads / 32; ++k)
        largest = max(largest, warp_largest[k]);
      p.union_value_forms[c] = largest >= kHalfValuesLeast && largest <= kHalfValuesMost;
    }
    __syncthreads(); // warp_largest is rewritten for the next cell
  }
}

cudaError_t launch_convert_union_values(const SparseAttentionParams& p, int grid,
                                        cudaStream_t s) {
  claim_union_value_cells_kernel<<<grid, kGatherThreads, 0, s>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // Enough CTAs to stream: a cell each where the pass names as many pages, up to every cell.
  convert_union_values_kernel<<<kUnionValueCells / 4, kConvertValuesThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_gather_selection_entries(const SparseAttentionParams& p, int grid,
                                            cudaStream_t s) {
  constexpr int kLaneItems = kUnionTokens * kMaxSelection / 32;
  if (p.top_k <= kMaxSelection / 2)
    gather_selection_entries_kernel<kLaneItems / 2><<<grid, kGatherThreads, 0, s>>>(p);
  else
    gather_selection_entries_kernel<kLaneItems><<<grid, kGatherThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t selection_sort_temp_bytes(int entries, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceRadixSort::SortPairs(
      nullptr, *bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), entries, 0, 32);
}

cudaError_t sort_selection_entries(const SparseAttentionParams& p, uint32_t* sorted_keys,
                                   uint32_t* sorted_values, int key_bits, void* temp,
                                   size_t temp_bytes, cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, p.entry_keys, sorted_keys,
                                         p.entry_values, sorted_values, p.entry_count, 0, key_bits,
                                         s);
}

cudaError_t sort_selection_entries_by_counting(const SparseAttentionParams& p,
                                               uint32_t* sorted_keys, uint32_t* sorted_values,
                                               int grid, cudaStream_t s) {
  if (!counting_sort_fits(p.key_space, p.token_words)) return cudaErrorInvalidValue;
  rank_key_tokens_kernel<<<(p.key_space + 7) / 8, 256, 0, s>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return launch_with_shared_memory(scatter_selection_entries_kernel, dim3(grid), kScatterThreads,
                                   static_cast<int>(p.key_space * sizeof(uint32_t)), s,
                                   ScatterEntriesParams{p, sorted_keys, sorted_values});
}

cudaError_t launch_merge_token_partials(const SparseAttentionParams& p, int grid, cudaStream_t s) {
  merge_token_partials_kernel<<<grid, 128, 0, s>>>(p);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
