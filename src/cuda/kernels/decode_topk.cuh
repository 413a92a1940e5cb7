#pragma once
// Decode rows of index_topk in one launch: score and select without a score matrix.
// One CTA = one row tile of a decode request (all its q_len x H rows when they fit 64) times one
// range of its causal blocks. While it scores, each row keeps its best candidates in a sorted
// list in shared memory; the CTA then publishes its lists, and the last CTA of the tile to arrive
// merges all ranges' lists into the final selection (split-K style: no second launch, no sync) -
// or, in the Hopper kernel's cluster instantiation, whose launch makes a tile's ranges one
// cluster, rank 0 merges the lists the others push into its shared memory.
// This file holds the portable kernel (mma.sync, register-staged key blocks, SM80+) and the tile
// bookkeeping and publish / merge tail it shares with the Hopper kernel (decode_topk_sm90.cuh).
#include <cuda/atomic>

#include "cuda/candidate_lists.h"
#include "cuda/kernels/decode_stamps.cuh"
#include "cuda/kernels/score_blocks.cuh"
#include "cuda/kernels/select_topk.cuh"
#include "cuda/kernels/sm90/hopper.cuh"

namespace m3sa::cuda {

// The candidate lists, [64 rows][fill <= 32] keys, reuse the staged-query shared memory: the
// kernel needs no more than the scoring (and keeps its occupancy, and the L1 share that holds
// the key loads in flight).
inline constexpr int kDecodeSmemBytes = kScoreSmemBytes;
static_assert(kTileRows * 32 * sizeof(uint64_t) <= kReusableSmemBytes);
// Warps of a decode CTA that publish and merge (the Hopper kernel's producer warp only waits).
inline constexpr int kDecodeMergeWarps = kScoreThreads / 32;
// The last CTA's merge scratch a warp, in 8-byte words: survivors (kSurvivorCapacity,
// select_topk.cuh), chosen, live list ids (int32).
inline constexpr int kLiveListCapacity = kSurvivorCapacity;
inline constexpr int kMergeScratchKeys = kSurvivorCapacity + 32 + kLiveListCapacity / 2;
static_assert(kDecodeMergeWarps * kMergeScratchKeys * sizeof(uint64_t) <= kReusableSmemBytes);
// A warp's scratch holds rank_of_64's 96 keys at a 16-byte boundary (the ranges' bases are).
static_assert(kMergeScratchKeys >= 96 && kMergeScratchKeys % 2 == 0);

// One decode CTA's row tile (blockIdx.x) and how its rows are written.
struct DecodeTile {
  const DecodeTopkParams* p;
  RowTile tile;
  TileGeometry geo;
  int fill; // ranked slots a row: K - init - local

  __device__ SelectionRow selection_row(int row) const {
    const int heads = p->scoring.heads;
    const int t = tile.token_begin + row / heads;
    return make_selection_row(p->topk + (row % heads) * p->topk_stride_head +
                                  t * p->topk_stride_token,
                              p->topk_stride_k, geo.seq_len == 0 ? -1 : geo.first_pos + row / heads,
                              p->top_k, p->init_blocks, p->local_blocks);
  }

