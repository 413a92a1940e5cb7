// CUDA indexer host side: plans (splits from the SM count, the workspace layout), and run
// functions that only fill parameter structs and launch: no allocation, no synchronisation, no
// host reads of device data, so every run can be captured in a CUDA graph.
// Implementations: cuda.score_blocks.{sm80,sm90}, cuda.select_topk_blocks,
// cuda.index_topk.{sm80,sm90}: the sm90 ones differ only in the prefill scorer (plan_info.scorer).
#include "cuda/indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/kernels/indexer_traits.h"
#include "cuda/launch.h"
#include "cuda/launchers.h"
#include "cuda/tensor_maps.h"
#include "registry/registry.h"

// Diagnostic switch (bench/micro/variant_m3sa.sh): another error bound for the QGMMA scores'
// certification, to measure what the bound costs (a bound below QGMMA's error gives wrong rows).
#ifndef M3SA_QGMMA_STEP_ERROR
#define M3SA_QGMMA_STEP_ERROR kQgmmaStepError
#endif
// Diagnostic switch: cuda.index_topk.sm90 plans as cuda.index_topk.sm90_qgmma (so that m3sa bench
// and the engines' default path measure it).
#ifndef M3SA_INDEX_TOPK_SM90_QGMMA
#define M3SA_INDEX_TOPK_SM90_QGMMA 0
#endif
// Diagnostic switch: the Hopper decode kernel's ranges a tile divided by this (fewer SMs stream
// the cache; to measure what the merge's ranges cost against what the SMs' share of the stream
// buys).
#ifndef M3SA_DECODE_SM90_SPLIT_DIVISOR
#define M3SA_DECODE_SM90_SPLIT_DIVISOR 1
#endif
// Diagnostic switch: the Hopper decode kernel's ranges a tile multiplied by this (more ranges than
// SMs, in waves of one CTA an SM), to measure whether the SMs that finish first taking the next
// ranges balances the stream better than one static range an SM. s27 r3: 2x and 3x were slower
// in every decode case (fp8 B=32 S=32K 45.0 -> 48.3 / 51.5 us): each wave's restart costs more
// than the balance gains.
#ifndef M3SA_DECODE_SM90_SPLIT_MULTIPLIER
#define M3SA_DECODE_SM90_SPLIT_MULTIPLIER 1
#endif

