#pragma once
// Host side of the CUDA indexer (score_blocks, select_topk_blocks, index_topk) shared by its
// implementations (cuda/indexer.cu) and the context-parallel indexer (cuda/context_parallel.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/workspace.h"
#include "cuda/control.h"
#include "cuda/indexer_params.h"
#include "m3sa/ops.h"

namespace m3sa::cuda {

// Which kernel scores prefill rows: the portable mma.sync one (score_blocks.cuh) or the Hopper
// wgmma + TMA one (score_blocks_sm90.cuh).
enum class Scorer : int32_t { portable = 0, sm90 = 1 };

// Plan info of the scoring implementations (cuda.score_blocks.*, cuda.index_topk.*).
struct ScoringPlanInfo {
  static constexpr uint32_t kVersion = 4;
  int32_t sm_count;     // the device's SMs, read at plan time
  int32_t block_splits; // block ranges per row tile: the portable scoring and decode grids' y
  Scorer scorer;
  // 1 (cuda.index_topk.sm90_qgmma): e4m3 prefill rows scored by QGMMA, selections certified.
  int32_t tensor_core_fp8;
  // The Hopper decode kernel's ranges a tile (its grid's y, at most block_splits) and, where each
  // tile's ranges are one thread-block cluster (the cluster finish), that many; else 1.
  int32_t decode_sm90_splits;
  int32_t decode_sm90_cluster;
};

// The splits of a request on a device of `sm_count` SMs.
ScoringPlanInfo plan_scoring(const PlanRequest& request, int sm_count);

// The indexer workspace: control area, then what the op needs.
struct IndexerLayout {
  ControlArea control;                 // arrival counters: [decode tiles] (index_topk)
  ScoringSchedule* schedule = nullptr; // [1] (num_tiles below is its first field)
  int32_t* num_tiles = nullptr;        // [1]
  RowTile* tiles = nullptr;            // [tile_capacity]
  ScoringUnit* units = nullptr;        // [unit_capacity] (the SM90 scorer's unit list)
  int32_t* range_starts = nullptr;     // [range_capacity] (the SM90 schedule's scratch)
  float* scores = nullptr;             // [H, max_tokens, max_blocks] (index_topk: prefill rows)
  uint64_t* partial_lists = nullptr;   // [decode tiles, splits, 64, ranked slots] (index_topk)
  float4* key_norms = nullptr;         // [max_requests, max_blocks] (certified index_topk)
  int64_t tile_capacity = 0;
  int64_t unit_capacity = 0, range_capacity = 0;
};

// The one description of the workspace: sizes it at plan time (carver without base), carves it
// at run time. decode_only: the context-parallel indexer's scoring (no prefill tiles or scores);
// certified: the QGMMA path's key norms (ScoringPlanInfo::tensor_core_fp8).
IndexerLayout carve_indexer(const PlanRequest& request, const ScoringPlanInfo& info,
                            detail::WorkspaceCarver& carver, bool decode_only,
                            bool certified = false);

int ranked_slots(const MsaConfig& config);
int64_t decode_tile_capacity(const PlanRequest& request);
// The decode workspace's candidate lists, in (tile, range) slots of 64 rows: the plan's tiles
// times its ranges a tile, and at least what one request's tiles take (a call sizes its grid by
// its own decode requests: launch_decode_topk).
int64_t decode_list_slots(const PlanRequest& request, const ScoringPlanInfo& info);

DecodeTopkParams decode_params(const OpPlan& plan, int splits, const IndexTopkArgs& args,
                               const IndexerLayout& l);
Status launch_decode_topk(const OpPlan& plan, const DecodeTopkParams& p, const TensorView& cache,
                          cudaStream_t stream);
// Rows of `batch`, written to `topk`, with the plan's K, init and local blocks.
SelectionRows selection_rows(const OpPlan& plan, const BatchMetadata& batch,
                             const TensorView& topk);

} // namespace m3sa::cuda