  // A row's result: its selection, or (context-parallel shard) its candidate keys, lane i holding
  // the i-th best (`ranked` false: a row with nothing to rank; the merge writes it). One warp.
  __device__ void emit(int row, bool ranked, uint64_t chosen, int lane) const {
    const int heads = p->scoring.heads;
    const SelectionRow sel = selection_row(row);
    if (p->candidates) {
      uint64_t* out = p->candidates + ((row % heads) * int64_t{p->candidate_token_capacity} +
                                       tile.token_begin + row / heads) *
                                          fill;
      if (lane < fill) out[lane] = ranked ? chosen : 0;
    } else if (!ranked) {
      if (!write_short_row(sel, lane)) write_empty_row(sel, lane);
    } else {
      write_selection(sel, chosen, lane);
    }
  }
};

// The request of the CTA's row tile (blockIdx.x), or -1 past the batch's decode tiles.
__device__ __forceinline__ int decode_tile_request(const DecodeTopkParams& p) {
  const int x = blockIdx.x;
  return x < p.num_decode_requests * p.tiles_per_request ? x / p.tiles_per_request : -1;
}

// The lines of the tile's metadata into L2: its request's bounds and length, and its block-table
// row, whose entries the ranges need once seq_len is known (a 128-byte line a thread, the tile's
// ranges interleaved). Prefetches only, so the Hopper kernel issues them before its PDL wait: the
// first loads after it then find L2 instead of HBM (L2 is where the previous grid's writes land,
// so a line prefetched early is never stale).
__device__ __forceinline__ void prefetch_decode_tile_metadata(const DecodeTopkParams& p) {
  const ScoreBlocksParams& s = p.scoring;
  const int r = decode_tile_request(p);
  if (r < 0) return;
  if (threadIdx.x == 0) prefetch_to_l2(s.cu_q_lens + r), prefetch_to_l2(s.seq_lens + r);
  for (int entry = (threadIdx.x * s.splits + blockIdx.y) * 32; entry < s.block_table_width;
       entry += blockDim.x * s.splits * 32)
    prefetch_to_l2(s.block_table + int64_t{r} * s.block_table_stride + entry);
}

// What a decode CTA can work out before its PDL wait (nothing here reads memory): its tile's
// request (decode_tile_request) and part, and the divisors its range needs once seq_len is known.
struct DecodeTileStart {
  int request, part;
  PreparedDivisor splits, shards;
};
__device__ __forceinline__ DecodeTileStart prepare_decode_tile(const DecodeTopkParams& p) {
  const int r = decode_tile_request(p);
  return {r, static_cast<int>(blockIdx.x) - max(r, 0) * p.tiles_per_request,
          PreparedDivisor(p.scoring.splits), PreparedDivisor(p.scoring.shard_count)};
}

// The CTA's row tile, or false when it has nothing to score: past the batch, a q_len other than
// the one the grid was sized from (rows would be lost: flagged), or metadata that cannot be
// served (flagged; warps < kDecodeMergeWarps write -1 rows or empty candidates). Uniform per CTA.
// `start`: prepare_decode_tile's, or null (then worked out here).
__device__ __forceinline__ bool begin_decode_tile(const DecodeTopkParams& p, DecodeTile* t,
                                                  const DecodeTileStart* start = nullptr) {
  const ScoreBlocksParams& s = p.scoring;
  const int r = start ? start->request : decode_tile_request(p);
  if (r < 0) return false;
  const int part = start ? start->part : static_cast<int>(blockIdx.x) % p.tiles_per_request;
  // Every load that does not depend on another goes out at once: the request's bounds and length
  // (then its block-table entries and queries, then the pages) - with cold caches each dependent
  // round trip is an HBM latency, and batch 1 is little else.
  const int q_begin = s.cu_q_lens[r], q_end = s.cu_q_lens[r + 1];
  const int seq_len = load_before_branch(s.seq_lens + r);
  const int q_len = q_end - q_begin;
  if (q_len != p.decode_q_len) {
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(s.error_flags, kDecodeQLenMismatch);
    return false;
  }
  t->p = &p;
  t->tile = RowTile{r, q_begin + part * s.tile_tokens,
                    min(s.tile_tokens, q_len - part * s.tile_tokens), 0};
  t->geo = tile_geometry(s, t->tile, q_begin, q_end, seq_len, start ? &start->shards : nullptr);
  t->fill = p.top_k - p.init_blocks - p.local_blocks;
  if (!t->geo.bad) return true;
  if (blockIdx.y != 0) return false;
  if (threadIdx.x == 0) atomicOr(s.error_flags, kSeqLenBeyondTable);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < kDecodeMergeWarps)
    for (int row = warp; row < t->geo.rows; row += kDecodeMergeWarps) {
      if (!p.candidates)
        write_empty_row(t->selection_row(row), lane);
      else
        t->emit(row, false, 0, lane);
    }
  return false;
}