namespace m3sa::cuda {
namespace {

// The Hopper decode kernel's ranges a tile: one CTA an SM's worth (the diagnostic switches above
// scale it).
int64_t decode_sm90_split_count(int sm_count, int64_t max_requests) {
  return int64_t{sm_count} * kDecodeSm90CtasPerSm * M3SA_DECODE_SM90_SPLIT_MULTIPLIER /
         (max_requests * M3SA_DECODE_SM90_SPLIT_DIVISOR);
}
// The portable kernels' ranges a tile: the CTAs every SM holds (kScoringCtasPerSm), over
// `requests`.
int64_t scoring_split_count(int sm_count, int64_t requests) {
  return int64_t{kScoringCtasPerSm} * sm_count / requests;
}
// The workspace's ranges a tile for `requests` requests: those of either kernel (the Hopper one's
// are fewer, unless a diagnostic build multiplies them), at least one.
int64_t workspace_split_count(int sm_count, int64_t requests) {
  return std::max<int64_t>(
      {1, scoring_split_count(sm_count, requests), decode_sm90_split_count(sm_count, requests)});
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Decode row tiles per request at most (the decode kernel's grid.x is this x max_requests).
int64_t decode_tiles_per_request(const PlanRequest& request) {
  const int64_t q_len = std::min<int64_t>(kMaxDecodeQLen, request.capacities.max_tokens);
  return ceil_div(q_len, tile_tokens(request.config.num_index_heads));
}

int splits_of(const OpPlan& plan) {
  return detail::load_plan_info<ScoringPlanInfo>(plan).block_splits;
}

IndexerLayout run_layout(const OpPlan& plan, Workspace workspace) {
  const ScoringPlanInfo info = detail::load_plan_info<ScoringPlanInfo>(plan);
  detail::WorkspaceCarver carver(workspace.data);
  return carve_indexer(plan.request, info, carver, false, info.tensor_core_fp8 != 0);
}

// index_topk leaves decode requests to the decode kernel; score_blocks schedules every request.
int first_scheduled_request(const OpPlan& plan, const BatchMetadata& batch) {
  return plan.request.op == OpKind::index_topk ? batch.num_decode_requests : 0;
}

ScheduleParams schedule_params(const OpPlan& plan, const BatchMetadata& batch,
                               const IndexerLayout& l, int tile_tokens) {
  ScheduleParams s{};
  s.cu_q_lens = batch.cu_q_lens.ptr<const int32_t>();
  s.seq_lens = batch.seq_lens.ptr<const int32_t>();
  s.first_request = first_scheduled_request(plan, batch);
  s.num_requests = batch.num_requests;
  s.tile_tokens = tile_tokens;
  s.tile_capacity = static_cast<int32_t>(l.tile_capacity);
  s.tiles = l.tiles;
  s.num_tiles = l.num_tiles;
  return s;
}

ScoreBlocksParams scoring_params(const OpPlan& plan, int splits, const TensorView& q,
                                 const TensorView& cache, const BatchMetadata& batch,
                                 const IndexerLayout& l) {
  ScoreBlocksParams p{};
  p.index_q = q.data;
  p.q_stride_token = q.strides[0];
  p.q_stride_head = q.strides[1];
  p.index_k_cache = cache.data;
  p.cache_stride_page = cache.strides[0];
  p.cache_stride_token = cache.strides[1];
  p.num_pages = static_cast<int32_t>(cache.shape[0]);
  p.cu_q_lens = batch.cu_q_lens.ptr<const int32_t>();
  p.seq_lens = batch.seq_lens.ptr<const int32_t>();
  p.block_table = batch.block_table.ptr<const int32_t>();
  p.block_table_stride = batch.block_table.strides[0];
  p.block_table_width = static_cast<int32_t>(batch.block_table.shape[1]);
  p.tiles = l.tiles;
  p.num_tiles = l.num_tiles;
  p.heads = plan.request.config.num_index_heads;
  p.tile_tokens = tile_tokens(p.heads);
  p.splits = splits;
  p.scale = plan.request.config.score_scale;
  p.error_flags = l.control.error_flags;
  p.shard_count = 1; // unsharded: round-robin over one rank is the identity
  return p;
}

// Scores of the scheduled requests into `scores` with strides (head, token, block) and width;
// fill_tail for exported scores. Plans with ScoringPlanInfo::tensor_core_fp8 (index_topk of
// cuda.index_topk.sm90_qgmma) score e4m3 caches on the SM90 scorer by QGMMA (inexact sums, for
// selections certified afterwards); *inexact says whether they were.
Status launch_scoring(const OpPlan& plan, const TensorView& q, const TensorView& cache,
                      const BatchMetadata& batch, const IndexerLayout& l, float* scores,
                      const int64_t (&strides)[3], int64_t width, bool fill_tail,
                      cudaStream_t stream, bool* inexact = nullptr) {
  const ScoringPlanInfo info = detail::load_plan_info<ScoringPlanInfo>(plan);
  ScoreBlocksParams p = scoring_params(plan, info.block_splits, q, cache, batch, l);
  p.scores = scores;
  p.score_stride_head = strides[0];
  p.score_stride_token = strides[1];
  p.score_stride_block = strides[2];
  p.score_width = static_cast<int32_t>(width);
  p.fill_tail = fill_tail ? 1 : 0;
  const int heads = plan.request.config.num_index_heads;
  ScoreBlocksSm90Params sm90{};
  if (info.scorer == Scorer::sm90 && encode_index_k_map(cache, 128, sm90.index_k_map)) {
    ScheduleParams s = schedule_params(plan, batch, l, sm90_tile_tokens(heads));
    s.schedule = l.schedule;
    s.units = l.units;
    s.range_starts = l.range_starts;
    s.unit_capacity = static_cast<int32_t>(l.unit_capacity);
    s.range_capacity = static_cast<int32_t>(l.range_capacity);
    s.table_width = p.block_table_width;
    s.persistent_ctas = info.sm_count;
    M3SA_CUDA_RETURN_IF_ERROR(launch_schedule_tiles(s, stream));
    p.tile_tokens = sm90_tile_tokens(heads);
    sm90.query_by_tma =
        cache.dtype == DType::bf16 && encode_index_q_map(q, heads, sm90.index_q_map);
    sm90.scoring = p;
    sm90.schedule = l.schedule;
    sm90.units = l.units;
    const bool fp8 = cache.dtype == DType::fp8_e4m3, tensor_core_fp8 = info.tensor_core_fp8 != 0;
    if (inexact != nullptr) *inexact = fp8 && tensor_core_fp8;
    M3SA_CUDA_RETURN_IF_ERROR(!fp8 ? launch_score_blocks_sm90_bf16(sm90, info.sm_count, stream)
                              : tensor_core_fp8
                                  ? launch_score_blocks_sm90_fp8_qgmma(sm90, info.sm_count, stream)
                                  : launch_score_blocks_sm90_fp8(sm90, info.sm_count, stream));
    return {};
  }
  M3SA_CUDA_RETURN_IF_ERROR(
      launch_schedule_tiles(schedule_params(plan, batch, l, tile_tokens(heads)), stream));
  const dim3 grid(static_cast<unsigned>(l.tile_capacity), static_cast<unsigned>(p.splits));
  if (cache.dtype == DType::fp8_e4m3)
    M3SA_CUDA_RETURN_IF_ERROR(launch_score_blocks_fp8(p, grid, stream));
  else
    M3SA_CUDA_RETURN_IF_ERROR(launch_score_blocks_bf16(p, grid, stream));
  return {};
}

SelectTopkParams selection_params(const OpPlan& plan, const BatchMetadata& batch,
                                  const float* scores, const int64_t (&strides)[3], int64_t width,
                                  const TensorView& topk, int32_t* error_flags) {
  SelectTopkParams p{};
  p.score_width = static_cast<int32_t>(width);
  p.error_flags = error_flags;
  p.scores = scores;
  p.score_stride_head = strides[0];
  p.score_stride_token = strides[1];
  p.score_stride_block = strides[2];
  p.rows = selection_rows(plan, batch, topk);
  p.first_request = first_scheduled_request(plan, batch);
  return p;
}

Status launch_selection(const OpPlan& plan, const BatchMetadata& batch, const float* scores,
                        const int64_t (&strides)[3], int64_t width, const TensorView& topk,
                        int32_t* error_flags, cudaStream_t stream) {
  const bool after_sm90_scorer =
      detail::load_plan_info<ScoringPlanInfo>(plan).scorer == Scorer::sm90;
  M3SA_CUDA_RETURN_IF_ERROR(
      launch_select_topk(selection_params(plan, batch, scores, strides, width, topk, error_flags),
                         stream, after_sm90_scorer));
  return {};
}

// index_topk's prefill rows scored by QGMMA: the key norms, the selection, then its certification
// (certify_selection.cuh).
Status launch_certified_selection(const OpPlan& plan, const IndexTopkArgs& args,
                                  const IndexerLayout& l, const int64_t (&strides)[3],
                                  int64_t width, cudaStream_t stream) {
  const BatchMetadata& batch = args.batch;
  KeyNormParams n{};
  n.scoring = scoring_params(plan, 1, args.index_q, args.index_k_cache, batch, l);
  n.first_request = first_scheduled_request(plan, batch);
  n.num_requests = batch.num_requests;
  n.key_norms = l.key_norms;
  n.key_norm_stride = static_cast<int32_t>(plan.request.capacities.max_blocks_per_request);
  M3SA_CUDA_RETURN_IF_ERROR(
      launch_key_norms(n, static_cast<int>(plan.request.capacities.max_requests), stream));
  CertifySelectionParams c{};
  c.select =
      selection_params(plan, batch, l.scores, strides, width, args.topk, l.control.error_flags);
  M3SA_CUDA_RETURN_IF_ERROR(launch_select_topk(c.select, stream, true));
  c.scoring = n.scoring;
  c.key_norms = l.key_norms;
  c.key_norm_stride = n.key_norm_stride;
  c.error_scale = M3SA_QGMMA_STEP_ERROR * std::fabs(c.scoring.scale);
  M3SA_CUDA_RETURN_IF_ERROR(launch_certify_selection(c, stream));
  return {};
}

// The Hopper decode kernels (decode_topk_sm90.cuh), [e4m3][k32][8 warps][cluster instantiation]:
// their launch and, for the cluster instantiations, the clusters the device holds at once (null
// where there is no such kernel: the plan takes clusters for e4m3 caches of at most 16 ranked
// slots only).
struct DecodeSm90Kernel {
  cudaError_t (*launch)(const DecodeTopkSm90Params&, dim3, cudaStream_t);
  int (*active_clusters)(int cluster);
};
constexpr DecodeSm90Kernel kDecodeSm90Kernels[2][2][2][2] = {
    {{{{launch_decode_topk_sm90_bf16_k16, nullptr}, {}},
      {{launch_decode_topk_sm90_bf16_k16_w8, nullptr}, {}}},
     {{{launch_decode_topk_sm90_bf16_k32, nullptr}, {}},
      {{launch_decode_topk_sm90_bf16_k32_w8, nullptr}, {}}}},
    {{{{launch_decode_topk_sm90_fp8_k16, nullptr},
       {launch_decode_topk_sm90_fp8_k16_cluster, decode_topk_sm90_fp8_k16_cluster_active_clusters}},
      {{launch_decode_topk_sm90_fp8_k16_w8, nullptr},
       {launch_decode_topk_sm90_fp8_k16_w8_cluster,
        decode_topk_sm90_fp8_k16_w8_cluster_active_clusters}}},
     {{{launch_decode_topk_sm90_fp8_k32, nullptr}, {}},
      {{launch_decode_topk_sm90_fp8_k32_w8, nullptr}, {}}}}};

// The Hopper decode kernel's grid for a request's decode rows: one CTA an SM's worth of ranges a
// tile (never more than block_splits) - or, where a cluster instantiation exists for the plan's
// kernel and the device holds a cluster for every tile at once, the ranges of one cluster
// (decode_sm90_cluster_splits: the ranges the longest request fills, at most 16). Clusters for
// e4m3 only: they take batch 1 S=8K 0.3-0.5 us faster (7.05 -> 6.67 us on an H100), but bf16
// level, the cluster's 16 SMs of one GPC streaming twice the bytes (bench/NOTES.md s44 r2, r4,
// s45 r2).
void plan_decode_sm90(const PlanRequest& request, ScoringPlanInfo* info) {
  const MsaConfig& config = request.config;
  const int64_t sm_splits =
      decode_sm90_split_count(info->sm_count, request.capacities.max_requests);
  info->decode_sm90_splits =
      static_cast<int>(std::clamp<int64_t>(sm_splits, 1, std::max(info->block_splits, 1)));
  info->decode_sm90_cluster = 1;
  const bool fp8 = request.cache_dtype == DType::fp8_e4m3, k32 = ranked_slots(config) > 16;
  if (!fp8 || k32) return;
  const int64_t max_blocks = request.capacities.max_blocks_per_request;
  const int splits = std::min(decode_sm90_splits(sm_splits, max_blocks), info->block_splits);
  const int rows = static_cast<int>(std::min<int64_t>(
      kDecodeSm90MaxRows, int64_t{config.num_index_heads} *
                              std::min<int64_t>(kMaxDecodeQLen, request.capacities.max_tokens)));
  const int cluster = decode_sm90_cluster_splits(splits, max_blocks, rows, ranked_slots(config));
  if (cluster < 2) return;
  const DecodeSm90Kernel& kernel =
      kDecodeSm90Kernels[fp8][k32][decode_sm90_warps(cluster) == kDecodeSm90WideWarps][1];
  if (kernel.active_clusters != nullptr &&
      decode_tile_capacity(request) <= kernel.active_clusters(cluster))
    info->decode_sm90_splits = info->decode_sm90_cluster = cluster;
}

// tensor_core_fp8: e4m3 prefill rows scored by QGMMA and certified (index_topk on e4m3 caches).
Status plan_indexer_with(Scorer scorer, const PlanRequest& request, const detail::DeviceCaps& caps,
                         OpPlan* plan, bool tensor_core_fp8 = false) {
  ScoringPlanInfo info = plan_scoring(request, caps.sm_count);
  info.scorer = scorer;
  if (scorer == Scorer::sm90) plan_decode_sm90(request, &info);
  info.tensor_core_fp8 =
      tensor_core_fp8 && request.op == OpKind::index_topk && request.cache_dtype == DType::fp8_e4m3
          ? 1
          : 0;
  plan->num_threads = 1;
  detail::WorkspaceCarver carver;
  carve_indexer(request, info, carver, false, info.tensor_core_fp8 != 0);
  plan->workspace_bytes = carver.bytes_used();
  detail::store_plan_info(plan, info);
  return {};
}

Status plan_indexer(const PlanRequest& request, const detail::DeviceCaps& caps, OpPlan* plan) {
  return plan_indexer_with(Scorer::portable, request, caps, plan);
}
Status plan_indexer_sm90(const PlanRequest& request, const detail::DeviceCaps& caps, OpPlan* plan) {
  return plan_indexer_with(Scorer::sm90, request, caps, plan, M3SA_INDEX_TOPK_SM90_QGMMA != 0);
}
Status plan_index_topk_sm90_qgmma(const PlanRequest& request, const detail::DeviceCaps& caps,
                                  OpPlan* plan) {
  return plan_indexer_with(Scorer::sm90, request, caps, plan, true);
}

// The Hopper scorer and decode kernels.
Status can_run_sm90(const PlanRequest& request, const detail::DeviceCaps& caps) {
  return can_run_sm90a(
      request, caps,
      score_blocks_sm90_bf16_has_sm90a_code() && score_blocks_sm90_fp8_has_sm90a_code() &&
          decode_topk_sm90_bf16_k16_has_sm90a_code() &&
          decode_topk_sm90_bf16_k32_has_sm90a_code() && decode_topk_sm90_fp8_k16_has_sm90a_code() &&
          decode_topk_sm90_fp8_k32_has_sm90a_code() &&
          decode_topk_sm90_bf16_k16_w8_has_sm90a_code() &&
          decode_topk_sm90_bf16_k32_w8_has_sm90a_code() &&
          decode_topk_sm90_fp8_k16_w8_has_sm90a_code() &&
          decode_topk_sm90_fp8_k32_w8_has_sm90a_code(),
      "the wgmma / TMA scorer and the TMA decode kernels");
}

// The QGMMA scorer and the certification: e4m3 caches only.
Status can_run_sm90_qgmma(const PlanRequest& request, const detail::DeviceCaps& caps) {
  if (request.cache_dtype != DType::fp8_e4m3)
    return Status::unsupported(detail::concat("cache_dtype ", to_string(request.cache_dtype)),
                               "QGMMA scoring is for e4m3 index caches");
  M3SA_RETURN_IF_ERROR(can_run_sm90(request, caps));
  return can_run_sm90a(request, caps, score_blocks_sm90_fp8_qgmma_has_sm90a_code(),
                       "the QGMMA scorer");
}

Status prepare_indexer(const OpPlan& plan, Workspace workspace, void* stream) {
  return initialise_control_area(run_layout(plan, workspace).control, stream);
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    const ExecContext& ctx) {
  const IndexerLayout l = run_layout(plan, workspace);
  const TensorView& s = args.scores;
  const int64_t strides[3] = {s.strides[0], s.strides[1], s.strides[2]};
  return launch_scoring(plan, args.index_q, args.index_k_cache, args.batch, l, s.ptr<float>(),
                        strides, s.shape[2], true, as_stream(ctx.stream));
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext& ctx) {
  const IndexerLayout l = run_layout(plan, workspace);
  const TensorView& s = args.scores;
  const int64_t strides[3] = {s.strides[0], s.strides[1], s.strides[2]};
  return launch_selection(plan, args.batch, s.ptr<const float>(), strides, s.shape[2], args.topk,
                          l.control.error_flags, as_stream(ctx.stream));
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext& ctx) {
  const IndexerLayout l = run_layout(plan, workspace);
  const cudaStream_t stream = as_stream(ctx.stream);
  if (args.batch.num_decode_requests > 0)
    M3SA_RETURN_IF_ERROR(launch_decode_topk(plan, decode_params(plan, splits_of(plan), args, l),
                                            args.index_k_cache, stream));
  if (args.batch.num_requests == args.batch.num_decode_requests) return {};
  const Capacities& cap = plan.request.capacities;
  const int64_t strides[3] = {cap.max_tokens * cap.max_blocks_per_request,
                              cap.max_blocks_per_request, 1};
  bool inexact = false;
  M3SA_RETURN_IF_ERROR(launch_scoring(plan, args.index_q, args.index_k_cache, args.batch, l,
                                      l.scores, strides, cap.max_blocks_per_request, false, stream,
                                      &inexact));
  if (inexact)
    return launch_certified_selection(plan, args, l, strides, cap.max_blocks_per_request, stream);
  return launch_selection(plan, args.batch, l.scores, strides, cap.max_blocks_per_request,
                          args.topk, l.control.error_flags, stream);
}

} // namespace

ScoringPlanInfo plan_scoring(const PlanRequest& request, int sm_count) {
  // Enough block ranges per row tile that a batch of max_requests single-tile requests fills the
  // CTAs every SM holds, in one wave: each CTA keeps one key block in flight, so resident CTAs
  // are the memory parallelism (decode at batch 1 must fill the GPU; at 16-64 long requests two
  // per SM left a third of the bandwidth unused). No cap below that: batch 1 at 1M tokens capped
  // at 256 ranges ran 113 us of scoring, with 396 ranges 80 us (bench/NOTES.md, session 3).
  ScoringPlanInfo info{};
  info.sm_count = sm_count;
  info.scorer = Scorer::portable;
  info.block_splits =
      static_cast<int32_t>(workspace_split_count(sm_count, request.capacities.max_requests));
  return info;
}

int ranked_slots(const MsaConfig& config) {
  return config.top_k - config.init_blocks - config.local_blocks;
}

int64_t decode_tile_capacity(const PlanRequest& request) {
  return request.capacities.max_requests * decode_tiles_per_request(request);
}

int64_t decode_list_slots(const PlanRequest& request, const ScoringPlanInfo& info) {
  return decode_list_slots(decode_tile_capacity(request), info.block_splits,
                           decode_tiles_per_request(request),
                           workspace_split_count(info.sm_count, 1));
}

IndexerLayout carve_indexer(const PlanRequest& request, const ScoringPlanInfo& info,
                            detail::WorkspaceCarver& carver, bool decode_only, bool certified) {
  IndexerLayout l;
  const bool topk = request.op == OpKind::index_topk;
  const int64_t arrivals = topk ? decode_tile_capacity(request) : 0;
  l.control = take_control_area(carver, arrivals);
  const Capacities& cap = request.capacities;
  const int heads = request.config.num_index_heads;
  if (topk)
    l.partial_lists = carver.take<uint64_t>(decode_list_slots(request, info) * kTileRows *
                                            std::max(1, ranked_slots(request.config)));
  if (decode_only) return l;
  l.schedule = carver.take<ScoringSchedule>(1);
  l.num_tiles = &l.schedule->num_tiles;
  l.tile_capacity = ceil_div(cap.max_tokens, tile_tokens(heads)) + cap.max_requests;
  if (request.op == OpKind::score_blocks || topk) {
    l.tiles = carver.take<RowTile>(l.tile_capacity);
    // The SM90 schedule's unit list: at most every tile of 256 rows times its ranges of
    // kMinBlocksPerRange blocks (int32 entries: far below what the scores of those rows take).
    l.range_capacity = ceil_div(cap.max_blocks_per_request, kMinBlocksPerRange);
    l.unit_capacity = std::min<int64_t>(
        std::numeric_limits<int32_t>::max(),
        (ceil_div(cap.max_tokens, sm90_tile_tokens(heads)) + cap.max_requests) * l.range_capacity);
    l.units = carver.take<ScoringUnit>(l.unit_capacity);
    l.range_starts = carver.take<int32_t>(l.range_capacity);
  }
  if (topk)
    l.scores = carver.take<float>(int64_t{heads} * cap.max_tokens * cap.max_blocks_per_request);
  if (certified) l.key_norms = carver.take<float4>(cap.max_requests * cap.max_blocks_per_request);
  return l;
}

SelectionRows selection_rows(const OpPlan& plan, const BatchMetadata& batch,
                             const TensorView& topk) {
  const MsaConfig& config = plan.request.config;
  SelectionRows rows{};
  rows.cu_q_lens = batch.cu_q_lens.ptr<const int32_t>();
  rows.seq_lens = batch.seq_lens.ptr<const int32_t>();
  rows.num_requests = batch.num_requests;
  rows.num_tokens = batch.num_tokens;
  rows.token_capacity = static_cast<int32_t>(plan.request.capacities.max_tokens);
  rows.topk = topk.ptr<int32_t>();
  rows.topk_stride_head = topk.strides[0];
  rows.topk_stride_token = topk.strides[1];
  rows.topk_stride_k = topk.strides[2];
  rows.heads = config.num_index_heads;
  rows.top_k = config.top_k;
  rows.local_blocks = config.local_blocks;
  rows.init_blocks = config.init_blocks;
  return rows;
}

DecodeTopkParams decode_params(const OpPlan& plan, int splits, const IndexTopkArgs& args,
                               const IndexerLayout& l) {
  DecodeTopkParams p{};
  p.scoring = scoring_params(plan, splits, args.index_q, args.index_k_cache, args.batch, l);
  p.num_decode_requests = args.batch.num_decode_requests;
  p.decode_q_len = args.batch.decode_q_len;
  p.tiles_per_request = static_cast<int32_t>(ceil_div(p.decode_q_len, p.scoring.tile_tokens));
  const MsaConfig& config = plan.request.config;
  p.top_k = config.top_k;
  p.init_blocks = config.init_blocks;
  p.local_blocks = config.local_blocks;
  p.partial_lists = l.partial_lists;
  p.arrivals = l.control.arrivals;
  if (args.topk.present()) {
    p.topk = args.topk.ptr<int32_t>();
    p.topk_stride_head = args.topk.strides[0];
    p.topk_stride_token = args.topk.strides[1];
    p.topk_stride_k = args.topk.strides[2];
  }
  return p;
}

// Decode rows: one launch scores and selects (no score matrix). An sm90 plan streams the cache
// by TMA where a request's rows fit the Hopper kernel's one n8 MMA tile and TMA can address the
// cache view; the portable kernel takes the rest.
Status launch_decode_topk(const OpPlan& plan, const DecodeTopkParams& p, const TensorView& cache,
                          cudaStream_t stream) {
  const bool fp8 = cache.dtype == DType::fp8_e4m3;
  const bool short_lists = ranked_slots(plan.request.config) <= 16;
  const ScoringPlanInfo info = detail::load_plan_info<ScoringPlanInfo>(plan);
  const int64_t rows = int64_t{p.decode_q_len} * plan.request.config.num_index_heads;
  // The call's grid, from its own decode requests rather than the plan's capacity (as the
  // attention's decode splits): one CTA an SM's worth of ranges over the call's tiles. Sized by
  // max_requests, a plan for 256 requests ran batch 1 as one CTA a request, streaming a whole
  // index cache through one SM. The workspace holds the lists of any call (decode_list_slots).
  const int64_t requests = std::max(p.num_decode_requests, 1);
  const int64_t tiles =
      std::min(decode_tile_capacity(plan.request), requests * p.tiles_per_request);
  const int64_t slots = decode_list_slots(plan.request, info);
  const auto call_splits = [&](int64_t ranges) { return decode_call_splits(ranges, tiles, slots); };
  // Ranges a tile of the warps decode_sm90_warps picks for that many; a plan that takes the
  // cluster finish keeps its ranges (the cluster instantiation was chosen for them, and a call
  // has at most the plan's requests, each cluster of which the device holds at once).
  const int sm90_splits = info.decode_sm90_cluster > 1
                              ? std::clamp(info.decode_sm90_splits, 1, p.scoring.splits)
                              : call_splits(decode_sm90_split_count(info.sm_count, requests));
  const bool clustered = info.decode_sm90_cluster > 1 && info.decode_sm90_cluster == sm90_splits;
  const int warps = decode_sm90_warps(sm90_splits);
  DecodeTopkSm90Params sm90{};
  if (info.scorer == Scorer::sm90 && rows <= kDecodeSm90MaxRows &&
      encode_index_k_map(cache, decode_sm90_box_tokens(warps), sm90.index_k_map)) {
    sm90.decode = p;
    sm90.decode.scoring.splits = sm90_splits;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(sm90_splits));
    const DecodeSm90Kernel& kernel =
        kDecodeSm90Kernels[fp8][!short_lists][warps == kDecodeSm90WideWarps][clustered];
    if (kernel.launch == nullptr)
      return Status(StatusCode::internal,
                    "a cluster plan for a Hopper decode kernel without a cluster instantiation");
    M3SA_CUDA_RETURN_IF_ERROR(kernel.launch(sm90, grid, stream));
    return {};
  }
  DecodeTopkParams portable = p;
  portable.scoring.splits = call_splits(scoring_split_count(info.sm_count, requests));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(portable.scoring.splits));
  const auto launch =
      fp8 ? (short_lists ? launch_decode_topk_fp8_k16 : launch_decode_topk_fp8_k32)
          : (short_lists ? launch_decode_topk_bf16_k16 : launch_decode_topk_bf16_k32);
  M3SA_CUDA_RETURN_IF_ERROR(launch(portable, grid, stream));
  return {};
}

} // namespace m3sa::cuda

