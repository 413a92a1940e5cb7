#pragma once
// Top-k block selection (contract §5). Keys pack (rank of the score, ~block id) into 64 bits, so
// "larger key" is exactly the contract's order: score descending, NaN last, lower id first on
// ties; 0 is below every real key and marks an empty list slot.
// Two sources feed the same warp merge: a row of scores (prefill, score_blocks + select), and
// sorted candidate lists, one per block range (decode splits; later, context-parallel ranks).
#include <cstdint>

#include "cuda/indexer_params.h"
#include "cuda/kernels/common.cuh"

namespace m3sa::cuda {

inline constexpr int kSelectWarps = 8;

__device__ __forceinline__ uint64_t selection_key(float score, int32_t block) {
  return (static_cast<uint64_t>(rank_key(score)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(block));
}
__device__ __forceinline__ int32_t block_of_key(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// What the selection of one (head, token) row needs to know.
struct SelectionRow {
  int32_t* out; // [K] with stride out_stride
  int64_t out_stride;
  int n;           // causal blocks of the row
  int fill;        // ranked slots: K - init - local
  int local_begin; // first forced local block
  int init_blocks, local_blocks, top_k;

  // Candidates are the blocks that are neither forced init nor forced local.
  __device__ bool is_candidate(int b) const { return b >= init_blocks && b < local_begin; }
};

__device__ __forceinline__ SelectionRow make_selection_row(int32_t* out, int64_t out_stride,
                                                           int position, int top_k, int init_blocks,
                                                           int local_blocks) {
  SelectionRow row;
  row.out = out;
  row.out_stride = out_stride;
  row.n = position < 0 ? 0 : position / 128 + 1;
  row.fill = top_k - init_blocks - local_blocks;
  row.local_begin = row.n - local_blocks;
  row.init_blocks = init_blocks;
  row.local_blocks = local_blocks;
  row.top_k = top_k;
  return row;
}

// Rows with n <= K need no ranking: blocks 0..n-1 then -1 padding. `lanes` lanes (a warp, or a
// group of select_topk_kernel) share the writes. Returns whether the row was written.
__device__ __forceinline__ bool write_short_row(const SelectionRow& row, int lane, int lanes = 32) {
  if (row.n > row.top_k) return false;
  for (int slot = lane; slot < row.top_k; slot += lanes)
    row.out[slot * row.out_stride] = slot < row.n ? slot : -1;
  return true;
}

__device__ __forceinline__ void write_empty_row(const SelectionRow& row, int lane, int lanes = 32) {
  for (int slot = lane; slot < row.top_k; slot += lanes) row.out[slot * row.out_stride] = -1;
}

// Inserts `key` into a lane's descending list (compare-exchange chain: constant indices only).
template <int MaxK>
__device__ __forceinline__ void insert_key(uint64_t (&best)[MaxK], uint64_t key) {
  if (key <= best[MaxK - 1]) return;
#pragma unroll
  for (int i = 0; i < MaxK; ++i) {
    const uint64_t hi = max(best[i], key);
    key = min(best[i], key);
    best[i] = hi;
  }
}

template <int MaxK> __device__ __forceinline__ void clear_list(uint64_t (&best)[MaxK]) {
#pragma unroll
  for (int i = 0; i < MaxK; ++i) best[i] = 0;
}

// The fill-th largest of the 32 lanes' values `mine` (ties ordered by lane); 0 when fill <= 0.
// Uniform over the warp.
template <typename Key>
__device__ __forceinline__ Key fill_th_of_lanes(Key mine, int fill, int lane) {
  if (fill <= 0) return 0;
  int position = 0; // among the 32 values, ties ordered by lane
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    const Key other = __shfl_sync(0xffffffffu, mine, j);
    position += other > mine || (other == mine && j < lane);
  }
  const unsigned holder = __ballot_sync(0xffffffffu, position == fill - 1);
  return __shfl_sync(0xffffffffu, mine, __ffs(holder) - 1);
}

// Score loads a lane keeps in flight while it walks a row: a row read one load at a time is read
// at the rate of its loads' latency.
inline constexpr int kScoreLoadsInFlight = 8;

// A lane's share of kScoreLoadsInFlight x 32 consecutive candidates: b = base + lane + u step
// (`base` uniform over the warp), loaded together; `valid` is false past `end`.
struct ScoreChunk {
  float score[kScoreLoadsInFlight];

  __device__ __forceinline__ void load(const float* scores, int64_t stride, int base, int end,
                                       int step, int lane) {
#pragma unroll
    for (int u = 0; u < kScoreLoadsInFlight; ++u) {
      const int b = base + lane + u * step;
      score[u] = b < end ? scores[int64_t{b} * stride] : 0.f;
    }
  }
  // Calls visit(b, score, valid) for each; every lane makes the same calls, so visit may vote.
  template <typename Visit>
  __device__ __forceinline__ void visit(int base, int end, int step, int lane,
                                        Visit&& visit) const {
#pragma unroll
    for (int u = 0; u < kScoreLoadsInFlight; ++u) {
      const int b = base + lane + u * step;
      visit(b, score[u], b < end);
    }
  }
};

// The chunks of candidates begin + lane + i step below `end`, the first one from `first`
// (loaded by the caller), the others loaded here.
template <typename Visit>
__device__ __forceinline__ void for_each_score(const ScoreChunk& first, const float* scores,
                                               int64_t stride, int begin, int end, int step,
                                               int lane, Visit&& visit) {
  first.visit(begin, end, step, lane, visit);
  for (int base = begin + kScoreLoadsInFlight * step; base < end;
       base += kScoreLoadsInFlight * step) {
    ScoreChunk chunk;
    chunk.load(scores, stride, base, end, step, lane);
    chunk.visit(base, end, step, lane, visit);
  }
}

// A lower bound of the fill-th largest score rank among a warp's candidates b = begin + lane +
// i step below `end`: the fill-th largest of the 32 lanes' maxima, since the lanes holding the
// fill largest maxima hold fill candidates at least that large (0 when fill is 0 or fewer than
// fill lanes hold a candidate). Leaves the first chunk of candidates in `first`: rows of up to
// kScoreLoadsInFlight x 32 candidates are read once.
__device__ __forceinline__ uint32_t rank_floor(const float* scores, int64_t stride, int begin,
                                               int end, int step, int fill, ScoreChunk& first,
                                               int lane) {
  first.load(scores, stride, begin, end, step, lane);
  uint32_t mine = 0;
  for_each_score(first, scores, stride, begin, end, step, lane, [&](int, float score, bool valid) {
    if (valid) mine = max(mine, rank_key(score));
  });
  return fill_th_of_lanes(mine, fill, lane);
}

// Candidates b = first, first + step, ... below `end` whose rank is at least `floor`, ranked into
// the lane's list.
template <int MaxK>
__device__ __forceinline__ void rank_candidates(uint64_t (&best)[MaxK], const float* scores,
                                                int64_t stride, int first, int end, int step,
                                                uint32_t floor = 0) {
  clear_list(best);
  for (int b = first; b < end; b += step) {
    const uint64_t key = selection_key(scores[b * stride], b);
    if (static_cast<uint32_t>(key >> 32) >= floor) insert_key(best, key);
  }
}

// Candidate lists: `count` descending lists of `len` keys each (0 = an empty slot), list l at
// base + l * stride - a decode row's lists (one a warp of each range of the Hopper kernel, packed
// back to back; one a range of the portable kernel), or one list a context-parallel rank.
struct ListSet {
  const uint64_t* base;
  int64_t stride;
  int count;
  int len;

  __device__ const uint64_t* list(int l) const { return base + l * stride; }
};

// A key of a list that is in shared memory (kShared) or was written to global memory by other
// CTAs of this launch (read through L2, never a stale L1 line).
template <bool kShared> __device__ __forceinline__ uint64_t list_key(const uint64_t* key) {
  return kShared ? *key : __ldcg(key);
}

// The lists' keys first, first + step, ... of the count x len, ranked into the lane's list, four
// independent loads in flight; keys below `floor` (lists_floor) are skipped.
template <int MaxK, bool kShared = false>
__device__ __forceinline__ void rank_lists(uint64_t (&best)[MaxK], const ListSet& set, int first,
                                           int step, uint64_t floor = 0) {
  clear_list(best);
  const int total = set.count * set.len;
  for (int base = first; base < total; base += 4 * step) {
    uint64_t keys[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * step;
      keys[u] = i >= total ? 0 : list_key<kShared>(set.list(i / set.len) + i % set.len);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (keys[u] >= floor) insert_key(best, keys[u]);
  }
}

// A lower bound of the fill-th largest key of the lists: the fill-th largest of the 32 lanes'
// maxima over the lists' heads (lane l: lists l, l + 32, ...), since the lanes holding the fill
// largest maxima hold fill keys at least that large (as rank_floor; 0 when fewer than fill lanes
// hold a list). Keys below it cannot be chosen. Uniform over the warp.
// kSampleFewLists: with fewer lists than lanes, lane l holds key l / count of list l % count
// instead (32 distinct keys, the same argument), so that a few long lists - a range's own 8 warp
// lists of 16 at batch 128 - give a floor above 0 rather than every key a survivor (ranking all
// 128 took 7K cycles after the slowest stream, bench/NOTES.md s34 r2). Only that merge site asks
// for it: the same sampling at every site changed the whole kernel's code and cost batch 1
// 0.3-0.9 us (s34 r3).
template <bool kShared = false, bool kSampleFewLists = false>
__device__ __forceinline__ uint64_t lists_floor(const ListSet& set, int fill, int lane) {
  if (fill <= 0) return 0;
  uint64_t mine = 0;
  if (kSampleFewLists && set.count > 0 && set.count < 32) {
    const int k = lane / set.count;
    if (k < set.len) mine = list_key<kShared>(set.list(lane % set.count) + k);
  } else {
    for (int l = lane; l < set.count; l += 32) mine = max(mine, list_key<kShared>(set.list(l)));
  }
  return fill_th_of_lanes(mine, fill, lane);
}

// How many of the `padded` keys (a multiple of 8, 16-byte aligned, in shared memory) are larger
// than `key`: a sum over 16-byte broadcast reads, four in flight.
__device__ __forceinline__ int rank_among(const uint64_t* keys, int padded, uint64_t key) {
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(keys);
  int rank = 0;
  for (int j = 0; j < padded / 2; j += 4) {
    ulonglong2 pair[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) pair[u] = pairs[j + u];
#pragma unroll
    for (int u = 0; u < 4; ++u) rank += (pair[u].x > key) + (pair[u].y > key);
  }
  return rank;
}

// Ranks `held` unique keys in `survivors` (16-byte aligned, room for held rounded up to 8) and
// writes the fill largest, descending, to chosen[0 .. fill), 0 past the last key there is: each
// key takes the slot of its rank, a sum over 16-byte broadcast reads (independent loads). Run by
// `step` threads, this one `first` of them, that meet at `sync` (a warp, or merge_row_in_group's
// group of warps at its named barrier).
template <typename Sync>
__device__ __forceinline__ void rank_held_survivors(uint64_t* survivors, int held, int fill,
                                                    uint64_t* chosen, int first, int step,
                                                    Sync&& sync) {
  const int padded = (held + 7) & ~7; // the 0 keys rank below every key
  for (int i = held + first; i < padded; i += step) survivors[i] = 0;
  for (int i = first; i < fill; i += step) chosen[i] = 0;
  sync();
  for (int i = first; i < held; i += step) { // keys are unique (they hold the block id)
    const uint64_t key = survivors[i];
    const int rank = rank_among(survivors, padded, key);
    if (rank < fill) chosen[rank] = key;
  }
  sync();
}
// By one warp.
__device__ __forceinline__ void rank_held_survivors(uint64_t* survivors, int held, int fill,
                                                    uint64_t* chosen, int lane) {
  rank_held_survivors(survivors, held, fill, chosen, lane, 32, [] { __syncwarp(); });
}

// The fill best keys of the lists into chosen[0 .. fill), descending, 0 past the last key there
// is, by one warp. Every chosen key is at or above `floor` (lists_floor), so only the lists whose
// head is (`live`, up to `live_capacity` <= `capacity` list ids) are read, their keys at or
// above it - on scores without structure, a few more than fill - gathered into `survivors`
// (16-byte aligned, `capacity` a multiple of 8), and each takes the slot of its rank among them.
// The loops keep their loads independent: the lanes tile the live lists (a power of two >= len
// lanes a list, four passes of loads in flight), and a rank is a sum over 16-byte broadcast reads
// (bench/NOTES.md s8 r2: loops over dependent loads took 2-5 us where a last CTA had a few dozen
// keys; s8 r3: reading every list instead of the live ones cost 1M-token rows 20 us). Returns
// false, with nothing written to `chosen`, when more than `capacity` keys survive (keys built to
// defeat the floor): the caller ranks them all instead.
template <bool kShared = false>
__device__ __forceinline__ bool rank_survivors(const ListSet& set, int fill, uint64_t floor,
                                               uint64_t* survivors, int capacity, uint64_t* chosen,
                                               int32_t* live, int live_capacity, int lane) {
  __syncwarp(); // a previous call's `chosen` and `live` have been read by every lane
  const unsigned lower_lanes = (1u << lane) - 1;
  int live_lists = 0;
  for (int first = 0; first < set.count; first += 4 * 32) {
    uint64_t heads[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int l = first + u * 32 + lane;
      heads[u] = l < set.count ? list_key<kShared>(set.list(l)) : 0;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool keep = heads[u] != 0 && heads[u] >= floor;
      const unsigned kept = __ballot_sync(0xffffffffu, keep);
      const int at = live_lists + __popc(kept & lower_lanes);
      if (keep && at < live_capacity) live[at] = first + u * 32 + lane;
      live_lists += __popc(kept);
    }
  }
  // A live list holds at least one survivor: with more live lists than `capacity` keys, more
  // keys survive too.
  if (live_lists > live_capacity) return false;
  __syncwarp();
  const int shift = set.len <= 1 ? 0 : 32 - __clz(set.len - 1); // log2 of the lanes a list
  const int lists_a_pass = 32 >> shift, k = lane & ((1 << shift) - 1), sub = lane >> shift;
  int held = 0;
  for (int first = 0; first < live_lists; first += 4 * lists_a_pass) {
    uint64_t keys[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = first + u * lists_a_pass + sub;
      keys[u] = i < live_lists && k < set.len ? list_key<kShared>(set.list(live[i]) + k) : 0;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool keep = keys[u] != 0 && keys[u] >= floor;
      const unsigned kept = __ballot_sync(0xffffffffu, keep);
      const int at = held + __popc(kept & lower_lanes);
      if (keep && at < capacity) survivors[at] = keys[u];
      held += __popc(kept);
    }
  }
  if (held > capacity) return false;
  rank_held_survivors(survivors, held, fill, chosen, lane);
  return true;
}

// The largest of at most 64 keys in descending order, by one warp: lane l brings keys l (`low`)
// and 32 + l (`high`), 0 where there is none, and gets back the key of rank l. A bitonic sort in
// registers, 21 compare-exchange steps of shuffles and selects with no memory and no loop: where a
// decode row's lists hold at most 64 keys (batch 1 at S = 8K, batch 32 at 8K, a range's own four
// warp lists of 16), it replaces the floor, the live lists and the survivors' ranking, whose
// ~750 dependent warp instructions were most of the last CTA's tail (bench/NOTES.md s16 r4).
// Not inlined: one copy of the network for the three merge sites (inlined, s17 r1, it made the
// kernel 6,100 instructions longer, and B=1 S=128K, which never takes it, 0.9 us slower).
inline __device__ __noinline__ uint64_t best_of_64(uint64_t low, uint64_t high, int lane) {
#pragma unroll
  for (int size = 2; size <= 64; size <<= 1) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      if (stride == 32) { // elements lane and 32 + lane, within the lane (size 64: descending)
        const uint64_t larger = max(low, high);
        high = min(low, high);
        low = larger;
        continue;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint64_t& key = r == 0 ? low : high;
        const uint64_t other = __shfl_xor_sync(0xffffffffu, key, stride);
        const int e = r * 32 + lane;
        // Blocks of `size` elements alternate direction so that each pair of them is bitonic;
        // the last block (size 64) sorts descending. The lower element of a pair keeps the larger
        // key in a descending block.
        const bool descending = (e & size) == 0, lower = (e & stride) == 0;
        key = lower == descending ? max(key, other) : min(key, other);
      }
    }
  }
  return low;
}

// The same result by ranks: each key takes the slot of its rank among the 64 (keys are unique;
// the 0s rank below every key), a sum over 32 broadcast 16-byte reads of `keys` ([96] of the
// warp's shared memory, 16-byte aligned: the keys, then the ranked slots) - independent loads
// and compares instead of the network's 21 dependent shuffle steps on the finish's critical path:
// batch 1 and 32 at S = 8K 0.33-0.52 us faster (bench/NOTES.md s46 r1). Not inlined, as
// best_of_64: inlined at the merge sites it changed their code, and batch 1 H=4 S >= 32K, where
// no row takes it, lost up to 0.4 us (s45 r2). As a call, only the 4-warp e4m3 kernel's S=128K
// cases move, 0.1-0.2 us between H=1 and H=4 either way (code placement: s46 r1, r4).
inline __device__ __noinline__ uint64_t rank_of_64(uint64_t low, uint64_t high, uint64_t* keys,
                                                   int lane) {
  uint64_t* ranked = keys + 64;
  keys[lane] = low;
  keys[lane + 32] = high;
  ranked[lane] = 0;
  __syncwarp();
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(keys);
  int rank_low = 0, rank_high = 0;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    const ulonglong2 pair = pairs[j];
    rank_low += (pair.x > low) + (pair.y > low);
    rank_high += (pair.x > high) + (pair.y > high);
  }
  if (low != 0 && rank_low < 32) ranked[rank_low] = low;
  if (high != 0 && rank_high < 32) ranked[rank_high] = high;
  __syncwarp();
  const uint64_t mine = ranked[lane];
  __syncwarp(); // every lane has read its slot before the warp's next call writes them
  return mine;
}