// Where a decode CTA keeps its candidate lists: kLists lists a row (the Hopper kernel: one per
// warp; the portable kernel: one), list w of row r at lists + (w * row_capacity + r) * fill, each
// descending and 0-padded.
template <int kLists> struct CtaLists {
  uint64_t* lists;
  int row_capacity;
};

// Shared memory the last CTA's merge may use: `stage` (may be null) holds `stage_keys` keys, where
// every range's lists are gathered at once (cp.async: all of a thread's loads in flight) when they
// fit; `scratch` [kDecodeMergeWarps][kMergeScratchKeys] keys for the ranking. Free once the CTA has
// published (the portable kernel: its candidate lists) or, where the CTA merges its own lists
// (splits == 1), disjoint from them (the Hopper kernel: the end of its page ring).
struct MergeMemory {
  uint64_t* stage;
  int64_t stage_keys;
  uint64_t* scratch;
};

// Row `row`'s selection from `count` descending lists (list l at base + l * stride, `len`
// keys each), by one warp: the survivors of the lists' floor ranked among themselves, all keys
// through the register lists when too many survive (keys built against the floor).
// kWarpLists: the Hopper kernel's lists (one a warp of each range), every key at once, ranked in
// the warp's scratch where they are at most 64 (rank_of_64; fill <= 32); the portable kernel
// keeps the path below (its 168 registers would spill). kOwnLists: a range's own warp lists (the
// one-range finish), fewer than 32, whose floor lists_floor samples from their first keys.
template <int MaxK, bool kShared, bool kWarpLists, bool kOwnLists = false>
__device__ __forceinline__ void merge_row(const DecodeTile& t, int row, const ListSet& set,
                                          uint64_t* scratch, int lane) {
  const int fill = t.fill;
  if constexpr (kWarpLists) {
    const int total = set.count * set.len;
    if (total <= 64) {
      const uint64_t low =
          lane < total ? list_key<kShared>(set.list(lane / set.len) + lane % set.len) : 0;
      const int l2 = lane + 32;
      const uint64_t high =
          l2 < total ? list_key<kShared>(set.list(l2 / set.len) + l2 % set.len) : 0;
      const uint64_t ranked = rank_of_64(low, high, scratch, lane);
      M3SA_DECODE_FINISH_STAMP(3);
      t.emit(row, true, lane < fill ? ranked : 0, lane);
      return;
    }
  }
  uint64_t* chosen = scratch + kSurvivorCapacity;
  int32_t* live = reinterpret_cast<int32_t*>(chosen + 32);
  const uint64_t floor = lists_floor<kShared, kOwnLists>(set, fill, lane);
  M3SA_DECODE_FINISH_STAMP(2);
  if (rank_survivors<kShared>(set, fill, floor, scratch, kSurvivorCapacity, chosen, live,
                              kLiveListCapacity, lane)) {
    M3SA_DECODE_FINISH_STAMP(3);
    t.emit(row, true, lane < fill ? chosen[lane] : 0, lane);
    return;
  }
  uint64_t best[MaxK];
  rank_lists<MaxK, kShared>(best, set, lane, 32, floor);
  t.emit(row, true, merge_warp(best, fill, lane), lane);
}

// The selection of a tile's only row from Hopper warp lists of at most 64 keys (batch 1 H=1 at
// short contexts; batch 128 H=1's one-range finish), by all kDecodeMergeWarps worker warps: thread
// q ranks key q / 2 against half of the keys and adds its partner's count. One warp's rank_of_64
// runs two keys a lane against all 64, a chain of ~2.7K cycles at the end of batch 1 S=8K's
// ~7.7K-cycle finish while the other worker warps idle (bench/NOTES.md s58 r2-r4: its
// instructions' latencies, not their fetch); here each thread's chain is a quarter as long.
// `keys`: 96 keys of shared scratch at a 16-byte boundary. Meets the worker warps at named
// barrier 1; warp 0 writes the row.
template <bool kShared>
__device__ __forceinline__ void rank_only_row_of_64(const DecodeTile& t, const ListSet& set,
                                                    uint64_t* keys, int lane) {
  constexpr int kThreads = kDecodeMergeWarps * 32;
  static_assert(kThreads == 2 * 64, "two threads a key");
  const int q = threadIdx.x, k = q >> 1, half = q & 1;
  const uint64_t mine =
      k < set.count * set.len ? list_key<kShared>(set.list(k / set.len) + k % set.len) : 0;
  uint64_t* ranked = keys + 64;
  if (half == 0) keys[k] = mine;
  if (q < 32) ranked[q] = 0;
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  int rank = rank_among(keys + 32 * half, 32, mine);
  rank += __shfl_xor_sync(0xffffffffu, rank, 1);
  if (half == 0 && mine != 0 && rank < 32) ranked[rank] = mine; // keys are unique: one writer
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  if (q >= 32) return;
  M3SA_DECODE_FINISH_STAMP(3);
  t.emit(0, true, lane < t.fill ? ranked[lane] : 0, lane);
}

