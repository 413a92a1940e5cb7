// The row-tile schedule of the scoring kernels (score_blocks and the prefill rows of index_topk).
#include <cub/block/block_scan.cuh>

#include "cuda/kernels/score_blocks.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

// Row tiles in request order: one thread walks the requests (a few hundred at most), so the whole
// schedule costs one tiny launch and no host round trip.
__device__ int build_row_tiles(const ScheduleParams& p) {
  int count = 0;
  for (int r = p.first_request; r < p.num_requests; ++r) {
    const int begin = p.cu_q_lens[r], end = p.cu_q_lens[r + 1];
    // Padding requests get tiles too: exported scores of their rows are all -inf.
    for (int t = begin; t < end && count < p.tile_capacity; t += p.tile_tokens)
      p.tiles[count++] = RowTile{r, t, min(p.tile_tokens, end - t), 0};
  }
  return count;
}

__global__ void schedule_tiles_kernel(const __grid_constant__ ScheduleParams p) {
  if (threadIdx.x == 0) *p.num_tiles = build_row_tiles(p);
}

// The SM90 scorer's units: ranges of R causal blocks per tile, listed range-major (the CTAs
// running at the same time read the same pages: L2 reuse across row tiles), every tile's range 0
// and then only the ranges that hold blocks, so that the persistent CTAs, striding over the list,
// get the same number of units (a list with the empty ranges of short causal tiles left in gave
// some CTAs twice the average: bench/NOTES.md s10), with R from choose_blocks_per_range
// (indexer_traits.h) on the batch's unit counts for every R.
constexpr int kScheduleThreads = 512;

// A tile's causal blocks (0 for a tile whose metadata cannot be served: it is flagged, not read).
__device__ int tile_blocks(const ScheduleParams& p, const RowTile& tile) {
  ScoreBlocksParams g{}; // what tile_geometry reads: an unsharded request's lengths and table
  g.cu_q_lens = p.cu_q_lens;
  g.seq_lens = p.seq_lens;
  g.block_table_width = p.table_width;
  g.shard_count = 1;
  g.heads = 1;
  const TileGeometry geo = tile_geometry(g, tile);
  return geo.bad ? 0 : max(0, geo.n_max);
}

// Shared-memory room of the schedule: the tiles' block counts and the per-range counters. Larger
// batches read the tiles' counts again from global memory, longer ranges count in global memory
// (atomics there cost a round trip each).
constexpr int kScheduleSmemTiles = 4096;
constexpr int kScheduleSmemRanges = 4096;