namespace m3sa::detail {

extern const Implementation kCudaScoreBlocksSm80, kCudaScoreBlocksSm90, kCudaSelectTopkBlocks,
    kCudaIndexTopkSm80, kCudaIndexTopkSm90, kCudaIndexTopkSm90Qgmma;

const Implementation kCudaScoreBlocksSm80 = {
    "cuda.score_blocks.sm80",
    "mma.sync tensor-core block maxima (bf16; e4m3 MMA on SM89+), row tiles x block ranges",
    Backend::cuda,
    OpKind::score_blocks,
    0,
    cuda::can_run_sm80,
    cuda::plan_indexer,
    cuda::score_blocks,
    cuda::prepare_control_area,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

const Implementation kCudaScoreBlocksSm90 = {
    "cuda.score_blocks.sm90",
    "wgmma + TMA block maxima, warp-specialised persistent CTAs, 256-row tiles (H heads of a "
    "token in M); caches TMA cannot address fall back to the sm80 kernel",
    Backend::cuda,
    OpKind::score_blocks,
    1,
    cuda::can_run_sm90,
    cuda::plan_indexer_sm90,
    cuda::score_blocks,
    cuda::prepare_control_area,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

const Implementation kCudaSelectTopkBlocks = {
    "cuda.select_topk_blocks",
    "one warp per row: 64-bit (score rank, block id) keys, forced blocks, ascending ids",
    Backend::cuda,
    OpKind::select_topk_blocks,
    0,
    cuda::can_run_sm80,
    cuda::plan_indexer,
    cuda::select_topk_blocks,
    cuda::prepare_control_area,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

const Implementation kCudaIndexTopkSm80 = {
    "cuda.index_topk.sm80",
    "decode: score + select in one split-K launch; prefill: score_blocks then select_topk_blocks",
    Backend::cuda,
    OpKind::index_topk,
    0,
    cuda::can_run_sm80,
    cuda::plan_indexer,
    cuda::index_topk,
    cuda::prepare_indexer,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

const Implementation kCudaIndexTopkSm90 = {
    "cuda.index_topk.sm90",
    "decode: requests of <= 8 rows stream the index cache by TMA (decode_topk_sm90), others as "
    "sm80; prefill: the wgmma + TMA scorer (cuda.score_blocks.sm90), then select_topk_blocks",
    Backend::cuda,
    OpKind::index_topk,
    1,
    cuda::can_run_sm90,
    cuda::plan_indexer_sm90,
    cuda::index_topk,
    cuda::prepare_indexer,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

const Implementation kCudaIndexTopkSm90Qgmma = {
    "cuda.index_topk.sm90_qgmma",
    "as cuda.index_topk.sm90, but e4m3 prefill rows are scored by e4m3 wgmma (QGMMA, inexact "
    "sums) and every row's selection is certified against a measured error bound, the blocks near "
    "its K-th score rescored exactly (certify_selection.cuh); opt-in: slower than the widened "
    "scorer except at 1M tokens so far (bench/NOTES.md s17)",
    Backend::cuda,
    OpKind::index_topk,
    0,
    cuda::can_run_sm90_qgmma,
    cuda::plan_index_topk_sm90_qgmma,
    cuda::index_topk,
    cuda::prepare_indexer,
    cuda::read_control_errors,
    cuda::ScoringPlanInfo::kVersion};

} // namespace m3sa::detail
