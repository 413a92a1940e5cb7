#pragma once
// A one-warp probe of the candidate-list merge that the decode indexer's last CTA runs
// (kernels/select_topk.cuh: lists_floor, rank_survivors, and the register-list fallback), so
// that tests can give it lists no kernel schedule produces on purpose. Built in
// list_merge_probe.cu; plain C++ here.
#include <cuda_runtime.h>

#include <cstdint>

namespace m3sa::testing {

struct ListMergeProbe {
  const uint64_t* lists; // device: list l at lists + l * stride, `len` keys each, descending,
                         // 0-padded
  int64_t stride;
  int64_t extent;        // keys of `lists` the set spans (what the shared variant stages)
  int count, len, fill;  // fill <= 32
  bool shared;           // stage the lists in shared memory first (the last CTA's staged path)
  bool sample_few_lists; // lists_floor<kSampleFewLists>: the one-range finish's floor
  uint64_t* chosen;      // device [32]: the fill best keys, descending, 0 after the last
  uint64_t* floor;       // device [1]: lists_floor's bound
  int32_t* ranked;       // device [1]: 1 = rank_survivors served it, 0 = the register-list fallback
};

// Largest `extent` the shared variant stages.
inline constexpr int64_t kListMergeProbeMaxStagedKeys = 16384;

cudaError_t run_list_merge_probe(const ListMergeProbe& probe);

// One warp's ranking of at most 64 keys (select_topk.cuh): by_ranks rank_of_64 (the decode
// merge's path where a row's lists hold that few), else best_of_64 (the context-parallel merge's
// rounds): `keys` device [64] (lane l brings keys l and 32 + l, 0 = no key), `ranked` device [32]:
// lane l's result, the key of rank l (0 past the last key).
cudaError_t run_warp_ranking_probe(const uint64_t* keys, uint64_t* ranked, bool by_ranks);

} // namespace m3sa::testing