// `fill` rounds of "the largest list head wins, its lane pops it": lane i returns round i's key.
// The warp maximum of a 64-bit key is two 32-bit reductions (high word, then the low word among
// the lanes holding the highest high word): two REDUX instructions instead of ten shuffles.
template <int MaxK>
__device__ __forceinline__ uint64_t merge_warp(uint64_t (&best)[MaxK], int fill, int lane) {
  uint64_t mine = 0;
  for (int round = 0; round < fill; ++round) {
    const uint32_t hi = static_cast<uint32_t>(best[0] >> 32);
    const uint32_t top_hi = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t top_lo =
        __reduce_max_sync(0xffffffffu, hi == top_hi ? static_cast<uint32_t>(best[0]) : 0u);
    const uint64_t top = (static_cast<uint64_t>(top_hi) << 32) | top_lo;
    if (best[0] == top && top != 0) { // keys are unique (they hold the block id): one lane pops
#pragma unroll
      for (int i = 0; i < MaxK - 1; ++i) best[i] = best[i + 1];
      best[MaxK - 1] = 0;
    }
    if (lane == round) mine = top;
  }
  return mine;
}

// Writes init blocks, the chosen blocks in ascending order, then the local blocks. Lane i holds
// the i-th chosen key (lanes >= fill: anything).
__device__ __forceinline__ void write_selection(const SelectionRow& row, uint64_t chosen_key,
                                                int lane) {
  const int32_t chosen = lane < row.fill ? block_of_key(chosen_key) : 0x7fffffff;
  // Among the chosen ids: the ascending slot after the forced init blocks. Lanes past the fill
  // hold INT32_MAX, smaller than no id, so all 32 lanes are counted: independent shuffles
  // instead of a loop of fill dependent steps.
  int rank = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) rank += __shfl_sync(0xffffffffu, chosen, i) < chosen;
  if (lane < row.fill) row.out[(row.init_blocks + rank) * row.out_stride] = chosen;
  for (int slot = lane; slot < row.init_blocks; slot += 32) row.out[slot * row.out_stride] = slot;
  for (int i = lane; i < row.local_blocks; i += 32)
    row.out[(row.init_blocks + row.fill + i) * row.out_stride] = row.local_begin + i;
}

