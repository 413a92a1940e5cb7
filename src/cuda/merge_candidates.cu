// Context-parallel merge: every rank's candidate keys for a row, merged into its selection with
// the contract's order: one warp per row, the keys in rounds of best_of_64, the register bitonic
// sort of the decode kernel's short merges (one round for up to 4 ranks at top_k 16). It took
// the lane lists of the general list merge (32 keys a lane, 191 registers), whose insertions and
// pops were ~4 us of dependent instructions a row (s30 r5: 4.9 us a merge in a graph).
// Launched with programmatic dependent launch, and letting the next grid launch at once: at batch
// 1 the merge is a few hundred cycles, but between two scorings it cost 9-10 us a step (rank 0 of
// 4 at 1M: 25.5 us of scoring, 36.1 with the merge, bench/NOTES.md s30 r2; as 35.2 with PDL but
// the next grid released only after the wait, s30 r3). After an all-gather (not a PDL kernel) the
// wait is a plain stream dependency.
#include "cuda/kernels/select_topk.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

__global__ void __launch_bounds__(kSelectWarps * 32)
    merge_candidates_kernel(const __grid_constant__ MergeCandidatesParams p) {
  touch_parameters(p);
  // The next grid may launch before this one has waited: the scoring kernel of the next step then
  // becomes resident, and runs its set-up, while this step's scoring and merge finish (as
  // back-to-back scorings do). It still waits for this grid to end, which waits for the scoring.
  allow_next_grid();
  wait_for_prior_grids(); // the gathered candidates
  const int lane = threadIdx.x & 31;
  int h, t;
  if (!warp_row(p.rows, &h, &t)) return;
  const SelectionRow row = selection_row_of(p.rows, h, t);
  if (write_short_row(row, lane)) return;
  const int fill = row.fill; // 1 .. 32: slots a rank's list, keys the row chooses
  const ListSet ranks{p.candidates + (int64_t{h} * p.rows.token_capacity + t) * fill, p.rank_stride,
                      p.num_ranks, fill};
  const int total = ranks.count * fill;
  // Rounds of the 64-key bitonic sort: the first takes 64 of the ranks' keys (in list order),
  // each later one the fill best so far (lane l < fill: rank l, in slot l) and 64 - fill more
  // keys. Keys are unique (each block is one rank's), empty slots are 0 and sort last.
  uint64_t best = 0;
  int reserved = 0;
  for (int next = 0; next < total; next += 64 - reserved, reserved = fill) {
    const auto slot_key = [&](int slot) -> uint64_t {
      if (slot < reserved) return best; // slot == lane: fill <= 32
      const int i = next + slot - reserved;
      return i < total ? __ldcg(ranks.list(i / fill) + i % fill) : 0;
    };
    const uint64_t low = slot_key(lane), high = slot_key(32 + lane);
    best = best_of_64(low, high, lane);
  }
  write_selection(row, best, lane);
}

} // namespace

cudaError_t launch_merge_candidates(const MergeCandidatesParams& params, cudaStream_t stream) {
  const int rows = params.rows.heads * params.rows.token_capacity;
  LaunchOptions options;
  options.overlap_prior = true;
  return launch_with_shared_memory(
      merge_candidates_kernel,
      dim3(static_cast<unsigned>((rows + kSelectWarps - 1) / kSelectWarps)), kSelectWarps * 32, 0,
      stream, params, options);
}

} // namespace m3sa::cuda