__global__ void __launch_bounds__(kScheduleThreads)
    schedule_scoring_units_kernel(const __grid_constant__ ScheduleParams p) {
  using Scan = cub::BlockScan<int, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int num_tiles, max_blocks, range, ranges, num_units;
  __shared__ int units_for[kRangeChoices];
  __shared__ int cached_blocks[kScheduleSmemTiles];
  __shared__ int smem_counters[kScheduleSmemRanges];
  wait_for_prior_grids(); // launched to overlap the previous kernel (SM90 plans)
  allow_next_grid();      // the scorer waits for this whole grid
  if (threadIdx.x == 0) num_tiles = build_row_tiles(p), max_blocks = 0;
  for (int c = threadIdx.x; c < kRangeChoices; c += kScheduleThreads) units_for[c] = 0;
  __syncthreads();
  const auto blocks_of = [&](int t) {
    return t < kScheduleSmemTiles ? cached_blocks[t] : tile_blocks(p, p.tiles[t]);
  };
  // The passes over the tiles run warp-uniform (tile = first + lane), so that each warp adds its
  // counts to a shared counter once (32 lanes' atomics on one address serialise).
  const int lane = threadIdx.x % 32, warp_first = threadIdx.x - lane;
  int local_max = 0;
  int local_units[kRangeChoices] = {};
  for (int first = warp_first; first < num_tiles; first += kScheduleThreads) {
    const int t = first + lane;
    const int blocks = t < num_tiles ? tile_blocks(p, p.tiles[t]) : 0;
    if (t < kScheduleSmemTiles && t < num_tiles) cached_blocks[t] = blocks;
    local_max = max(local_max, blocks);
#pragma unroll
    for (int c = 0; c < kRangeChoices; ++c)
      local_units[c] += t < num_tiles ? units_of_tile(blocks, kMinBlocksPerRange + c) : 0;
  }
  local_max = __reduce_max_sync(0xffffffffu, local_max);
#pragma unroll
  for (int c = 0; c < kRangeChoices; ++c)
    local_units[c] = __reduce_add_sync(0xffffffffu, local_units[c]);
  if (lane == 0) {
    atomicMax(&max_blocks, local_max);
#pragma unroll
    for (int c = 0; c < kRangeChoices; ++c)
      if (local_units[c] != 0) atomicAdd(&units_for[c], local_units[c]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const RangeChoice choice =
        choose_blocks_per_range(units_for, max_blocks, p.unit_capacity, p.range_capacity,
                                p.persistent_ctas, kScheduleSmemRanges);
    range = choice.blocks_per_range, ranges = choice.ranges, num_units = choice.units;
  }
  __syncthreads();
  int* counters = ranges <= kScheduleSmemRanges ? smem_counters : p.range_starts;
  // Units a range: counts, then their exclusive prefix (each range's first list entry).
  for (int r = threadIdx.x; r < ranges; r += kScheduleThreads) counters[r] = 0;
  __syncthreads();
  // A tile's units are its ranges 0 .. n - 1: range r counts the lanes whose n exceeds r.
  const auto tile_units = [&](int t) {
    return t < num_tiles ? min(ranges, units_of_tile(blocks_of(t), range)) : 0;
  };
  for (int first = warp_first; first < num_tiles; first += kScheduleThreads) {
    const int n = tile_units(first + lane);
    const int warp_n = __reduce_max_sync(0xffffffffu, n);
    for (int r = 0; r < warp_n; ++r) {
      const unsigned holders = __ballot_sync(0xffffffffu, r < n);
      if (lane == 0) atomicAdd(&counters[r], __popc(holders));
    }
  }
  __syncthreads();
  int carry = 0;
  for (int first = 0; first < ranges; first += kScheduleThreads) {
    const int r = first + threadIdx.x;
    const int count = r < ranges ? counters[r] : 0;
    int start, total;
    Scan(scan_storage).ExclusiveSum(count, start, total);
    if (r < ranges) counters[r] = carry + start;
    carry += total;
    __syncthreads(); // scan_storage is reused
  }
  // Each unit takes the next entry of its range (the order within a range is free: every row's
  // scores are written by whichever CTA computes them, the same values).
  for (int first = warp_first; first < num_tiles; first += kScheduleThreads) {
    const int t = first + lane, n = tile_units(t);
    const int warp_n = __reduce_max_sync(0xffffffffu, n);
    const unsigned lower_lanes = (1u << lane) - 1;
    for (int r = 0; r < warp_n; ++r) { // one atomic a warp and range, the lanes in tile order
      const unsigned holders = __ballot_sync(0xffffffffu, r < n);
      int base = 0;
      if (lane == 0) base = atomicAdd(&counters[r], __popc(holders));
      base = __shfl_sync(0xffffffffu, base, 0);
      const int at = base + __popc(holders & lower_lanes);
      if (r < n && at < num_units) p.units[at] = ScoringUnit{t, r};
    }
  }
  if (threadIdx.x == 0) {
    *p.num_tiles = num_tiles;
    *p.schedule = ScoringSchedule{num_tiles, range, ranges, num_units};
  }
}

} // namespace

cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream) {
  if (params.schedule != nullptr) {
    LaunchOptions options;
    options.overlap_prior = true;
    return launch_with_shared_memory(schedule_scoring_units_kernel, dim3(1), kScheduleThreads, 0,
                                     stream, params, options);
  }
  schedule_tiles_kernel<<<1, 32, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