// Row `row`'s selection from the Hopper kernel's warp lists (more than 64 keys; `kShared`: in rank
// 0's receiving area, plain loads, else read through L2),
// by a group of `threads` worker threads (2 or 4 warps, named barrier `barrier`; q: the thread's
// index in the group; `heads`: shared memory for the set.count list heads) - where a tile has one
// or two rows, the last CTA's other warps would otherwise idle while one warp walks every list.
// The floor is the fill-th largest of the threads' maxima over the heads of their lists (list l
// is thread l % threads'): the threads of the fill largest maxima hold fill distinct keys at least
// that large, so every chosen key is at or above it - a higher floor than a warp's 32 maxima give.
// Each thread then appends its lists' keys at or above the floor to the survivors, and each
// survivor takes the slot of its rank. Read straight from L2: the heads in one pass of loads
// (kept in `heads`), and only the lists that reach the floor further - staging every list first,
// then one warp's floor and survivors, took 6.3 us of the last CTA's 8.2 us tail at batch 1 S=1M;
// this, 4.4 (bench/NOTES.md s30 r7-r8). Keys built against the floor (too many survivors) go to
// merge_row on the group's first warp.
template <int MaxK, bool kShared = false>
__device__ __forceinline__ void merge_row_in_group(const DecodeTile& t, int row, const ListSet& set,
                                                   uint64_t* heads, uint64_t* scratch, int q,
                                                   int threads, int barrier, int lane) {
  const int fill = t.fill;
  uint64_t* survivors = scratch;                  // [kSurvivorCapacity], the first warp's
  uint64_t* chosen = scratch + kSurvivorCapacity; // [32]
  uint64_t* maxima = scratch + kMergeScratchKeys; // [threads], the second warp's
  uint64_t* shared_floor = maxima + threads;
  int* held_count = reinterpret_cast<int*>(shared_floor + 1);
  const auto group_sync = [&] {
    asm volatile("bar.sync %0, %1;\n" ::"r"(barrier), "r"(threads) : "memory");
  };
  uint64_t mine = 0;
  for (int first = q; first < set.count; first += 4 * threads) {
    uint64_t head[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int l = first + u * threads;
      head[u] = l < set.count ? list_key<kShared>(set.list(l)) : 0;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int l = first + u * threads;
      if (l < set.count) heads[l] = head[u];
      mine = max(mine, head[u]);
    }
  }
  maxima[q] = mine;
  if (q == 0) *shared_floor = 0, *held_count = 0;
  group_sync();
  // Nonzero maxima are distinct keys: exactly one has fill - 1 larger ones. Only the first
  // set.count threads hold lists (the others' maxima are 0): counting over all threads took 0.5 us
  // more of batch 32's tail at S=32K (bench/NOTES.md s33 r4).
  if (mine != 0 && rank_among(maxima, (min(threads, set.count) + 7) & ~7, mine) == fill - 1)
    *shared_floor = mine;
  group_sync();
  const uint64_t floor = *shared_floor; // 0: fewer than fill threads hold a key
  if (floor != 0) {
    for (int l = q; l < set.count; l += threads) {
      if (heads[l] < floor) continue; // most lists: none of their keys is read again
      const uint64_t* list = set.list(l);
      for (int k = 0; k < set.len; k += 4) { // descending: stop below the floor
        uint64_t keys[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) keys[u] = k + u < set.len ? list_key<kShared>(list + k + u) : 0;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (keys[u] != 0 && keys[u] >= floor) {
            const int at = atomicAdd(held_count, 1);
            if (at < kSurvivorCapacity) survivors[at] = keys[u];
          }
        if (keys[3] < floor) break;
      }
    }
  }
  group_sync();
  const int held = *held_count;
  M3SA_DECODE_FINISH_STAMP(2);
  if (floor == 0 || held > kSurvivorCapacity) {
    if (q < 32) merge_row<MaxK, kShared, true>(t, row, set, scratch, lane);
    return;
  }
  rank_held_survivors(survivors, held, fill, chosen, q, threads, group_sync);
  M3SA_DECODE_FINISH_STAMP(3);
  if (q < 32) t.emit(row, true, lane < fill ? chosen[lane] : 0, lane);
}