// Row (h, t)'s selection: its output slots, its position (from its request) and K's split.
__device__ __forceinline__ SelectionRow selection_row_of(const SelectionRows& rows, int h, int t) {
  const int r = request_of_token(rows.cu_q_lens, rows.num_requests, t);
  const int seq_len = rows.seq_lens[r];
  const int q_len = rows.cu_q_lens[r + 1] - rows.cu_q_lens[r];
  const int position = seq_len == 0 ? -1 : seq_len - q_len + (t - rows.cu_q_lens[r]);
  return make_selection_row(rows.topk + h * rows.topk_stride_head + t * rows.topk_stride_token,
                            rows.topk_stride_k, position, rows.top_k, rows.init_blocks,
                            rows.local_blocks);
}

// Row (h, t) of a select launch, and whether it is written already (rows owned by the decode
// kernel, rows past the score width, rows with n <= K) by the `lanes` lanes sharing it.
__device__ __forceinline__ bool begin_scored_row(const SelectTopkParams& p, int h, int t, int lane,
                                                 bool writer, SelectionRow* row, int lanes = 32) {
  if (t < p.rows.cu_q_lens[p.first_request]) return true; // decode rows: another kernel's
  *row = selection_row_of(p.rows, h, t);
  if (row->n > p.score_width) { // seq_len beyond the block table: nothing valid to read
    if (writer) {
      write_empty_row(*row, lane, lanes);
      if (lane == 0) atomicOr(p.error_flags, kSeqLenBeyondTable);
    }
    return true;
  }
  if (row->n <= row->top_k) {
    if (writer) write_short_row(*row, lane, lanes);
    return true;
  }
  return false;
}

