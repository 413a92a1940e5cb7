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

// Diagnostic builds only (bench/NOTES.md s19 r5): thread 0 records clock64 after each phase of the
// 20th launch and prints them.
#ifndef M3SA_SCHEDULE_STAMPS
#define M3SA_SCHEDULE_STAMPS 0
#endif
#if M3SA_SCHEDULE_STAMPS
#include <cstdio>
static __device__ unsigned g_schedule_launch;
#define M3SA_SCHEDULE_STAMP(i)                                                                     \
  if (threadIdx.x == 0) stamps[i] = clock64()
#else
#define M3SA_SCHEDULE_STAMP(i)
#endif

// A tile's causal blocks (0 for a tile whose metadata cannot be served: it is flagged, not read),
// from its request's bounds [q_begin, q_end) and length.
__device__ int tile_blocks(const ScheduleParams& p, const RowTile& tile, int q_begin, int q_end,
                           int seq_len) {
  ScoreBlocksParams g{}; // what tile_geometry reads: an unsharded request's table width
  g.block_table_width = p.table_width;
  g.shard_count = 1;
  g.heads = 1;
  const TileGeometry geo = tile_geometry(g, tile, q_begin, q_end, seq_len);
  return geo.bad ? 0 : max(0, geo.n_max);
}
__device__ int tile_blocks(const ScheduleParams& p, const RowTile& tile) {
  return tile_blocks(p, tile, p.cu_q_lens[tile.request], p.cu_q_lens[tile.request + 1],
                     p.seq_lens[tile.request]);
}

// Shared-memory room of the schedule: the tiles' block counts and the per-range counters. Larger
// batches read the tiles' counts again from global memory, longer ranges count in global memory
// (atomics there cost a round trip each).
constexpr int kScheduleSmemTiles = 4096;
constexpr int kScheduleSmemRanges = 4096;

// Every phase runs on all 512 threads: s19 r5's stamps found 23,000 cycles (11.7 us) between the
// PDL wait and the end at C=8K S=8K H=4 (37,000 at S=128K), nearly all in serial work: one thread
// listing the tiles (6,900), one thread trying the 29 range lengths with 64-bit divisions (8,900)
// and, at long contexts, 4 warps walking 41 ranges each (11,900). The scorer waits for all of it.
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_scoring_units_kernel(const __grid_constant__ ScheduleParams p) {
  using Scan = cub::BlockScan<int, kScheduleThreads>;
  constexpr int kWarps = kScheduleThreads / 32;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int max_blocks, range, ranges, num_units;
  __shared__ int units_for[kRangeChoices];
  __shared__ int cached_blocks[kScheduleSmemTiles];
  __shared__ int smem_counters[kScheduleSmemRanges];
  __shared__ int chunk_offsets[kScheduleThreads];   // a chunk of requests' first tiles
  __shared__ int3 chunk_requests[kScheduleThreads]; // their q_begin, q_end and seq_len
#if M3SA_SCHEDULE_STAMPS
  long long stamps[10] = {};
#endif
  wait_for_prior_grids(); // launched to overlap the previous kernel (SM90 plans)
  allow_next_grid();      // the scorer waits for this whole grid
  M3SA_SCHEDULE_STAMP(0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) max_blocks = 0;
  for (int c = threadIdx.x; c < kRangeChoices; c += kScheduleThreads) units_for[c] = 0;
  __syncthreads(); // before the counts' atomics (no chunk below when there is no request)

  // Row tiles in request order (as build_row_tiles), 512 requests at a time: a thread a request
  // counts its tiles, a scan places them, and the chunk's tiles are written a thread each, with
  // their causal block counts (cached for the passes below) and per-R unit counts.
  int local_max = 0;
  int local_units[kRangeChoices] = {};
  int tiles_before = 0; // every thread's copy: the scans' totals
  for (int first = p.first_request; first < p.num_requests; first += kScheduleThreads) {
    const int r = first + threadIdx.x;
    int count = 0;
    // The request's length is loaded with its bounds, in one round trip, not behind them by
    // the tiles' geometry below (cold caches: each dependent round trip is an HBM latency on
    // the scorer's path).
    int3 bounds = make_int3(0, 0, 0);
    if (r < p.num_requests) {
      bounds = make_int3(p.cu_q_lens[r], p.cu_q_lens[r + 1], p.seq_lens[r]);
      const int q_len = bounds.y - bounds.x;
      count = q_len > 0 ? (q_len + p.tile_tokens - 1) / p.tile_tokens : 0;
    }
    int offset, total;
    Scan(scan_storage).ExclusiveSum(count, offset, total);
    chunk_offsets[threadIdx.x] = offset;
    chunk_requests[threadIdx.x] = bounds;
    __syncthreads();
    const int requests = min(kScheduleThreads, p.num_requests - first);
    for (int j = threadIdx.x; j < total && tiles_before + j < p.tile_capacity;
         j += kScheduleThreads) {
      // The chunk's request holding tile j: the last whose first tile is <= j (requests without
      // tiles share the next one's offset and come before it).
      int lo = 0, hi = requests; // chunk_offsets[lo] <= j < chunk_offsets[hi] (hi: the end)
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (chunk_offsets[mid] <= j)
          lo = mid;
        else
          hi = mid;
      }
      const int3 bounds = chunk_requests[lo]; // q_begin, q_end, seq_len
      const int request = first + lo;
      const int token = bounds.x + (j - chunk_offsets[lo]) * p.tile_tokens;
      const RowTile tile{request, token, min(p.tile_tokens, bounds.y - token), 0};
      const int t = tiles_before + j;
      p.tiles[t] = tile;
      const int blocks = tile_blocks(p, tile, bounds.x, bounds.y, bounds.z);
      if (t < kScheduleSmemTiles) cached_blocks[t] = blocks;
      local_max = max(local_max, blocks);
#pragma unroll
      for (int c = 0; c < kRangeChoices; ++c)
        local_units[c] += units_of_tile(blocks, kMinBlocksPerRange + c);
    }
    tiles_before += total;
    __syncthreads(); // scan_storage and chunk_offsets are reused
  }
  const int num_tiles = min(tiles_before, p.tile_capacity);
  M3SA_SCHEDULE_STAMP(1);
  local_max = __reduce_max_sync(0xffffffffu, local_max);