// What a tile's ranges publish: per_split blocks a range (blocks_per_split) and the ranges that
// hold blocks; each range's lists and their length - the Hopper kernel's warp lists that may hold
// a block (published_lists: its warps take blocks_per_list blocks each; each list as long as its
// most candidates, since a list of n blocks has at most n, plus one empty list where lists x rows
// x len would be odd, so that a range's packed keys fill whole 16-byte chunks, the ranges' lists
// follow each other without a gap, and list l of every range is at l x rows x len: no division in
// the merge), or the portable kernel's one list a range. Every CTA of a tile works out the same.
struct TilePublication {
  int per_split, lists, len;
  __device__ int packed(int rows) const { return lists * rows * len; }
  __device__ int active_splits(int n_local) const { return splits_with_blocks(n_local, per_split); }
};
template <int kLists>
__device__ __forceinline__ TilePublication tile_publication(int n_local, int splits,
                                                            int min_per_split, int rows, int fill) {
  TilePublication out;
  out.per_split = blocks_per_split(n_local, splits, min_per_split);
  if constexpr (kLists > 1) {
    const PublishedLists l = published_lists(out.per_split, kLists, rows, fill);
    out.lists = l.lists, out.len = l.len;
  } else {
    out.lists = 1, out.len = min(fill, out.per_split);
  }
  return out;
}