// The (head, token) row of this warp in a warp-per-row launch; false past the live rows.
__device__ __forceinline__ bool warp_row(const SelectionRows& rows, int* h, int* t) {
  const int row_index = blockIdx.x * kSelectWarps + (threadIdx.x >> 5);
  *h = row_index / rows.token_capacity, *t = row_index % rows.token_capacity;
  return *h < rows.heads && *t < rows.num_tokens;
}

__device__ __forceinline__ const float* row_scores(const SelectTopkParams& p, int h, int t) {
  return p.scores + h * p.score_stride_head + t * p.score_stride_token;
}

// Survivors a warp gathers before it gives up on the floor (a decode merge's lists or a row's
// scores): on random scores a few more than fill survive; rows of ties keep many and take the
// full ranking.
inline constexpr int kSurvivorCapacity = 224;
static_assert(kSurvivorCapacity % 8 == 0, "rank_held_survivors pads to 8 keys");

// A warp's shared memory for one row: survivors, then the chosen keys.
struct SurvivorSpace {
  __align__(16) uint64_t survivors[kSurvivorCapacity];
  uint64_t chosen[32];
};

// Gathers the candidates b = begin + lane + i step below `end` whose rank is at least `floor` into
// survivors (ballot-compacted, in block order); false when more than kSurvivorCapacity survive.
__device__ __forceinline__ bool gather_survivors(const ScoreChunk& first, const float* scores,
                                                 int64_t stride, int begin, int end, int step,
                                                 uint32_t floor, SurvivorSpace& space, int* held,
                                                 int lane) {
  const unsigned lower_lanes = (1u << lane) - 1;
  int count = 0;
  for_each_score(first, scores, stride, begin, end, step, lane,
                 [&](int b, float score, bool valid) {
                   const uint64_t key = selection_key(score, b);
                   const bool keep = valid && static_cast<uint32_t>(key >> 32) >= floor;
                   const unsigned kept = __ballot_sync(0xffffffffu, keep);
                   const int at = count + __popc(kept & lower_lanes);
                   if (keep && at < kSurvivorCapacity) space.survivors[at] = key;
                   count += __popc(kept);
                 });
  *held = count;
  return count <= kSurvivorCapacity;
}

