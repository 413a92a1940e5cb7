// The row-tile schedule of the scoring kernels (score_blocks and the prefill rows of index_topk).
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

// The SM90 scorer's units: ranges of R causal blocks per tile, R chosen so that the batch makes
// about target_units units (fewer, longer units re-stage the queries less often; enough of them
// keep every SM busy to the end), at least 4 blocks (a unit stages 256 query rows once) and at
// most 32.
constexpr int kScheduleThreads = 512;
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_scoring_units_kernel(const __grid_constant__ ScheduleParams p) {
  __shared__ int num_tiles, max_blocks;
  __shared__ unsigned long long total_blocks;
  if (threadIdx.x == 0) {
    num_tiles = build_row_tiles(p);
    max_blocks = 0;
    total_blocks = 0;
  }
  __syncthreads();
  ScoreBlocksParams g{}; // what tile_geometry reads: an unsharded request's lengths and table
  g.cu_q_lens = p.cu_q_lens;
  g.seq_lens = p.seq_lens;
  g.block_table_width = p.table_width;
  g.shard_count = 1;
  g.heads = 1;
  int local_max = 0;
  unsigned long long local_total = 0;
  for (int t = threadIdx.x; t < num_tiles; t += kScheduleThreads) {
    const TileGeometry geo = tile_geometry(g, p.tiles[t]);
    const int blocks = geo.bad ? 0 : geo.n_max;
    local_max = max(local_max, blocks);
    local_total += blocks;
  }
  atomicMax(&max_blocks, local_max);
  atomicAdd(&total_blocks, local_total);
  __syncthreads();
  if (threadIdx.x != 0) return;
  const long long per_unit =
      (static_cast<long long>(total_blocks) + p.target_units - 1) / max(1, p.target_units);
  const int range = static_cast<int>(min(32LL, max(4LL, per_unit)));
  int ranges = (max_blocks + range - 1) / range;
  if (p.fill_tail) ranges = max(ranges, 1);
  *p.num_tiles = num_tiles;
  *p.schedule = ScoringSchedule{num_tiles, range, ranges, 0};
}

} // namespace

cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream) {
  if (params.schedule != nullptr)
    schedule_scoring_units_kernel<<<1, kScheduleThreads, 0, stream>>>(params);
  else
    schedule_tiles_kernel<<<1, 32, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