// The Hopper kernel's cluster finish (its kClusterFinish instantiation, launched with each tile's
// ranges one cluster along grid y): rank 0's receiving area [kDecodeSm90ReceiveKeys] and its
// mbarrier, both in rank 0's shared memory; the barrier is initialised before the kernel's
// cluster_arrive_release and expects the other ranges' bytes (expect_cluster_lists). Null
// `receive`: the workspace finish.
struct ClusterLists {
  uint64_t* receive = nullptr;
  uint64_t* bar = nullptr;
};
// Whether a tile's publication (`active_splits` ranges) goes through rank 0's receiving area: it
// fits there.
__device__ __forceinline__ bool fits_cluster_receive(const TilePublication& pub, int active_splits,
                                                     int rows) {
  return int64_t{active_splits} * pub.packed(rows) <= kDecodeSm90ReceiveKeys;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Rank 0 of a clustered tile, once it knows its tile: its barrier expects the bytes every other
// range that holds blocks will push (ranges are the cluster's ranks; rank 0 writes its own keys).
// Before its stream; a push that lands first only takes the phase's byte count below zero, and
// the phase cannot complete before this arrival. One thread.
template <int kLists>
__device__ __forceinline__ void expect_cluster_lists(const DecodeTile& t, int n_local,
                                                     int min_per_split, ClusterLists cluster) {
  const TilePublication pub =
      tile_publication<kLists>(n_local, t.p->scoring.splits, min_per_split, t.geo.rows, t.fill);
  const int active_splits = pub.active_splits(n_local);
  if (blockIdx.y != 0 || !fits_cluster_receive(pub, active_splits, t.geo.rows)) return;
  const int peers = active_splits > 1 ? active_splits - 1 : 0;
  sm90::mbarrier_arrive_expect_tx(
      cluster.bar, static_cast<uint32_t>(peers * pub.packed(t.geo.rows) * sizeof(uint64_t)));
}
#endif

// After scoring: the CTA's lists go to the workspace, and the last CTA of the tile merges every
// range's lists into the rows' selections (or, with one split, the CTA merges its own). In the
// Hopper kernel's cluster instantiation (kClusterFinish, `cluster`), where they fit, the lists go
// to rank 0's receiving area instead, and rank 0 merges them: no workspace, arrival atomic or
// staging on the tile's path. Every thread of the CTA calls it (it holds CTA and cluster
// barriers); warps >= kDecodeMergeWarps only wait. `is_last`: one shared int; `min_per_split`:
// the kernel's split_block_range minimum, which sets how many ranges hold blocks.
template <int MaxK, int kLists, bool kClusterFinish = false>
__device__ __forceinline__ void
publish_and_merge(const DecodeTile& t, CtaLists<kLists> cta, int n_local, int* is_last,
                  MergeMemory memory, int min_per_split = 1, ClusterLists cluster = {}) {
  const DecodeTopkParams& p = *t.p;
  const ScoreBlocksParams& s = p.scoring;
  const int rows = t.geo.rows, fill = t.fill;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool worker = warp < kDecodeMergeWarps;
  uint64_t* scratch = memory.scratch + warp * kMergeScratchKeys;
  const auto short_row = [&](int row) { return t.selection_row(row).n <= p.top_k; };
  // The portable kernel's one list a range sits in a [64][fill] slot of its own.
  constexpr bool kWarpLists = kLists > 1;
  static_assert(kLists % 2 == 0 || !kWarpLists, "an odd list count has an empty warp after it");
  static_assert(kWarpLists || !kClusterFinish);
  const TilePublication pub =
      tile_publication<kLists>(n_local, s.splits, min_per_split, rows, fill);
  const int lists = pub.lists, len = pub.len;
  if (s.splits ==
      1) { // the CTA holds the whole tile (batches of >= 1 request per SM): no workspace
    if (!worker) return;
    M3SA_DECODE_FINISH_STAMP(0); // the one-range finish's stamps: reached, ...
    if constexpr (kWarpLists) {
      if (rows == 1 && lists * len <= 64 && !short_row(0)) {
        M3SA_DECODE_FINISH_STAMP(1);
        const ListSet set{cta.lists, int64_t{cta.row_capacity} * fill, lists, len};
        rank_only_row_of_64<true>(t, set, memory.scratch, lane);
        return;
      }
    }
    for (int row = warp; row < rows; row += kDecodeMergeWarps) {
      M3SA_DECODE_FINISH_STAMP(1); // ... a row begun, then merge_row's floor and ranked
      if (short_row(row)) {
        t.emit(row, false, 0, lane);
      } else if constexpr (!kWarpLists) { // sorted already: lane i takes the i-th
        t.emit(row, true, lane < fill ? cta.lists[row * fill + lane] : 0, lane);
      } else {
        const ListSet set{cta.lists + row * fill, int64_t{cta.row_capacity} * fill, lists, len};
        merge_row<MaxK, true, true, true>(t, row, set, scratch, lane);
      }
    }
    return;
  }
  // The best `len` of each row's lists, packed ([list][rows][len]; the portable kernel's in a
  // [64][fill] slot, a 0 key after an odd count so that 16-byte chunks read only written keys).
  static_assert(kLists * kDecodeSm90MaxRows <= kTileRows || !kWarpLists);
  const int active_splits = pub.active_splits(n_local);
  const int packed = lists * rows * len, chunks = (packed + 1) / 2; // keys, 16-byte chunks
  const auto packed_key = [&](int i) -> uint64_t {
    const int list = i / (rows * len), at = i % (rows * len);
    return i < packed ? cta.lists[(list * cta.row_capacity + at / len) * fill + at % len] : 0;
  };
  // The workspace's lists of the tile: [split][list][rows][len] (Hopper) or [split][64][fill].
  const int64_t split_stride = kWarpLists ? packed : int64_t{kTileRows} * fill;
  uint64_t* tile_lists = p.partial_lists + int64_t{blockIdx.x} * s.splits * kTileRows * fill;
  bool received = false; // rank 0 holds every range's lists at tile_lists, in its shared memory
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kClusterFinish) {
    if (cluster.receive != nullptr && fits_cluster_receive(pub, active_splits, rows)) {
      // Every rank arrived on the cluster barrier at the kernel's start, after rank 0 initialised
      // its barrier: past this wait, pushes to it are safe.
      sm90::cluster_wait();
      const bool leader = blockIdx.y == 0;
      uint64_t* range_keys = cluster.receive + int64_t{blockIdx.y} * packed; // rank 0's
      if (worker && static_cast<int>(blockIdx.y) < active_splits) {
        if (leader) {
          for (int i = threadIdx.x; i < packed; i += kScoreThreads) range_keys[i] = packed_key(i);
        } else { // packed is even: whole 16-byte chunks, 16-byte aligned
          const uint32_t bar = sm90::peer_shared_address(cluster.bar, 0);
          const uint32_t to = sm90::peer_shared_address(range_keys, 0);
          for (int i = threadIdx.x; i < chunks; i += kScoreThreads)
            sm90::push_keys_to_peer(to + 16 * i, packed_key(2 * i), packed_key(2 * i + 1), bar);
        }
      }
      if (threadIdx.x == 0) *is_last = leader; // for the stamps
      // The other ranks are done: st.async needs nothing of the sender once issued.
      if (!leader || !worker) return;
      sm90::mbarrier_wait_cluster(cluster.bar, 0); // the peers' keys, visible here
      // Rank 0's own keys, written by its worker threads, before any of them reads them.
      asm volatile("bar.sync 1, %0;\n" ::"n"(kDecodeMergeWarps * 32) : "memory");
      tile_lists = cluster.receive;
      received = true;
    }
  }
#endif
  if (!received) {
    uint64_t* mine = tile_lists + blockIdx.y * split_stride;
    // The keys of packed_key, written out rather than called: through the lambda the branch
    // inverted and, with the rest of the cluster code, every Hopper kernel's SASS moved (s45).
    if (worker)
      for (int i = threadIdx.x; i < 2 * chunks; i += kScoreThreads) {
        const int list = i / (rows * len), at = i % (rows * len);
        mine[i] =
            i < packed ? cta.lists[(list * cta.row_capacity + at / len) * fill + at % len] : 0;
      }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Release: the CTA's lists (ordered before by the barrier) are visible device-wide before
      // the arrival counts; acquire: the last CTA sees every range's lists (read through L2
      // below). One round trip where a fence before and after the atomic took three (cooperative
      // groups' grid barrier rests on the same barrier + one thread's fence pattern).
      ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> arrivals(p.arrivals[blockIdx.x]);
      const int arrived = arrivals.fetch_add(1, ::cuda::memory_order_acq_rel);
      *is_last = arrived == s.splits - 1;
      if (*is_last) arrivals.store(0, ::cuda::memory_order_relaxed); // ready for the next run
    }
    __syncthreads();
    M3SA_DECODE_FINISH_STAMP(0);
    if (!*is_last || !worker) return;
  }

  // Only the worker warps are here from now on: they meet at named barrier 1 (groups: 2, 3).
  // Lists in the workspace are read through L2 (__ldcg), rank 0's received ones by plain loads
  // (the cluster instantiation reads the workspace's so too: nothing of them sits in its L1).
  constexpr int kWarps = kDecodeMergeWarps;
  // One or two rows of Hopper warp lists, more than 64 keys a row: all worker warps on them
  // (merge_row_in_group), the lists read where they are.
  const bool in_groups = kWarpLists && rows <= kWarps / 2 && active_splits * lists * len > 64 &&
                         memory.stage != nullptr &&
                         int64_t{rows} * active_splits * lists <= memory.stage_keys;
  const bool staged = !received && !in_groups && memory.stage != nullptr &&
                      int64_t{active_splits} * 2 * chunks <= memory.stage_keys;
  if (staged) {
    for (int i = threadIdx.x; i < active_splits * chunks; i += kWarps * 32)
      cp_async_16(memory.stage + 2 * i, tile_lists + (i / chunks) * split_stride + 2 * (i % chunks),
                  true);
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory");
  }
  M3SA_DECODE_FINISH_STAMP(1);
  if (in_groups) {
    static_assert(kWarps % 2 == 0);
    const int group_warps = rows == 1 ? kWarps : kWarps / 2, row = warp / group_warps;
    if (short_row(row)) {
      if (warp % group_warps == 0) t.emit(row, false, 0, lane);
      return;
    }
    const ListSet set{tile_lists + row * len, int64_t{rows} * len, active_splits * lists, len};
    merge_row_in_group<MaxK, kClusterFinish>(t, row, set, memory.stage + row * set.count,
                                             memory.scratch + row * group_warps * kMergeScratchKeys,
                                             threadIdx.x - row * group_warps * 32, group_warps * 32,
                                             2 + row, lane);
    return;
  }
  // A warp per row, over its lists of every range; a lone row of at most 64 keys by every warp.
  if constexpr (kWarpLists) {
    if (rows == 1 && active_splits * lists * len <= 64 && !short_row(0)) {
      const ListSet set{staged ? memory.stage : tile_lists, len, active_splits * lists, len};
      if (staged)
        rank_only_row_of_64<true>(t, set, memory.scratch, lane);
      else
        rank_only_row_of_64<kClusterFinish>(t, set, memory.scratch, lane);
      return;
    }
  }
  for (int row = warp; row < rows; row += kWarps) {
    if (short_row(row)) {
      t.emit(row, false, 0, lane);
      continue;
    }
    const ListSet set{(staged ? memory.stage : tile_lists) + row * len,
                      kWarpLists ? int64_t{rows} * len
                      : staged   ? 2 * chunks
                                 : split_stride,
                      active_splits * lists, len};
    if (staged)
      merge_row<MaxK, true, kWarpLists>(t, row, set, scratch, lane);
    else
      merge_row<MaxK, kClusterFinish, kWarpLists>(t, row, set, scratch, lane);
  }
}