// Lane i < fill: the i-th largest key (descending) of the candidates b = begin + lane + i step
// below row.local_begin; 0 in the other lanes. The floor (rank_floor) leaves, on scores without
// structure, a few more than fill survivors, ranked against each other; when more survive (ties),
// or with rank_every_candidate, every candidate is ranked into the lanes' lists and merged.
template <int MaxK>
__device__ __forceinline__ uint64_t best_of_share(const SelectTopkParams& p,
                                                  const SelectionRow& row, const float* scores,
                                                  int begin, int step, SurvivorSpace& space,
                                                  int lane) {
  if (row.fill <= 0) return 0;
  const int64_t stride = p.score_stride_block;
  uint32_t floor = 0;
  if (!p.rank_every_candidate) {
    ScoreChunk first;
    floor = rank_floor(scores, stride, begin, row.local_begin, step, row.fill, first, lane);
    int held;
    if (gather_survivors(first, scores, stride, begin, row.local_begin, step, floor, space, &held,
                         lane)) {
      rank_held_survivors(space.survivors, held, row.fill, space.chosen, lane);
      return lane < row.fill ? space.chosen[lane] : 0;
    }
  }
  uint64_t best[MaxK];
  rank_candidates(best, scores, stride, begin + lane, row.local_begin, step, floor);
  return merge_warp(best, row.fill, lane);
}

