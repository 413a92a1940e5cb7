#pragma once
// Decode rows of index_topk in one launch: score and select without a score matrix.
// One CTA = one row tile of a decode request (all its q_len x H rows when they fit 64) times one
// range of its causal blocks. While it scores, each row keeps its best candidates in a sorted
// list in shared memory; the CTA then publishes its lists, and the last CTA of the tile to arrive
// merges all ranges' lists into the final selection (split-K style: no second launch, no sync).
#include "cuda/kernels/score_blocks.cuh"
#include "cuda/kernels/select_topk.cuh"

namespace m3sa::cuda {

// The candidate lists, [64 rows][fill <= 32] keys, reuse the staged-query shared memory: the
// kernel needs no more than the scoring (and keeps its occupancy, and the L1 share that holds
// the key loads in flight).
inline constexpr int kDecodeSmemBytes = kScoreSmemBytes;
static_assert(kTileRows * 32 * sizeof(uint64_t) <= kReusableSmemBytes);

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

// MaxK: 16 or 32, the register list length of the final merge (>= the ranked slots).
template <typename StoredT, int MaxK>
__global__ void __launch_bounds__(kScoreThreads)
    decode_topk_kernel(const __grid_constant__ DecodeTopkParams p) {
  const ScoreBlocksParams& s = p.scoring;
  const int x = blockIdx.x;
  if (x >= p.num_decode_requests * p.tiles_per_request) return;
  extern __shared__ uint32_t smem[];
  uint64_t* lists = reinterpret_cast<uint64_t*>(smem); // [64][fill], from on_start on
  __shared__ int is_last;

  const int r = x / p.tiles_per_request, part = x % p.tiles_per_request;
  const int q_begin = s.cu_q_lens[r], q_len = s.cu_q_lens[r + 1] - q_begin;
  const int tile_tokens = s.tile_tokens;
  if (q_len != p.decode_q_len) { // the grid was sized from decode_q_len: rows would be lost
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(s.error_flags, kDecodeQLenMismatch);
    return;
  }
  const RowTile tile{r, q_begin + part * tile_tokens, min(tile_tokens, q_len - part * tile_tokens),
                     0};
  const TileGeometry geo = tile_geometry(s, tile);
  const int fill = p.top_k - p.init_blocks - p.local_blocks;
  const auto selection_row = [&](int row) {
    const int t = tile.token_begin + row / s.heads;
    return make_selection_row(
        p.topk + (row % s.heads) * p.topk_stride_head + t * p.topk_stride_token, p.topk_stride_k,
        geo.seq_len == 0 ? -1 : geo.first_pos + row / s.heads, p.top_k, p.init_blocks,
        p.local_blocks);
  };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // A row's result: its selection, or (context-parallel shard) its candidate keys, lane i holding
  // the i-th best (`ranked` false: a row with nothing to rank; the merge writes it).
  const auto emit = [&](int row, bool ranked, uint64_t chosen) {
    const SelectionRow sel = selection_row(row);
    if (p.candidates) {
      uint64_t* out = p.candidates + ((row % s.heads) * int64_t{p.candidate_token_capacity} +
                                      tile.token_begin + row / s.heads) *
                                         fill;
      if (lane < fill) out[lane] = ranked ? chosen : 0;
    } else if (!ranked) {
      if (!write_short_row(sel, lane)) write_empty_row(sel, lane);
    } else {
      write_selection(sel, chosen, lane);
    }
  };
  if (geo.bad) { // nothing valid to read: -1 rows (or no candidates) and the flag
    if (blockIdx.y != 0) return;
    if (threadIdx.x == 0) atomicOr(s.error_flags, kSeqLenBeyondTable);
    for (int row = warp; row < geo.rows; row += kScoreThreads / 32) {
      if (!p.candidates)
        write_empty_row(selection_row(row), lane);
      else
        emit(row, false, 0);
    }
    return;
  }

  const int n_local = shard_local_count(s, geo.n_max); // this rank's blocks (all, unsharded)
  const BlockRange range = split_block_range(n_local, s.splits);
  // Thread `row` owns row `row`'s list; it keeps the list's entry bar (its last key) and the
  // row's candidate range in registers, so a block that does not enter costs one compare.
  const bool owns_row = static_cast<int>(threadIdx.x) < geo.rows;
  const SelectionRow own = selection_row(owns_row ? threadIdx.x : 0);
  uint64_t* own_list = lists + threadIdx.x * fill;
  uint64_t entry_bar = 0;
  score_block_range<StoredT>(
      s, tile, geo, range, smem,
      [&] {
        for (int i = threadIdx.x; i < geo.rows * fill; i += kScoreThreads) lists[i] = 0;
        __syncthreads();
      },
      [&](int, int b, float score) { // called by the owning thread only
        const uint64_t key = selection_key(score, b);
        if (fill == 0 || key <= entry_bar || !own.is_candidate(b)) return;
        insert_sorted(own_list, fill, key);
        entry_bar = own_list[fill - 1];
      });
  __syncthreads();

  // Publish the best `len` of each row's list ([tile][split][64 rows][fill] in the workspace): a
  // range of n blocks has at most n candidates, so short ranges publish short lists.
  const int per_split = (n_local + s.splits - 1) / s.splits;
  const int len = min(fill, per_split);
  const int active_splits = per_split == 0 ? 0 : (n_local + per_split - 1) / per_split;
  const int64_t list_stride = int64_t{kTileRows} * fill;
  uint64_t* tile_lists = p.partial_lists + int64_t{x} * s.splits * list_stride;
  uint64_t* mine = tile_lists + blockIdx.y * list_stride;
  for (int i = threadIdx.x; i < geo.rows * len; i += kScoreThreads)
    mine[(i / len) * fill + i % len] = lists[(i / len) * fill + i % len];
  __threadfence(); // lists visible device-wide before the arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(p.arrivals + x, 1);
    is_last = arrived == s.splits - 1;
    if (is_last) p.arrivals[x] = 0; // every range is in: ready for the next run
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence(); // the other ranges' lists are read after their arrivals

  constexpr int kWarps = kScoreThreads / 32;
  if (geo.rows > kWarps / 2) { // three rows or more: a warp per row
    for (int row = warp; row < geo.rows; row += kWarps) {
      if (selection_row(row).n <= p.top_k) {
        emit(row, false, 0);
        continue;
      }
      uint64_t best[MaxK];
      rank_lists(best, tile_lists + row * fill, list_stride, len, active_splits, lane, 32);
      emit(row, true, merge_warp(best, fill, lane));
    }
    return;
  }
  // Fewer rows than warps (batch-1 decode): the warps of a row split its keys, then the first
  // merges their lists (the candidate-list smem is free again).
  const int warps_per_row = geo.rows == 1 ? kWarps : kWarps / 2;
  const int row = warp / warps_per_row, sub = warp % warps_per_row;
  const bool ranked = row < geo.rows;
  const bool short_row = !ranked || selection_row(row).n <= p.top_k;
  uint64_t best[MaxK];
  clear_list(best);
  if (!short_row)
    rank_lists(best, tile_lists + row * fill, list_stride, len, active_splits, sub * 32 + lane,
               32 * warps_per_row);
  const uint64_t chosen = short_row ? 0 : merge_warp(best, fill, lane);
  lists[warp * 32 + lane] = chosen;
  __syncthreads();
  if (!ranked || sub != 0) return;
  if (short_row) {
    emit(row, false, 0);
    return;
  }
  clear_list(best);
  for (int w = 0; w < warps_per_row; ++w) insert_key(best, lists[(warp + w) * 32 + lane]);
  emit(row, true, merge_warp(best, fill, lane));
}

} // namespace m3sa::cuda