#pragma unroll
  for (int c = 0; c < kRangeChoices; ++c)
    local_units[c] = __reduce_add_sync(0xffffffffu, local_units[c]);
  if (lane == 0) { // one atomic a warp (32 lanes' atomics on one address serialise)
    atomicMax(&max_blocks, local_max);
#pragma unroll
    for (int c = 0; c < kRangeChoices; ++c)
      if (local_units[c] != 0) atomicAdd(&units_for[c], local_units[c]);
  }
  __syncthreads();
  M3SA_SCHEDULE_STAMP(2);
  if (warp == 0) { // R: the smallest key over the choices, a lane each
    const unsigned long long key =
        lane < kRangeChoices
            ? range_choice_key(units_for[lane], lane, max_blocks, p.unit_capacity, p.range_capacity,
                               p.persistent_ctas, kScheduleSmemRanges)
            : kUnfitRangeChoice;
    unsigned long long best_key = key;
#pragma unroll
    for (int step = 16; step > 0; step /= 2)
      best_key = min(best_key, __shfl_xor_sync(0xffffffffu, best_key, step));
    if (lane == 0) {
      const int best = best_key == kUnfitRangeChoice
                           ? kRangeChoices - 1
                           : kRangeChoices - 1 - static_cast<int>(best_key & 63);
      const RangeChoice choice =
          range_choice(best, units_for, max_blocks, p.unit_capacity, p.range_capacity);
      range = choice.blocks_per_range, ranges = choice.ranges, num_units = choice.units;
    }
  }
  __syncthreads();
  M3SA_SCHEDULE_STAMP(3);
  int* counters = ranges <= kScheduleSmemRanges ? smem_counters : p.range_starts;
  // Units a range: counts, then their exclusive prefix (each range's first list entry).
  for (int r = threadIdx.x; r < ranges; r += kScheduleThreads) counters[r] = 0;
  __syncthreads();
  const auto blocks_of = [&](int t) {
    return t < kScheduleSmemTiles ? cached_blocks[t] : tile_blocks(p, p.tiles[t]);
  };
  // A tile's units are its ranges 0 .. n - 1. The two passes below take (group of 32 tiles, range)
  // pairs, spread over all warps: range r of a group counts the lanes whose n exceeds r.
  const auto tile_units = [&](int t) {
    return t < num_tiles ? min(ranges, units_of_tile(blocks_of(t), range)) : 0;
  };
  const int pairs = (num_tiles + 31) / 32 * ranges;
  for (int pair = warp; pair < pairs; pair += kWarps) {
    const int r = pair % ranges;
    const unsigned holders = __ballot_sync(0xffffffffu, r < tile_units(pair / ranges * 32 + lane));
    if (lane == 0 && holders != 0) atomicAdd(&counters[r], __popc(holders));
  }
  __syncthreads();
  M3SA_SCHEDULE_STAMP(4);
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
  M3SA_SCHEDULE_STAMP(5);
  // Each unit takes the next entry of its range (the order within a range is free: every row's
  // scores are written by whichever CTA computes them, the same values): one atomic a pair, the
  // lanes in tile order.
  const unsigned lower_lanes = (1u << lane) - 1;
  for (int pair = warp; pair < pairs; pair += kWarps) {
    const int r = pair % ranges, t = pair / ranges * 32 + lane;
    const bool holds = r < tile_units(t);
    const unsigned holders = __ballot_sync(0xffffffffu, holds);
    if (holders == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(&counters[r], __popc(holders));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int at = base + __popc(holders & lower_lanes);
    if (holds && at < num_units) p.units[at] = ScoringUnit{t, r};
  }
  M3SA_SCHEDULE_STAMP(6);
  if (threadIdx.x == 0) {
    *p.num_tiles = num_tiles;
    *p.schedule = ScoringSchedule{num_tiles, range, ranges, num_units};
  }
#if M3SA_SCHEDULE_STAMPS
  if (threadIdx.x == 0 && atomicAdd(&g_schedule_launch, 1) == 20)
    printf("schedule stamps (cycles from the PDL wait): tiles %lld, choice %lld, counts %lld, "
           "scan %lld, units %lld | tiles %d R %d ranges %d units %d\n",
           stamps[2] - stamps[0], stamps[3] - stamps[0], stamps[4] - stamps[0],
           stamps[5] - stamps[0], stamps[6] - stamps[0], num_tiles, range, ranges, num_units);
#endif
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