// CTAs an SM the select kernels are built for: a row's loads are latency-bound, so occupancy is
// bandwidth (the lists of the full ranking, 2 MaxK registers, fit either way without spills).
template <int MaxK> inline constexpr int kSelectMinBlocks = MaxK <= 16 ? 4 : 2;

// Rows by groups of kGroupLanes lanes, kGroupsPerWarp rows a warp (rows (t, h) in token-major
// order: at H = 4 a warp's rows are one token's heads). Why: the select is issue-bound (s11 r2:
// ~900 warp instructions a row at C=8K S=8K H=4, 0.84 warps issued per scheduler and cycle), and
// a warp per row spends most of them on steps whose cost is per warp, not per candidate - the
// floor's scan of 32 lane maxima, the survivors' ranking, the fill-step rank loop of the write.
// A group runs the same algorithm on up to kGroupMaxCandidates candidates (kGroupScoresPerLane a
// lane): the floor is the largest of the group's lane values (each lane's kTop largest, 8 kTop >=
// fill) that at least fill of them reach - fill distinct candidates are at least that large -,
// the candidates at or above it are gathered in block order into the group's quarter of the
// warp's survivor space and ranked against each other, and the fill best are written in block
// order by a prefix count of the chosen flags over that order (no rank loop over the chosen ids).
// Rows whose survivors overflow the group's space (ties), and every row under
// rank_every_candidate, are selected afterwards by the whole warp, one at a time (best_of_share).
// Rows with more candidates are left to select_topk_kernel, launched next (p.group_candidates).
inline constexpr int kGroupLanes = 8, kGroupsPerWarp = 32 / kGroupLanes;
inline constexpr int kGroupScoresPerLane = 32;
inline constexpr int kGroupMaxCandidates = kGroupLanes * kGroupScoresPerLane;
inline constexpr int kGroupSurvivorCapacity = kSurvivorCapacity / kGroupsPerWarp; // 56
inline constexpr int kGroupSurvivorsPerLane = kGroupSurvivorCapacity / kGroupLanes;
static_assert(kGroupSurvivorCapacity % 8 == 0, "a group's survivors are padded to 8 keys");

// The group's floor: the largest of its lanes' values v (each lane's kTop) with at least `fill`
// values >= v, or 0. Uniform over the group.
template <int kTop>
__device__ __forceinline__ uint32_t group_floor(const uint32_t (&top)[kTop], int fill) {
  int at_least[kTop] = {};
#pragma unroll
  for (int j = 0; j < kGroupLanes; ++j)
#pragma unroll
    for (int v = 0; v < kTop; ++v) {
      const uint32_t other = __shfl_sync(0xffffffffu, top[v], j, kGroupLanes);
#pragma unroll
      for (int w = 0; w < kTop; ++w) at_least[w] += other >= top[w];
    }
  uint32_t floor = 0;
#pragma unroll
  for (int w = 0; w < kTop; ++w)
    if (at_least[w] >= fill) floor = max(floor, top[w]);
#pragma unroll
  for (int offset = kGroupLanes / 2; offset > 0; offset >>= 1)
    floor = max(floor, __shfl_xor_sync(0xffffffffu, floor, offset, kGroupLanes));
  return floor;
}

// Whether a ranked row belongs to select_topk_groups_kernel: nothing to rank (the forced blocks
// fill it), or at most `max_candidates` candidates.
__device__ __forceinline__ bool row_fits_group(const SelectionRow& row, int max_candidates) {
  return row.fill <= 0 || row.local_begin - row.init_blocks <= max_candidates;
}

