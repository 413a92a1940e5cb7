// The row-tile schedule of the scoring kernel (score_blocks and the prefill rows of index_topk).
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

// Row tiles of the scoring kernel, in request order: one thread walks the requests (a few hundred
// at most), so the whole schedule costs one tiny launch and no host round trip.
__global__ void schedule_tiles_kernel(const __grid_constant__ ScheduleParams p) {
  if (threadIdx.x != 0) return;
  int count = 0;
  for (int r = p.first_request; r < p.num_requests; ++r) {
    const int begin = p.cu_q_lens[r], end = p.cu_q_lens[r + 1];
    // Padding requests get tiles too: exported scores of their rows are all -inf.
    for (int t = begin; t < end && count < p.tile_capacity; t += p.tile_tokens)
      p.tiles[count++] = RowTile{r, t, min(p.tile_tokens, end - t), 0};
  }
  *p.num_tiles = count;
}

} // namespace

cudaError_t launch_schedule_tiles(const ScheduleParams& params, cudaStream_t stream) {
  schedule_tiles_kernel<<<1, 32, 0, stream>>>(params);
  return cudaGetLastError();
}

} // namespace m3sa::cuda
