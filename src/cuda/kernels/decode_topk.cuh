#pragma once
// Decode rows of index_topk in one launch: score and select without a score matrix.
// One CTA = one row tile of a decode request (all its q_len x H rows when they fit 64) times one
// range of its causal blocks. While it scores, each row keeps its best candidates in a sorted
// list in shared memory; the CTA then publishes its lists, and the last CTA of the tile to arrive
// merges all ranges' lists into the final selection (split-K style: no second launch, no sync).
// This file holds the portable kernel (mma.sync, register-staged key blocks, SM80+) and the tile
// bookkeeping and publish / merge tail it shares with the Hopper kernel (decode_topk_sm90.cuh).
#include <cuda/atomic>

#include "cuda/kernels/score_blocks.cuh"
#include "cuda/kernels/select_topk.cuh"

namespace m3sa::cuda {

// The candidate lists, [64 rows][fill <= 32] keys, reuse the staged-query shared memory: the
// kernel needs no more than the scoring (and keeps its occupancy, and the L1 share that holds
// the key loads in flight).
inline constexpr int kDecodeSmemBytes = kScoreSmemBytes;
static_assert(kTileRows * 32 * sizeof(uint64_t) <= kReusableSmemBytes);
// Warps of a decode CTA that publish and merge (the Hopper kernel's producer warp only waits).
inline constexpr int kDecodeMergeWarps = kScoreThreads / 32;

// Inserts `key` into a row's descending list of `len` keys (one thread per row).
__device__ __forceinline__ void insert_sorted(uint64_t* list, int len, uint64_t key) {
  if (key <= list[len - 1]) return;
  int i = len - 1;
  while (i > 0 && list[i - 1] < key) {
    list[i] = list[i - 1];
    --i;
  }
  list[i] = key;
}

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

// The CTA's row tile, or false when it has nothing to score: past the batch, a q_len other than
// the one the grid was sized from (rows would be lost: flagged), or metadata that cannot be
// served (flagged; warps < kDecodeMergeWarps write -1 rows or empty candidates). Uniform per CTA.
__device__ __forceinline__ bool begin_decode_tile(const DecodeTopkParams& p, DecodeTile* t) {
  const ScoreBlocksParams& s = p.scoring;
  const int x = blockIdx.x;
  if (x >= p.num_decode_requests * p.tiles_per_request) return false;
  const int r = x / p.tiles_per_request, part = x % p.tiles_per_request;
  const int q_begin = s.cu_q_lens[r], q_len = s.cu_q_lens[r + 1] - q_begin;
  if (q_len != p.decode_q_len) {
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(s.error_flags, kDecodeQLenMismatch);
    return false;
  }
  t->p = &p;
  t->tile = RowTile{r, q_begin + part * s.tile_tokens,
                    min(s.tile_tokens, q_len - part * s.tile_tokens), 0};
  t->geo = tile_geometry(s, t->tile);
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

// After scoring: `lists` ([64 rows][fill] in shared memory, row i's best keys of this CTA's range,
// descending, 0-padded) go to the workspace; the last CTA of the tile merges every range's lists
// into the rows' selections. Every thread of the CTA calls it (it holds CTA barriers); warps
// >= kDecodeMergeWarps only wait. `is_last`: one shared int. `stage` (may be null): shared memory
// for `stage_keys` keys, free by now, where the last CTA gathers every range's lists at once
// (cp.async: all of a thread's loads in flight, where a ranking warp keeps four) before ranking
// them, when they fit.
template <int MaxK>
__device__ __forceinline__ void publish_and_merge(const DecodeTile& t, uint64_t* lists, int n_local,
                                                  int* is_last, uint64_t* stage = nullptr,
                                                  int64_t stage_keys = 0) {
  const DecodeTopkParams& p = *t.p;
  const ScoreBlocksParams& s = p.scoring;
  const int rows = t.geo.rows, fill = t.fill;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool worker = warp < kDecodeMergeWarps;
  if (s.splits == 1) { // the CTA holds the whole tile (batches of >= 1 request per SM): its lists
    if (worker)        // are the rows' candidates, sorted: lane i takes the i-th, no workspace
      for (int row = warp; row < rows; row += kDecodeMergeWarps)
        t.emit(row, t.selection_row(row).n > p.top_k, lane < fill ? lists[row * fill + lane] : 0,
               lane);
    return;
  }
  // Publish the best `len` of each row's list, packed ([tile][split][rows][len] within a
  // [64][fill] slot of the workspace, a 0 key after an odd count so that 16-byte chunks read only
  // written keys): a range of n blocks has at most n candidates, so short ranges publish short
  // lists.
  const int per_split = (n_local + s.splits - 1) / s.splits;
  const int len = min(fill, per_split);
  const int active_splits = per_split == 0 ? 0 : (n_local + per_split - 1) / per_split;
  const int64_t list_stride = int64_t{kTileRows} * fill;
  const int packed = rows * len, chunks = (packed + 1) / 2; // keys, 16-byte chunks a range
  uint64_t* tile_lists = p.partial_lists + int64_t{blockIdx.x} * s.splits * list_stride;
  uint64_t* mine = tile_lists + blockIdx.y * list_stride;
  if (worker)
    for (int i = threadIdx.x; i < 2 * chunks; i += kScoreThreads)
      mine[i] = i < packed ? lists[(i / len) * fill + i % len] : 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    // Release: the CTA's lists (ordered before by the barrier) are visible device-wide before the
    // arrival counts; acquire: the last CTA sees every range's lists (read through L2 below). One
    // round trip where a fence before and after the atomic took three (cooperative groups' grid
    // barrier rests on the same barrier + one thread's fence pattern).
    ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> arrivals(p.arrivals[blockIdx.x]);
    const int arrived = arrivals.fetch_add(1, ::cuda::memory_order_acq_rel);
    *is_last = arrived == s.splits - 1;
    if (*is_last) arrivals.store(0, ::cuda::memory_order_relaxed); // ready for the next run
  }
  __syncthreads();
  if (!*is_last || !worker) return;

  // Only the worker warps are here from now on: they meet at named barrier 1.
  constexpr int kWarps = kDecodeMergeWarps;
  const auto sync_workers = [] { asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory"); };
  const bool staged = stage != nullptr && int64_t{active_splits} * 2 * chunks <= stage_keys;
  if (staged) {
    for (int i = threadIdx.x; i < active_splits * chunks; i += kWarps * 32)
      cp_async_16(stage + 2 * i, tile_lists + (i / chunks) * list_stride + 2 * (i % chunks), true);
    cp_async_commit();
    cp_async_wait<0>();
    sync_workers();
  }
  // Row `row`'s keys first, first + step, ... over every range, into `best` (whole warps).
  const auto rank_row = [&](uint64_t(&best)[MaxK], int row, int first, int step) {
    if (staged) {
      const uint64_t* lists_s = stage + row * len;
      const uint64_t floor = lists_floor<true>(lists_s, 2 * chunks, active_splits, fill, lane);
      rank_lists<MaxK, true>(best, lists_s, 2 * chunks, len, active_splits, first, step, floor);
    } else {
      const uint64_t* lists_g = tile_lists + row * len;
      const uint64_t floor = lists_floor(lists_g, list_stride, active_splits, fill, lane);
      rank_lists<MaxK>(best, lists_g, list_stride, len, active_splits, first, step, floor);
    }
  };
  if (rows > kWarps / 2) { // three rows or more: a warp per row
    for (int row = warp; row < rows; row += kWarps) {
      if (t.selection_row(row).n <= p.top_k) {
        t.emit(row, false, 0, lane);
        continue;
      }
      uint64_t best[MaxK];
      rank_row(best, row, lane, 32);
      t.emit(row, true, merge_warp(best, fill, lane), lane);
    }
    return;
  }
  // Fewer rows than warps (batch-1 decode): the warps of a row split its keys, then the first
  // merges their lists (the candidate-list smem is free again).
  const int warps_per_row = rows == 1 ? kWarps : kWarps / 2;
  const int row = warp / warps_per_row, sub = warp % warps_per_row;
  const bool ranked = row < rows;
  const bool short_row = !ranked || t.selection_row(row).n <= p.top_k;
  uint64_t best[MaxK];
  clear_list(best);
  if (!short_row) rank_row(best, row, sub * 32 + lane, 32 * warps_per_row);
  const uint64_t chosen = short_row ? 0 : merge_warp(best, fill, lane);
  lists[warp * 32 + lane] = chosen;
  sync_workers();
  if (!ranked || sub != 0) return;
  if (short_row) {
    t.emit(row, false, 0, lane);
    return;
  }
  clear_list(best);
  for (int w = 0; w < warps_per_row; ++w) insert_key(best, lists[(warp + w) * 32 + lane]);
  t.emit(row, true, merge_warp(best, fill, lane), lane);
}

// MaxK: 16 or 32, the register list length of the final merge (>= the ranked slots).
template <typename StoredT, int MaxK>
__global__ void __launch_bounds__(kScoreThreads)
    decode_topk_kernel(const __grid_constant__ DecodeTopkParams p) {
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
  publish_and_merge<MaxK>(t, lists, n_local, &is_last);
}

} // namespace m3sa::cuda