template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32, kSelectMinBlocks<MaxK>)
    select_topk_groups_kernel(const __grid_constant__ SelectTopkParams p) {
  __shared__ SurvivorSpace space[kSelectWarps];
  wait_for_prior_grids(); // launched to overlap the scorer by SM90 plans
  allow_next_grid();
  constexpr int kTop = (MaxK + kGroupLanes - 1) / kGroupLanes; // lane values for the floor
  constexpr int kChunk = 8;                                    // candidates a lane loads at once
  const int lane = threadIdx.x & 31, group = lane / kGroupLanes, glane = lane % kGroupLanes;
  const unsigned lower_in_group = ((1u << glane) - 1) << (group * kGroupLanes);
  const unsigned group_lanes = 0xffu << (group * kGroupLanes);
  SurvivorSpace& warp_space = space[threadIdx.x >> 5];
  uint64_t* survivors = warp_space.survivors + group * kGroupSurvivorCapacity;
  // Rows fit 32 bits (heads x token capacity): no 64-bit division.
  const int first_row = (blockIdx.x * kSelectWarps + (threadIdx.x >> 5)) * kGroupsPerWarp;
  const auto row_head_token = [&](int g, int* h, int* t) { // false past the live rows
    const int r = first_row + g;
    *t = r / p.rows.heads;
    *h = r - *t * p.rows.heads;
    return *t < p.rows.num_tokens;
  };

  // The group's row: ranked here (by_group), by the warp afterwards (by_warp), written already, or
  // select_topk_kernel's (more candidates than a group takes).
  int h, t;
  SelectionRow row{};
  bool by_group = false, by_warp = false;
  if (row_head_token(group, &h, &t) && !begin_scored_row(p, h, t, glane, true, &row, kGroupLanes)) {
    const bool ours = row_fits_group(row, kGroupMaxCandidates);
    by_warp = ours && row.fill > 0 && p.rank_every_candidate;
    by_group = ours && !by_warp;
  }
  // fill <= 0: the forced init and local blocks fill the row, nothing is ranked.
  const int candidates = by_group && row.fill > 0 ? row.local_begin - row.init_blocks : 0;
  const float* scores =
      by_group ? row_scores(p, h, t) + row.init_blocks * p.score_stride_block : p.scores;
  const int warp_candidates = __reduce_max_sync(0xffffffffu, candidates);
  // Candidates glane + kGroupLanes (kChunk chunk + u), u < kChunk, of the row into s: loaded all
  // at once; 0 past the row. Chunks no row of the warp reaches are skipped by the callers.
  const auto load_chunk = [&](int chunk, float(&s)[kChunk]) {
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int i = glane + kGroupLanes * (kChunk * chunk + u);
      s[u] = i < candidates ? scores[int64_t{i} * p.score_stride_block] : 0.f;
    }
  };

  // The floor from each lane's kTop largest rank keys (descending). The first chunk stays in
  // registers for the gather; rows of more candidates read their later chunks again (L1), each
  // pass issuing all of them before it uses any (one round trip a pass, not one a chunk).
  constexpr int kChunks = kGroupScoresPerLane / kChunk;
  float first[kChunk];
  load_chunk(0, first);
  // visit(i, score) for the lane's candidates i in chunk order, every lane making the same calls
  // (candidates past the row too, with i >= candidates), so visit may vote.
  const auto for_each_candidate = [&](auto&& visit) {
    float later[kChunks - 1][kChunk];
#pragma unroll
    for (int chunk = 1; chunk < kChunks; ++chunk)
      if (kGroupLanes * kChunk * chunk < warp_candidates) load_chunk(chunk, later[chunk - 1]);
#pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      if (kGroupLanes * kChunk * chunk >= warp_candidates) break;
#pragma unroll
      for (int u = 0; u < kChunk; ++u)
        visit(glane + kGroupLanes * (kChunk * chunk + u),
              chunk == 0 ? first[u] : later[chunk - 1][u]);
    }
  };
  uint32_t top[kTop] = {};
  for_each_candidate([&](int i, float score) {
    uint32_t key = i < candidates ? rank_key(score) : 0u;
#pragma unroll
    for (int v = 0; v < kTop; ++v) {
      const uint32_t hi = max(top[v], key);
      key = min(top[v], key);
      top[v] = hi;
    }
  });
  const uint32_t floor = group_floor(top, row.fill);

  // Survivors in block order (chunk, then u, then lane).
  int held = 0;
  for_each_candidate([&](int i, float score) {
    const uint64_t key = selection_key(score, row.init_blocks + i);
    const bool keep = i < candidates && static_cast<uint32_t>(key >> 32) >= floor;
    const unsigned kept = __ballot_sync(0xffffffffu, keep) & group_lanes;
    const int at = held + __popc(kept & lower_in_group);
    if (keep && at < kGroupSurvivorCapacity) survivors[at] = key;
    held += __popc(kept);
  });
  if (held > kGroupSurvivorCapacity) by_group = false, by_warp = true; // ties: the warp ranks all
  if (!by_group) held = 0;
  const int padded = (held + 7) & ~7; // the 0 keys rank below every key
  for (int i = held + glane; i < padded; i += kGroupLanes) survivors[i] = 0;
  __syncwarp();

  // Survivor glane + kGroupLanes j: its rank among the group's survivors, then its slot among the
  // chosen ones in block order.
  int chosen_before = by_group ? row.init_blocks : 0;