// MaxK: 16 or 32, the register list length of the final merge (>= the ranked slots).
template <typename StoredT, int MaxK>
__global__ void __launch_bounds__(kScoreThreads)
    decode_topk_kernel(const __grid_constant__ DecodeTopkParams p) {
  prefetch_decode_tile_metadata(p);
  DecodeTile t;
  if (!begin_decode_tile(p, &t)) return;
  extern __shared__ uint32_t smem[];
  uint64_t* lists = reinterpret_cast<uint64_t*>(smem); // [64][fill], from on_start on
  __shared__ int is_last;
  const ScoreBlocksParams& s = p.scoring;
  const int fill = t.fill;
  const int n_local = shard_local_count(s, t.geo.n_max); // this rank's blocks (all, unsharded)
  // Thread `row` owns row `row`'s list; it keeps the list's entry bar (its last key) and the
  // row's candidate range in registers, so a block that does not enter costs one compare.
  const bool owns_row = static_cast<int>(threadIdx.x) < t.geo.rows;
  const SelectionRow own = t.selection_row(owns_row ? threadIdx.x : 0);
  uint64_t* own_list = lists + threadIdx.x * fill;
  uint64_t entry_bar = 0;
  score_block_range<StoredT>(
      s, t.tile, t.geo, split_block_range(n_local, s.splits), smem,
      [&] {
        for (int i = threadIdx.x; i < t.geo.rows * fill; i += kScoreThreads) lists[i] = 0;
        __syncthreads();
      },
      [&](int, int b, float score) { // called by the owning thread only
        const uint64_t key = selection_key(score, b);
        if (fill == 0 || key <= entry_bar || !own.is_candidate(b)) return;
        insert_sorted(own_list, fill, key);
        entry_bar = own_list[fill - 1];
      });
  __syncthreads();
  publish_and_merge<MaxK>(t, CtaLists<1>{lists, kTileRows}, n_local, &is_last,
                          MergeMemory{nullptr, 0, lists});
}

} // namespace m3sa::cuda
