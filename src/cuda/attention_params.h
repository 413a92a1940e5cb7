#pragma once
// Plain parameter struct of the CUDA sparse attention kernels (host- and device-includable, no
// CUDA headers). Strides are in elements. Lengths, selections and block tables are read on the
// device; only capacities and the live token counts travel as values, so a captured graph replays
// on rewritten metadata and caches.
#include <cstdint>

#include "common/host_device.h"

namespace m3sa::cuda {

// One split's or one warp's share of a (token, KV head) row group before the log-sum-exp merge:
// the running max m (log2 domain, scaled logits), the denominator l and the unnormalised output.
inline constexpr int kAttentionRows = 16; // query heads of one GQA group per MMA tile (padded)
inline constexpr int kPartialFloats = 2 * kAttentionRows + kAttentionRows * 128; // m, l, O
// The prefill's partials, one per (token, KV head, selected block): m, l and a per-row power-of-two
// scale in fp32, O / scale in 16-bit fixed point (attention_common.cuh, CompactPartialView).
inline constexpr int kCompactPartialBytes = 3 * kAttentionRows * 4 + kAttentionRows * 128 * 2;
// Resident CTAs per SM (the kernel's launch bounds; its shared memory allows two): the persistent
// grid and the plan's split and workspace sizes follow from it.
inline constexpr int kAttentionCtasPerSm = 2;
inline constexpr int kMaxSelection = 32;   // top_k limit (config.h kMaxTopK)
inline constexpr int kGatherThreads = 256; // the prefill's entry gather: a warp per union tile
inline constexpr int kRunEntries = 64; // the prefill's attend step: sorted entries per work item
// The prefill sorts a pass's entries by counting where its keys (KV head x page) number at most
// kCountingSortBins and their token bitmaps (a bit a pass token) at most kCountingSortWords words:
// the gather sets each entry's token bit, a warp a key ranks its words, and every CTA of the
// scatter scans the keys' totals in shared memory (64 KB) and places each entry at its token's
// rank - stable, as CUB's radix sort (a key's members in token order: an unstable order cost the
// attend step up to 3.5 %, s52 r1) - in a memset and two small kernels, where CUB takes three
// kernels whatever the entries hold (s51 r2: 24 us a pass of sentinels). Larger pools: CUB.
inline constexpr int kCountingSortBins = 16384;
inline constexpr int64_t kCountingSortWords = int64_t{1} << 21;
inline constexpr int kScatterThreads = 512;
// Words of a key's token bitmap in a pass of `tokens` tokens (a bit a token).
M3SA_HOST_DEVICE constexpr int64_t token_bitmap_words(int64_t tokens) { return (tokens + 31) / 32; }
// Words zeroed before a counting-sort pass's gather, in this order: the keys' repeats and cursors
// (2 keys), their token bitmaps (bitmap_words in all), the block-major flag (1) and the union
// queue (kUnionQueueWords).
inline constexpr int kUnionQueueWords = 33; // a count per union size (kUnionPages), the claims
M3SA_HOST_DEVICE constexpr int64_t counting_zeroed_words(int64_t keys, int64_t bitmap_words) {
  return 2 * keys + bitmap_words + 1 + kUnionQueueWords;
}
// Whether the counting sort's buffers hold `keys` keys with bitmaps of `token_words` words: 1 to
// kCountingSortBins keys, kCountingSortWords words in all.
M3SA_HOST_DEVICE constexpr bool counting_sort_fits(int64_t keys, int64_t token_words) {
  return keys >= 1 && keys <= kCountingSortBins && keys * token_words <= kCountingSortWords;
}
// Whether a prefill pass of `pass_tokens` tokens sorts its entries by counting (else with CUB): on
// the wgmma attend step only (the mma.sync one splits a page's keys between warps by its member
// count, so the order of a key's repeated entries, their atomics', would change its outputs run to
// run), where the keys (KV heads x pool pages) and their bitmaps fit. Plain host arithmetic,
// checked on the CPU (tests/unit/prefill_passes_test.cpp).
constexpr bool prefill_sorts_by_counting(bool wgmma_attend, int64_t kv_heads, int64_t num_pages,
                                         int64_t pass_tokens) {
  return wgmma_attend && counting_sort_fits(kv_heads * num_pages, token_bitmap_words(pass_tokens));
}
// An entry whose token names its page a second time (two slots, one page: block-table aliasing):
// the counting sort places it after the key's first ones.
inline constexpr uint32_t kRepeatedEntry = 1u << 31;
// The prefill's page-union tiles (sm90): 8 consecutive tokens of a pass and one KV head whose
// selections together name at most kUnionPages distinct pages (and at most 2 top_k) attend
// token-major over that union instead of block-major (sparse_attention_prefill_union_sm90.cuh).
inline constexpr int kUnionTokens = 8;
inline constexpr int kUnionPages = 32;
static_assert(kUnionQueueWords == kUnionPages + 1, "a queue count per union size, and the claims");
// The union queue's bucket of a listed tile of `count` pages: the largest unions first (bucket 0:
// kUnionPages pages), an empty union with the 1-page ones.
M3SA_HOST_DEVICE constexpr int union_size_bucket(int count) {
  return kUnionPages - (count > 1 ? count : 1);
}
// Page-union tiles that `tokens` consecutive pass tokens make, for one KV head (the host sizes
// the lists with it, the kernels map tiles to tokens with it).
template <typename T> M3SA_HOST_DEVICE constexpr T union_tiles_of(T tokens) {
  return (tokens + kUnionTokens - 1) / kUnionTokens;
}

// The union tiles' V in fp16, converted once a pass (sparse_attention_prefill_entries.cu): a cell per
// distinct (KV head, page) that the pass's listed tiles name, found by linear probing from the
// key's hash, at most kUnionValueProbes cells on; an entry that finds no cell keeps bf16 V. 4,096
// cells (128 MB of fp16 pages) hold the ~1,000 pages of a 16/1 pass at S=128K and the ~2,600 a
// 64/4 pass names there.
inline constexpr int kUnionValueCells = 4096;
// A page's V goes to fp16 where its values' largest magnitude lies in [2^-6, 65280] (as bf16 bit
// patterns without the sign, which order as the magnitudes do; NaN and infinity lie above): 65280
// is the largest bf16 value below fp16's 65504, fp16 holds every |v| >= 2^-17 exactly (bf16's 8
// significant bits), and from 2^-6 on the 2^-25 by which it may round a smaller value is at most
// 2^-19 of the page's largest.
inline constexpr uint32_t kHalfValuesLeast = 0x3c80u; // 2^-6
inline constexpr uint32_t kHalfValuesMost = 0x477fu;  // 65280
inline constexpr int kUnionValueProbes = 32;
inline constexpr uint32_t kNoValueCell = 0xffffffffu;
M3SA_HOST_DEVICE constexpr uint32_t union_value_cell_hash(uint32_t key) {
  return (key * 2654435761u) >> 20; // 12 bits: kUnionValueCells
}
static_assert(kUnionValueCells == 1 << 12, "the hash's 12 bits");

// A page's 6-bit hash: the gather bounds a tile's union from below by its pages' distinct hashes
// and goes block-major without listing where that bound already exceeds the limit (the GPU tests
// build pages with spread and with shared hashes from it).
M3SA_HOST_DEVICE constexpr uint32_t union_page_hash(uint32_t page) {
  return (page * 2654435761u) >> 26;
}

// Prefill rows run in passes whose compact partials (every (token, KV head, slot)) fit 1.125 GiB
// of workspace: 4,401 tokens at 4 KV heads and top_k 16 (M3 at TP1), so that an 8K chunk takes
// two passes rather than three - a pass costs ~50 us besides its attention (gather, sort, merge),
// and a third pass of a few hundred tokens left most SMs idle (bench/NOTES.md s15 r4). Plain host
// arithmetic, checked on the CPU (tests/unit/prefill_passes_test.cpp).
inline constexpr int64_t kPrefillPartialBudget = int64_t{9} << 27;
// Tokens a pass may hold: at least 1, at most the plan's max_tokens.
constexpr int32_t prefill_pass_capacity(int64_t kv_heads, int64_t top_k, int64_t max_tokens) {
  const int64_t fit = kPrefillPartialBudget / (kv_heads * top_k * kCompactPartialBytes);
  const int64_t cap = max_tokens > 1 ? max_tokens : 1;
  return static_cast<int32_t>(fit < 1 ? 1 : fit > cap ? cap : fit);
}
// Tokens of each pass (the last may hold fewer) when `rows` > 0 prefill rows run in passes of at
// most `capacity`: as few passes as fit, split evenly, so that none is a short tail whose attention
// occupies a fraction of the SMs, and rounded up to whole page-union tiles (kUnionTokens), so that
// every pass's tiles keep the first pass's grid (tiles are counted from a pass's first token).
constexpr int32_t prefill_pass_tokens(int64_t rows, int32_t capacity) {
  const int64_t passes = (rows + capacity - 1) / capacity;
  const int64_t even = (rows + passes - 1) / passes;
  const int64_t whole_tiles = union_tiles_of(even) * kUnionTokens;
  return static_cast<int32_t>(whole_tiles < capacity ? whole_tiles : capacity);
}

// How the splits of a (token, KV head) merge their partials (log-sum-exp).
enum SplitMerge : int32_t {
  // Each CTA writes its partial to `partials`; the last to arrive (`arrivals`) merges them.
  kMergeByLastArrival = 0,
  // The splits are the CTAs of one cluster (launched with cluster size `splits`) and merge
  // through distributed shared memory.
  kMergeInCluster = 1,
  // Each CTA writes its partial to `partials` and exits; merge_decode_splits_kernel, launched
  // next in the stream, merges them.
  kMergeByNextKernel = 2,
};

struct SparseAttentionParams {
  const void* q; // [T, Hq, 128] bf16
  int64_t q_stride_token, q_stride_head;
  const void* k_cache; // [num_pages, 128, Hkv, 128] bf16 or e4m3 (strided: combined K|V works)
  int64_t k_stride_page, k_stride_token, k_stride_head;
  const void* v_cache; // [num_pages, 128, Hkv, 128], k_cache's dtype
  int64_t v_stride_page, v_stride_token, v_stride_head;
  int64_t num_pages;
  float k_scale, v_scale;
  const int32_t* topk; // [Hkv, T, K] ascending logical block ids, -1 padded
  int64_t topk_stride_head, topk_stride_token, topk_stride_k;
  const int32_t* cu_q_lens;   // [R + 1]
  const int32_t* seq_lens;    // [R]
  const int32_t* block_table; // [R, width] logical block -> KV page (kv_block_table or the index's)
  int64_t block_table_stride;
  int32_t block_table_width;
  int32_t num_requests;
  int32_t decode_q_len;           // decode rows: token t belongs to request t / decode_q_len
  int32_t token_begin, token_end; // packed tokens this launch serves
  int32_t kv_heads, group, top_k;
  int32_t splits;      // selection ranges per (token, KV head); > 1 merges them (log-sum-exp)
  int32_t split_merge; // SplitMerge: how splits > 1 merge
  void* out;           // [T, Hq, 128] bf16
  int64_t out_stride_token, out_stride_head;
  float* lse; // [T, Hq] f32 natural log, or null
  int64_t lse_stride_token, lse_stride_head;
  float* partials;   // [(token_end - token_begin) * Hkv * splits, kPartialFloats] when splits > 1
  int32_t* arrivals; // [(token_end - token_begin) * Hkv] zero on entry, left zero on exit
                     // (kMergeByLastArrival)
  int32_t* error_flags; // [1]
  // Prefill (block-major) pass over tokens [token_begin, token_end): one entry per
  // (KV head, token, slot), keyed by KV head * num_pages + page (entry_sentinel: no visible block).
  uint32_t* entry_keys;            // [entry_count]
  uint32_t* entry_values;          // [entry_count] token in the pass, slot, visible keys
  const uint32_t* sorted_keys;     // [entry_count] entry_keys sorted
  const uint32_t* sorted_values;   // [entry_count]
  int32_t entry_count;             // (token_end - token_begin) * Hkv * top_k
  uint32_t entry_sentinel;         // 2^key_bits - 1, above every key
  // The counting sort (null key_tokens: CUB's radix sort). The gather sets bit t % 32 of word
  // t / 32 of its key's bitmap for pass token t (a repeated token's entry is keyed | kRepeatedEntry
  // and counted in key_repeats); rank_key_tokens writes each word's rank (the key's set bits
  // before it) and each key's total; the scatter places the live entries, sorted, and writes how
  // many there are (the attend step reads no further).
  uint32_t* key_tokens;            // [key_space, token_words] zero before the gather
  uint32_t* key_token_ranks;       // [key_space, token_words]
  uint32_t* key_repeats;           // [2, key_space] zero before the gather: counts, then cursors
  uint32_t* key_totals;            // [key_space]
  int32_t* live_entries;           // [1]
  int32_t key_space;               // Hkv * num_pages, at most kCountingSortBins
  int32_t token_words;             // token_bitmap_words(token_end - token_begin)
  // With union_counts and the counting sort (else null): nonzero once the gather sent a tile of
  // the pass block-major (zeroed before it). At 0 every tile went token-major, every entry is a
  // sentinel, and the rank, scatter and merge steps return at once (bench/NOTES.md s53 r1: 20 us
  // of a 16/1 structured pass's 41 us outside the union kernel).
  uint32_t* block_major_flag;      // [1]
  unsigned char* prefill_partials; // [token_end - token_begin, Hkv, top_k] compact partials
  // Page-union tiles of the pass (tile = KV head * union_tiles + token / kUnionTokens), or all
  // null where the plan runs every token block-major: the union's size, or -1 where the tile's
  // tokens go block-major; its pages, ascending; and per page the visible keys of each of the
  // tile's tokens (byte i: token i of the tile, 0 where it did not select the page).
  int32_t* union_counts;   // [Hkv * union_tiles]
  uint32_t* union_pages;   // [Hkv * union_tiles, kUnionPages]
  uint64_t* union_visible; // [Hkv * union_tiles, kUnionPages]
  // The union kernel's work queue (with union_counts; zeroed before the gather), largest unions
  // first: the gather appends each listed tile to its size's bucket (union_size_bucket: bucket b
  // is union_listed[b * Hkv * union_tiles ..], its count union_queue[b]); the union kernel's CTAs
  // claim the tiles one at a time through union_queue[kUnionPages], bucket 0 first. In a model of
  // the bench's structured selections at 16/1 (bench/micro/union_claim_model.py) the longest CTA
  // ran 6-8 % above the mean with a static share of the tiles (tile t on CTA t mod 132), 1-3.3 %
  // so; s54 r1 measured structured 16/1 -3.2 % and the mixed passes at S=8K -4 to -8 %.
  uint32_t* union_queue;  // [kUnionQueueWords]
  uint32_t* union_listed; // [kUnionPages, Hkv * union_tiles]
  // The union tiles' V in fp16 (with union_counts): each cell's key (KV head x num_pages + page +
  // 1; 0: free; zeroed before the pass's conversion), its form (1: the cell holds the page's V in
  // fp16, exactly where |v| >= 2^-17; 0: the page keeps bf16 V), each listed entry's cell (or
  // kNoValueCell) and the cells' pages.
  uint32_t* union_value_keys;  // [kUnionValueCells]
  uint32_t* union_value_forms; // [kUnionValueCells]
  uint32_t* union_value_cells; // [Hkv * union_tiles, kUnionPages]
  void* union_values;          // [kUnionValueCells, 128, 128] fp16
};

// The Hopper decode kernel (sparse_attention_decode_sm90.cuh): the parameters plus the TMA
// descriptors (CUtensorMap, opaque, 128 B, 64-aligned) of k_cache and v_cache, boxes of one
// ring slot's tokens x 128 B (tensor_maps.h encode_kv_cache_map).
inline constexpr int kDecodeSm90StageKeysBf16 = 16; // tokens of a ring slot (and a TMA box)
inline constexpr int kDecodeSm90StageKeysFp8 = 32;
struct SparseAttentionSm90Params {
  alignas(64) uint64_t k_map[16];
  alignas(64) uint64_t v_map[16];
  SparseAttentionParams attention;
};

// The Hopper prefill attend kernel (sparse_attention_prefill_sm90.cuh): the parameters plus the
// TMA descriptors of q (boxes of 16 query rows x 64 dims: tensor_maps.h encode_query_map), of
// k_cache and v_cache (boxes of a page's 128 keys x 64 dims) and of prefill_partials (boxes of a
// partial's 16 rows x 64 values of O: encode_compact_partials_map).
// The page-union kernel (sparse_attention_prefill_union_sm90.cuh) takes the same struct and does
// not use partial_map.
struct SparseAttentionPrefillSm90Params {
  alignas(64) uint64_t q_map[16];
  alignas(64) uint64_t k_map[16];
  alignas(64) uint64_t v_map[16];
  alignas(64) uint64_t partial_map[16];
  alignas(64) uint64_t union_values_map[16]; // union_values as a page cache (the union kernel)
  SparseAttentionParams attention;
};

} // namespace m3sa::cuda