#pragma unroll
  for (int j = 0; j < kGroupSurvivorsPerLane; ++j) {
    const int i = glane + kGroupLanes * j;
    uint64_t key = 0;
    bool chosen = false;
    if (i < held) {
      key = survivors[i];
      chosen = rank_among(survivors, padded, key) < row.fill;
    }
    const unsigned picked = __ballot_sync(0xffffffffu, chosen) & group_lanes;
    if (chosen)
      row.out[(chosen_before + __popc(picked & lower_in_group)) * row.out_stride] =
          block_of_key(key);
    chosen_before += __popc(picked);
  }
  if (by_group) {
    for (int slot = glane; slot < row.init_blocks; slot += kGroupLanes)
      row.out[slot * row.out_stride] = slot;
    for (int i = glane; i < row.local_blocks; i += kGroupLanes)
      row.out[(row.init_blocks + row.fill + i) * row.out_stride] = row.local_begin + i;
  }
  __syncwarp(); // the groups' survivors are read: the space is the warp's again

  // Rows left to the whole warp, one at a time.
  const unsigned warp_rows = __ballot_sync(0xffffffffu, by_warp && glane == 0);
  for (unsigned left = warp_rows; left != 0; left &= left - 1) {
    const int g = (__ffs(left) - 1) / kGroupLanes;
    int gh, gt;
    row_head_token(g, &gh, &gt);
    const SelectionRow warp_row_of_group = selection_row_of(p.rows, gh, gt);
    const uint64_t key = best_of_share<MaxK>(p, warp_row_of_group, row_scores(p, gh, gt),
                                             warp_row_of_group.init_blocks, 32, warp_space, lane);
    write_selection(warp_row_of_group, key, lane);
  }
}

// One warp per row: rows of up to a few thousand blocks. After select_topk_groups_kernel
// (p.group_candidates > 0) only the rows with more candidates than a group takes, the others
// being that kernel's.
template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32, kSelectMinBlocks<MaxK>)
    select_topk_kernel(const __grid_constant__ SelectTopkParams p) {
  __shared__ SurvivorSpace space[kSelectWarps];
  wait_for_prior_grids(); // launched to overlap the scorer (or the groups' kernel) by SM90 plans
  allow_next_grid();
  const int lane = threadIdx.x & 31;
  int h, t;
  if (!warp_row(p.rows, &h, &t)) return;
  SelectionRow row;
  const bool after_groups = p.group_candidates > 0; // which wrote every row but the long ones
  if (begin_scored_row(p, h, t, lane, !after_groups, &row)) return;
  if (after_groups && row_fits_group(row, p.group_candidates)) return;
  const uint64_t key = best_of_share<MaxK>(p, row, row_scores(p, h, t), row.init_blocks, 32,
                                           space[threadIdx.x >> 5], lane);
  write_selection(row, key, lane);
}

// One CTA per row for long contexts (up to 8192+ blocks): each warp selects from a 1/8 share, then
// warp 0 merges the eight lists.
template <int MaxK>
__global__ void __launch_bounds__(kSelectWarps * 32, kSelectMinBlocks<MaxK>)
    select_topk_wide_kernel(const __grid_constant__ SelectTopkParams p) {
  __shared__ SurvivorSpace space[kSelectWarps];
  __shared__ uint64_t lists[kSelectWarps][32];
  wait_for_prior_grids(); // launched to overlap the scorer by SM90 plans
  allow_next_grid();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.x / p.rows.token_capacity, t = blockIdx.x % p.rows.token_capacity;
  if (h >= p.rows.heads || t >= p.rows.num_tokens) return;
  SelectionRow row;
  if (begin_scored_row(p, h, t, lane, warp == 0, &row)) return; // uniform across the CTA
  lists[warp][lane] = best_of_share<MaxK>(p, row, row_scores(p, h, t), row.init_blocks + warp * 32,
                                          32 * kSelectWarps, space[warp], lane);
  __syncthreads();
  if (warp != 0) return;
  uint64_t best[MaxK];
  clear_list(best);
  for (int w = 0; w < kSelectWarps; ++w) insert_key(best, lists[w][lane]);
  write_selection(row, merge_warp(best, row.fill, lane), lane);
}

} // namespace m3sa::cuda
