// One warp runs the decode indexer's list merge (decode_topk.cuh merge_row without the selection
// write) on the probe's lists: lists_floor (sampling few lists' first keys where asked, as the
// one-range finish does), then rank_survivors with the kernels' capacities, and
// where it declines, the register lists and merge_warp; and rank_of_64, the path of rows whose
// lists hold at most 64 keys (and best_of_64, the context-parallel merge's).
#include "gpu/list_merge_probe.h"

#include "cuda/kernels/decode_topk.cuh"

namespace m3sa::testing {
namespace {

using cuda::kLiveListCapacity;
using cuda::kMergeScratchKeys;
using cuda::kSurvivorCapacity;
using cuda::ListSet;

template <bool kShared, bool kSampleFewLists>
__global__ void __launch_bounds__(32) list_merge_probe_kernel(const ListMergeProbe p) {
  extern __shared__ __align__(16) uint64_t smem[]; // [kMergeScratchKeys] scratch, then the stage
  const int lane = threadIdx.x;
  uint64_t* survivors = smem;
  uint64_t* chosen = survivors + kSurvivorCapacity;
  int32_t* live = reinterpret_cast<int32_t*>(chosen + 32);
  const uint64_t* base = p.lists;
  if (kShared) {
    uint64_t* stage = smem + kMergeScratchKeys;
    for (int64_t i = lane; i < p.extent; i += 32) stage[i] = p.lists[i];
    __syncwarp();
    base = stage;
  }
  const ListSet set{base, p.stride, p.count, p.len};
  const uint64_t floor = cuda::lists_floor<kShared, kSampleFewLists>(set, p.fill, lane);
  const bool ranked = cuda::rank_survivors<kShared>(
      set, p.fill, floor, survivors, kSurvivorCapacity, chosen, live, kLiveListCapacity, lane);
  uint64_t mine = ranked && lane < p.fill ? chosen[lane] : 0;
  if (!ranked) {
    uint64_t best[32];
    cuda::rank_lists<32, kShared>(best, set, lane, 32, floor);
    mine = cuda::merge_warp(best, p.fill, lane);
  }
  p.chosen[lane] = lane < p.fill ? mine : 0;
  if (lane == 0) *p.floor = floor, *p.ranked = ranked ? 1 : 0;
}

template <bool kShared, bool kSampleFewLists> cudaError_t launch(const ListMergeProbe& p) {
  const auto kernel = list_merge_probe_kernel<kShared, kSampleFewLists>;
  const int bytes = static_cast<int>((kMergeScratchKeys + (kShared ? p.extent : 0)) * 8);
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  kernel<<<1, 32, bytes>>>(p);
  return cudaGetLastError();
}

// kByRanks: rank_of_64 (its [96] keys of shared memory poisoned first), else best_of_64.
template <bool kByRanks>
__global__ void __launch_bounds__(32)
    warp_ranking_probe_kernel(const uint64_t* keys, uint64_t* ranked) {
  __shared__ __align__(16) uint64_t scratch[96];
  const int lane = threadIdx.x;
  for (int i = lane; i < 96; i += 32) scratch[i] = ~uint64_t{0};
  __syncwarp();
  ranked[lane] = kByRanks ? cuda::rank_of_64(keys[lane], keys[lane + 32], scratch, lane)
                          : cuda::best_of_64(keys[lane], keys[lane + 32], lane);
}

} // namespace

cudaError_t run_warp_ranking_probe(const uint64_t* keys, uint64_t* ranked, bool by_ranks) {
  if (by_ranks)
    warp_ranking_probe_kernel<true><<<1, 32>>>(keys, ranked);
  else
    warp_ranking_probe_kernel<false><<<1, 32>>>(keys, ranked);
  return cudaGetLastError();
}

cudaError_t run_list_merge_probe(const ListMergeProbe& p) {
  if (p.fill < 0 || p.fill > 32 || (p.shared && p.extent > kListMergeProbeMaxStagedKeys))
    return cudaErrorInvalidValue;
  if (p.sample_few_lists) return p.shared ? launch<true, true>(p) : launch<false, true>(p);
  return p.shared ? launch<true, false>(p) : launch<false, false>(p);
}

} // namespace m3sa::testing
