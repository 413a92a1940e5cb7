// CUDA backend host code: plans (launch shapes and workspace layout fixed from capacities), and
// run functions that only fill parameter structs and launch: no allocation, no synchronisation,
// no host reads of device data, so every run can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/norm_rope_math.h"
#include "common/workspace.h"
#include "cuda/backend.h"
#include "cuda/cuda_status.h"
#include "cuda/launchers.h"
#include "cuda/nccl_exchange.h"
#include "m3sa/context_parallel.h"

namespace m3sa::cuda {
namespace {

constexpr int kTileRows = 64;
int tile_tokens(int heads) { return std::max(1, kTileRows / heads); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Decode row tiles per request at most, and in all (the decode kernel's grid.x).
int64_t decode_tiles_per_request(const PlanRequest& request) {
  const int64_t q_len = std::min<int64_t>(kMaxDecodeQLen, request.capacities.max_tokens);
  return ceil_div(q_len, tile_tokens(request.config.num_index_heads));
}
int64_t decode_tile_capacity(const PlanRequest& request) {
  return request.capacities.max_requests * decode_tiles_per_request(request);
}
int ranked_slots(const MsaConfig& config) {
  return config.top_k - config.init_blocks - config.local_blocks;
}

// Control state, zeroed once by prepare_workspace and never per run (a reset per run would be one
// more graph node, ~2 us at batch 1): [prepared mark: 2 int32][error flag][pad][arrivals...].
// The flag accumulates until read_device_errors clears it; the arrival counters return to zero
// at the end of every decode launch.
constexpr int64_t kFlagOffset = 2;            // int32s
constexpr int64_t kArrivalsOffset = 16;       // int32s: the counters start a 64-byte line
constexpr unsigned char kPreparedByte = 0xa5; // prepare_workspace writes 8 of them

// Sparse attention: (token, KV head) pairs that may split their selection, at most the resident
// CTAs (a split count > 1 is only chosen for fewer pairs than that), and their partials.
int64_t attention_split_pairs(int sm_count) { return int64_t{kAttentionCtasPerSm} * sm_count; }
// Prefill rows run in passes of this many tokens: their per-(token, KV head, slot) partials, 8 KB
// each, stay within 1 GiB of workspace (2016 tokens at 4 KV heads and top_k 16).
int64_t attention_pass_tokens(const PlanRequest& request) {
  const int64_t per_token = int64_t{request.config.num_index_heads} * request.config.top_k *
                            kPartialFloats * int64_t{sizeof(float)};
  return std::clamp<int64_t>((int64_t{1} << 30) / per_token, 1,
                             std::max<int64_t>(1, request.capacities.max_tokens));
}
int64_t attention_pass_entries(const PlanRequest& request) {
  return attention_pass_tokens(request) * request.config.num_index_heads * request.config.top_k;
}

struct Layout {
  int32_t* control = nullptr;     // the region prepare_workspace initialises
  int32_t* error_flags = nullptr; // [1]
  int32_t* arrivals = nullptr;    // [decode tiles] (index_topk), [split pairs] (sparse_attention)
  int64_t control_bytes = 0;
  int32_t* num_tiles = nullptr;      // [1]
  RowTile* tiles = nullptr;          // [tile_capacity]
  float* scores = nullptr;           // [H, max_tokens, max_blocks] (index_topk: prefill rows)
  uint64_t* partial_lists = nullptr; // [decode tiles, splits, 64, ranked slots] (index_topk)
  float* attention_partials = nullptr; // [split pairs, kPartialFloats] (sparse_attention)
  uint32_t* entry_keys = nullptr;      // [pass entries] x 4: keys, values, sorted keys, values
  uint32_t* entry_values = nullptr;
  uint32_t* sorted_keys = nullptr;
  uint32_t* sorted_values = nullptr;
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
  float* prefill_partials = nullptr; // [pass tokens, Hkv, top_k, kPartialFloats]
  int64_t tile_capacity = 0;
};

// The one description of the workspace: sizes it at plan time, carves it at run time.
// decode_only: the context-parallel indexer's scoring (no prefill tiles or score matrix).
Layout carve(const PlanRequest& request, int splits, int sm_count,
             detail::WorkspaceCarver& carver, bool decode_only) {
  Layout l;
  const bool topk = request.op == OpKind::index_topk;
  const bool attention = request.op == OpKind::sparse_attention;
  const int64_t arrivals = topk        ? decode_tile_capacity(request)
                           : attention ? attention_split_pairs(sm_count)
                                       : 0;
  l.control = carver.take<int32_t>(kArrivalsOffset + arrivals);
  l.error_flags = l.control ? l.control + kFlagOffset : nullptr;
  l.arrivals = l.control ? l.control + kArrivalsOffset : nullptr;
  l.control_bytes = (kArrivalsOffset + arrivals) * int64_t{sizeof(int32_t)};
  const Capacities& cap = request.capacities;
  const int heads = request.config.num_index_heads;
  if (topk)
    l.partial_lists = carver.take<uint64_t>(arrivals * splits * kTileRows *
                                            std::max(1, ranked_slots(request.config)));
  if (attention) {
    l.attention_partials = carver.take<float>(attention_split_pairs(sm_count) * kPartialFloats);
    const int64_t entries = attention_pass_entries(request);
    l.entry_keys = carver.take<uint32_t>(entries);
    l.entry_values = carver.take<uint32_t>(entries);
    l.sorted_keys = carver.take<uint32_t>(entries);
    l.sorted_values = carver.take<uint32_t>(entries);
    l.sort_temp_bytes = selection_sort_temp_bytes(static_cast<int>(entries));
    l.sort_temp = carver.take<unsigned char>(l.sort_temp_bytes);
    l.prefill_partials = carver.take<float>(entries * kPartialFloats);
  }
  if (decode_only) return l;
  l.num_tiles = carver.take<int32_t>(1);
  l.tile_capacity = ceil_div(cap.max_tokens, tile_tokens(heads)) + cap.max_requests;
  if (request.op == OpKind::score_blocks || topk) l.tiles = carver.take<RowTile>(l.tile_capacity);
  if (topk)
    l.scores = carver.take<float>(int64_t{heads} * cap.max_tokens * cap.max_blocks_per_request);
  return l;
}

Layout carve(const PlanRequest& request, int splits, int sm_count, void* base, size_t* bytes) {
  detail::WorkspaceCarver carver(base);
  const Layout l = carve(request, splits, sm_count, carver, false);
  if (bytes) *bytes = carver.bytes_used();
  return l;
}

// The context-parallel workspace: decode scoring, this rank's candidates, all ranks' candidates.
struct ContextParallelLayout {
  Layout scoring;
  uint64_t* candidates = nullptr; // [H, max_tokens, ranked slots]
  uint64_t* gathered = nullptr;   // [ranks, H, max_tokens, ranked slots]
};

ContextParallelLayout carve(const ContextParallelPlan& plan, void* base, size_t* bytes) {
  detail::WorkspaceCarver carver(base);
  ContextParallelLayout c;
  c.scoring = carve(plan.request, plan.scoring.cuda_block_splits, plan.scoring.cuda_sm_count,
                    carver, true);
  const int64_t per_rank = static_cast<int64_t>(plan.candidate_bytes / sizeof(uint64_t));
  c.candidates = carver.take<uint64_t>(per_rank);
  c.gathered = carver.take<uint64_t>(per_rank * plan.shard.num_ranks);
  if (bytes) *bytes = carver.bytes_used();
  return c;
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Zero flag and counters, then the preparation mark read_device_errors checks.
Status initialise_control(const Layout& l, cudaStream_t stream) {
  M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(l.control, 0, l.control_bytes, stream));
  M3SA_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(l.control, kPreparedByte, kFlagOffset * sizeof(int32_t), stream));
  return {};
}

// index_topk leaves decode requests to the decode kernel; score_blocks schedules every request.
int first_scheduled_request(const OpPlan& plan, const BatchMetadata& batch) {
  return plan.request.op == OpKind::index_topk ? batch.num_decode_requests : 0;
}

ScheduleParams schedule_params(const OpPlan& plan, const BatchMetadata& batch, const Layout& l) {
  ScheduleParams s{};
  s.cu_q_lens = batch.cu_q_lens.ptr<const int32_t>();
  s.seq_lens = batch.seq_lens.ptr<const int32_t>();
  s.first_request = first_scheduled_request(plan, batch);
  s.num_requests = batch.num_requests;
  s.tile_tokens = tile_tokens(plan.request.config.num_index_heads);
  s.tile_capacity = static_cast<int32_t>(l.tile_capacity);
  s.tiles = l.tiles;
  s.num_tiles = l.num_tiles;
  return s;
}

ScoreBlocksParams scoring_params(const OpPlan& plan, const TensorView& q, const TensorView& cache,
                                 const BatchMetadata& batch, const Layout& l) {
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
  p.splits = plan.cuda_block_splits;
  p.scale = plan.request.config.score_scale;
  p.error_flags = l.error_flags;
  p.shard_count = 1; // unsharded: round-robin over one rank is the identity
  return p;
}

// Scores of the scheduled requests into `scores` with strides (head, token, block) and width;
// fill_tail for exported scores.
Status launch_scoring(const OpPlan& plan, const TensorView& q, const TensorView& cache,
                      const BatchMetadata& batch, const Layout& l, float* scores,
                      const int64_t (&strides)[3], int64_t width, bool fill_tail,
                      cudaStream_t stream) {
  M3SA_CUDA_RETURN_IF_ERROR(launch_schedule_tiles(schedule_params(plan, batch, l), stream));
  ScoreBlocksParams p = scoring_params(plan, q, cache, batch, l);
  p.scores = scores;
  p.score_stride_head = strides[0];
  p.score_stride_token = strides[1];
  p.score_stride_block = strides[2];
  p.score_width = static_cast<int32_t>(width);
  p.fill_tail = fill_tail ? 1 : 0;
  const dim3 grid(static_cast<unsigned>(l.tile_capacity), static_cast<unsigned>(p.splits));
  if (cache.dtype == DType::fp8_e4m3)
    M3SA_CUDA_RETURN_IF_ERROR(launch_score_blocks_fp8(p, grid, stream));
  else
    M3SA_CUDA_RETURN_IF_ERROR(launch_score_blocks_bf16(p, grid, stream));
  return {};
}

// Rows of `batch`, written to `topk`, with the plan's K, init and local blocks.
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

Status launch_selection(const OpPlan& plan, const BatchMetadata& batch, const float* scores,
                        const int64_t (&strides)[3], int64_t width, const TensorView& topk,
                        int32_t* error_flags, cudaStream_t stream) {
  SelectTopkParams p{};
  p.score_width = static_cast<int32_t>(width);
  p.error_flags = error_flags;
  p.scores = scores;
  p.score_stride_head = strides[0];
  p.score_stride_token = strides[1];
  p.score_stride_block = strides[2];
  p.rows = selection_rows(plan, batch, topk);
  p.first_request = first_scheduled_request(plan, batch);
  M3SA_CUDA_RETURN_IF_ERROR(launch_select_topk(p, stream));
  return {};
}

DecodeTopkParams decode_params(const OpPlan& plan, const IndexTopkArgs& args, const Layout& l) {
  DecodeTopkParams p{};
  p.scoring = scoring_params(plan, args.index_q, args.index_k_cache, args.batch, l);
  p.num_decode_requests = args.batch.num_decode_requests;
  p.decode_q_len = args.batch.decode_q_len;
  p.tiles_per_request = static_cast<int32_t>(ceil_div(p.decode_q_len, p.scoring.tile_tokens));
  const MsaConfig& config = plan.request.config;
  p.top_k = config.top_k;
  p.init_blocks = config.init_blocks;
  p.local_blocks = config.local_blocks;
  p.partial_lists = l.partial_lists;
  p.arrivals = l.arrivals;
  if (args.topk.present()) {
    p.topk = args.topk.ptr<int32_t>();
    p.topk_stride_head = args.topk.strides[0];
    p.topk_stride_token = args.topk.strides[1];
    p.topk_stride_k = args.topk.strides[2];
  }
  return p;
}

// Decode rows: one launch scores and selects (no score matrix).
Status launch_decode_topk(const OpPlan& plan, const DecodeTopkParams& p, DType cache_dtype,
                          cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(decode_tile_capacity(plan.request)),
                  static_cast<unsigned>(p.scoring.splits));
  const bool fp8 = cache_dtype == DType::fp8_e4m3;
  const bool short_lists = ranked_slots(plan.request.config) <= 16;
  const auto launch =
      fp8 ? (short_lists ? launch_decode_topk_fp8_k16 : launch_decode_topk_fp8_k32)
          : (short_lists ? launch_decode_topk_bf16_k16 : launch_decode_topk_bf16_k32);
  M3SA_CUDA_RETURN_IF_ERROR(launch(p, grid, stream));
  return {};
}

Layout run_layout(const OpPlan& plan, Workspace workspace) {
  return carve(plan.request, plan.cuda_block_splits, plan.cuda_sm_count, workspace.data, nullptr);
}

// Selection ranges per (decode token, KV head): enough CTAs for every resident slot when the
// decode rows are few (batch 1 reads 16 blocks with 16 x Hkv CTAs), one range when they fill the
// GPU alone; never more than the selection has blocks or the workspace has partials.
int attention_decode_splits(const OpPlan& plan, int64_t decode_pairs) {
  const int64_t resident = attention_split_pairs(plan.cuda_sm_count);
  if (decode_pairs <= 0 || decode_pairs * 2 > resident) return 1;
  return static_cast<int>(std::min<int64_t>(plan.request.config.top_k, resident / decode_pairs));
}

} // namespace

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); // no driver (the CPU-only build machine) or no device: zero devices
    return 0;
  }
  return count;
}

Status make_plan(const PlanRequest& request, OpPlan* plan) {
  int sms = 0;
  M3SA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, request.device_ordinal));
  plan->request = request;
  plan->num_threads = 1;
  plan->cuda_sm_count = sms;
  // Enough block ranges per row tile that a batch of max_requests single-tile requests fills the
  // three CTAs every SM holds (168 registers x 128 threads), in one wave: each CTA keeps one key
  // block in flight, so resident CTAs are the memory parallelism (decode at batch 1 must fill
  // the GPU; at 16-64 long requests two per SM left a third of the bandwidth unused). No cap
  // below that: batch 1 at 1M tokens capped at 256 ranges ran 113 us of scoring, with 396 ranges
  // 80 us (bench/NOTES.md, session 3).
  constexpr int64_t kResidentScoringCtasPerSm = 3;
  plan->cuda_block_splits = static_cast<int>(
      std::max<int64_t>(1, kResidentScoringCtasPerSm * sms / request.capacities.max_requests));
  carve(request, plan->cuda_block_splits, sms, nullptr, &plan->workspace_bytes);
  return {};
}

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      void* stream) {
  const Layout l = run_layout(plan, workspace);
  InsertIndexKParams p{};
  p.index_k = args.index_k.data;
  p.k_stride_token = args.index_k.strides[0];
  p.k_is_f32 = args.index_k.dtype == DType::f32;
  p.slot_mapping = args.slot_mapping.ptr<const int64_t>();
  p.slot_stride = args.slot_mapping.strides[0];
  p.num_tokens = static_cast<int32_t>(args.index_k.shape[0]);
  p.index_k_cache = args.index_k_cache.data;
  p.cache_stride_page = args.index_k_cache.strides[0];
  p.cache_stride_token = args.index_k_cache.strides[1];
  p.num_pages = static_cast<int32_t>(args.index_k_cache.shape[0]);
  p.cache_is_fp8 = args.index_k_cache.dtype == DType::fp8_e4m3;
  p.error_flags = l.error_flags;
  M3SA_CUDA_RETURN_IF_ERROR(launch_insert_index_k(
      p, static_cast<int>(plan.request.capacities.max_tokens), as_stream(stream)));
  return {};
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    void* stream) {
  const Layout l = run_layout(plan, workspace);
  const TensorView& s = args.scores;
  const int64_t strides[3] = {s.strides[0], s.strides[1], s.strides[2]};
  return launch_scoring(plan, args.index_q, args.index_k_cache, args.batch, l, s.ptr<float>(),
                        strides, s.shape[2], true, as_stream(stream));
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          void* stream) {
  const Layout l = run_layout(plan, workspace);
  const TensorView& s = args.scores;
  const int64_t strides[3] = {s.strides[0], s.strides[1], s.strides[2]};
  return launch_selection(plan, args.batch, s.ptr<const float>(), strides, s.shape[2], args.topk,
                          l.error_flags, as_stream(stream));
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  void* stream) {
  const Layout l = run_layout(plan, workspace);
  if (args.batch.num_decode_requests > 0)
    M3SA_RETURN_IF_ERROR(launch_decode_topk(plan, decode_params(plan, args, l),
                                            args.index_k_cache.dtype, as_stream(stream)));
  if (args.batch.num_requests == args.batch.num_decode_requests) return {};
  const Capacities& cap = plan.request.capacities;
  const int64_t strides[3] = {cap.max_tokens * cap.max_blocks_per_request,
                              cap.max_blocks_per_request, 1};
  M3SA_RETURN_IF_ERROR(launch_scoring(plan, args.index_q, args.index_k_cache, args.batch, l,
                                      l.scores, strides, cap.max_blocks_per_request, false,
                                      as_stream(stream)));
  return launch_selection(plan, args.batch, l.scores, strides, cap.max_blocks_per_request,
                          args.topk, l.error_flags, as_stream(stream));
}

Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& a, Workspace workspace,
                        void* stream) {
  const Layout l = run_layout(plan, workspace);
  const TensorView& table = a.kv_block_table.present() ? a.kv_block_table : a.batch.block_table;
  SparseAttentionParams p{};
  p.q = a.q.data, p.q_stride_token = a.q.strides[0], p.q_stride_head = a.q.strides[1];
  p.k_cache = a.k_cache.data;
  p.k_stride_page = a.k_cache.strides[0], p.k_stride_token = a.k_cache.strides[1];
  p.k_stride_head = a.k_cache.strides[2];
  p.v_cache = a.v_cache.data;
  p.v_stride_page = a.v_cache.strides[0], p.v_stride_token = a.v_cache.strides[1];
  p.v_stride_head = a.v_cache.strides[2];
  p.num_pages = a.k_cache.shape[0];
  p.k_scale = a.k_scale, p.v_scale = a.v_scale;
  p.topk = a.topk.ptr<const int32_t>();
  p.topk_stride_head = a.topk.strides[0], p.topk_stride_token = a.topk.strides[1];
  p.topk_stride_k = a.topk.strides[2];
  p.cu_q_lens = a.batch.cu_q_lens.ptr<const int32_t>();
  p.seq_lens = a.batch.seq_lens.ptr<const int32_t>();
  p.block_table = table.ptr<const int32_t>();
  p.block_table_stride = table.strides[0];
  p.block_table_width = static_cast<int32_t>(table.shape[1]);
  p.num_requests = a.batch.num_requests;
  p.kv_heads = static_cast<int32_t>(a.k_cache.shape[2]);
  p.group = static_cast<int32_t>(a.q.shape[1] / a.k_cache.shape[2]);
  p.top_k = plan.request.config.top_k;
  p.out = a.out.data, p.out_stride_token = a.out.strides[0], p.out_stride_head = a.out.strides[1];
  if (a.lse.present()) {
    p.lse = a.lse.ptr<float>();
    p.lse_stride_token = a.lse.strides[0], p.lse_stride_head = a.lse.strides[1];
  }
  p.partials = l.attention_partials;
  p.arrivals = l.arrivals;
  p.error_flags = l.error_flags;
  // Decode rows token-major with split selections, prefill rows block-major: any split of the
  // tokens is correct (each kernel reads its tokens' requests on the device); this one gives
  // decode rows all the CTAs and prefill rows the shared page reads.
  const bool fp8 = a.k_cache.dtype == DType::fp8_e4m3;
  const int tokens = a.batch.num_tokens;
  const int decode_tokens =
      std::min(tokens, a.batch.num_decode_requests * a.batch.decode_q_len);
  cudaStream_t s = as_stream(stream);
  if (decode_tokens > 0) {
    p.token_begin = 0, p.token_end = decode_tokens;
    p.splits = attention_decode_splits(plan, int64_t{decode_tokens} * p.kv_heads);
    M3SA_CUDA_RETURN_IF_ERROR(
        (fp8 ? launch_sparse_attention_decode_fp8 : launch_sparse_attention_decode_bf16)(
            p, static_cast<int>(attention_split_pairs(plan.cuda_sm_count)), s));
  }
  if (tokens == decode_tokens) return {};
  // Keys (KV head, page) and the sentinel above them must fit the sort's 32 bits.
  const uint64_t keys = static_cast<uint64_t>(p.kv_heads) * static_cast<uint64_t>(p.num_pages) + 1;
  int key_bits = 1;
  while (key_bits < 64 && (uint64_t{1} << key_bits) - 1 < keys) ++key_bits;
  if (key_bits > 32)
    return Status::unsupported("k_cache",
                               detail::concat("num_kv_heads x num_pages below 2^32 - 1 for the "
                                              "prefill sort, got ",
                                              keys - 1));
  p.entry_sentinel = static_cast<uint32_t>((uint64_t{1} << key_bits) - 1);
  p.entry_keys = l.entry_keys, p.entry_values = l.entry_values;
  p.sorted_keys = l.sorted_keys, p.sorted_values = l.sorted_values;
  p.prefill_partials = l.prefill_partials;
  p.splits = 1;
  const int64_t pass_tokens = attention_pass_tokens(plan.request);
  for (int begin = decode_tokens; begin < tokens; begin += static_cast<int>(pass_tokens)) {
    p.token_begin = begin;
    p.token_end = static_cast<int>(std::min<int64_t>(tokens, begin + pass_tokens));
    p.entry_count = (p.token_end - p.token_begin) * p.kv_heads * p.top_k;
    const int gather_grid = static_cast<int>(
        std::min<int64_t>(ceil_div(p.entry_count, 256), int64_t{8} * plan.cuda_sm_count));
    M3SA_CUDA_RETURN_IF_ERROR(launch_gather_selection_entries(p, gather_grid, s));
    M3SA_CUDA_RETURN_IF_ERROR(sort_selection_entries(p, l.sorted_keys, l.sorted_values, key_bits,
                                                     l.sort_temp, l.sort_temp_bytes, s));
    M3SA_CUDA_RETURN_IF_ERROR((fp8 ? launch_attend_block_members_fp8
                                   : launch_attend_block_members_bf16)(p, plan.cuda_sm_count, s));
    M3SA_CUDA_RETURN_IF_ERROR(launch_merge_token_partials(p, 4 * plan.cuda_sm_count, s));
  }
  return {};
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& a, Workspace workspace,
                        void* stream) {
  const Layout l = run_layout(plan, workspace);
  const MsaConfig& config = plan.request.config;
  NormRopeInsertParams p{};
  p.q = a.q.data, p.q_stride_token = a.q.strides[0], p.q_stride_head = a.q.strides[1];
  p.k = a.k.data, p.k_stride_token = a.k.strides[0], p.k_stride_head = a.k.strides[1];
  p.v = a.v.data, p.v_stride_token = a.v.strides[0], p.v_stride_head = a.v.strides[1];
  p.index_q = a.index_q.data;
  p.index_q_stride_token = a.index_q.strides[0], p.index_q_stride_head = a.index_q.strides[1];
  p.index_k = a.index_k.data, p.index_k_stride_token = a.index_k.strides[0];
  p.positions = a.positions.ptr<const int64_t>(), p.positions_stride = a.positions.strides[0];
  const TensorView* weights[4] = {&a.q_norm_weight, &a.k_norm_weight, &a.index_q_norm_weight,
                                  &a.index_k_norm_weight};
  for (int i = 0; i < 4; ++i) {
    p.norm_weights[i] = weights[i]->data;
    p.norm_weight_is_f32[i] = weights[i]->dtype == DType::f32;
  }
  if (a.cos_sin_cache.present()) {
    p.cos_sin_cache = a.cos_sin_cache.data;
    p.cos_sin_stride = a.cos_sin_cache.strides[0];
    p.cos_sin_rows = a.cos_sin_cache.shape[0];
    p.cos_sin_is_f32 = a.cos_sin_cache.dtype == DType::f32;
  }
  p.slot_mapping = a.slot_mapping.ptr<const int64_t>(), p.slot_stride = a.slot_mapping.strides[0];
  p.index_slot_mapping = a.index_slot_mapping.ptr<const int64_t>();
  p.index_slot_stride = a.index_slot_mapping.strides[0];
  p.q_out = a.q_out.data;
  p.q_out_stride_token = a.q_out.strides[0], p.q_out_stride_head = a.q_out.strides[1];
  p.k_cache = a.k_cache.data;
  p.k_cache_stride_page = a.k_cache.strides[0], p.k_cache_stride_token = a.k_cache.strides[1];
  p.k_cache_stride_head = a.k_cache.strides[2];
  p.v_cache = a.v_cache.data;
  p.v_cache_stride_page = a.v_cache.strides[0], p.v_cache_stride_token = a.v_cache.strides[1];
  p.v_cache_stride_head = a.v_cache.strides[2];
  p.kv_pages = a.k_cache.shape[0];
  p.kv_is_fp8 = a.k_cache.dtype == DType::fp8_e4m3;
  p.k_scale = a.k_scale, p.v_scale = a.v_scale;
  p.index_q_out = a.index_q_out.data;
  p.index_q_out_stride_token = a.index_q_out.strides[0];
  p.index_q_out_stride_head = a.index_q_out.strides[1];
  p.index_k_cache = a.index_k_cache.data;
  p.index_cache_stride_page = a.index_k_cache.strides[0];
  p.index_cache_stride_token = a.index_k_cache.strides[1];
  p.index_pages = a.index_k_cache.shape[0];
  p.index_is_fp8 = a.index_k_cache.dtype == DType::fp8_e4m3;
  p.num_tokens = static_cast<int32_t>(a.q.shape[0]);
  p.q_heads = static_cast<int32_t>(a.q.shape[1]);
  p.kv_heads = static_cast<int32_t>(a.k.shape[1]);
  p.index_heads = static_cast<int32_t>(a.index_q.shape[1]);
  p.eps = config.rms_norm_eps, p.weight_offset = config.norm_weight_offset;
  for (int i = 0; i < 32; ++i)
    p.inv_freq[i] = detail::norm_rope::inverse_frequency(config.rope_theta, i);
  p.error_flags = l.error_flags;
  M3SA_CUDA_RETURN_IF_ERROR(
      launch_norm_rope_insert(p, static_cast<int>(plan.request.capacities.max_tokens),
                              plan.cuda_sm_count, as_stream(stream)));
  return {};
}

Status prepare_workspace(const OpPlan& plan, Workspace workspace, void* stream) {
  return initialise_control(run_layout(plan, workspace), as_stream(stream));
}

Status read_device_errors(const OpPlan& plan, Workspace workspace, void* stream, int32_t* flags) {
  const Layout l = run_layout(plan, workspace);
  int32_t head[kFlagOffset + 1] = {};
  M3SA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(head, l.control, sizeof head, cudaMemcpyDeviceToHost, as_stream(stream)));
  M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(l.error_flags, 0, sizeof(int32_t), as_stream(stream)));
  M3SA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(as_stream(stream)));
  int32_t prepared;
  std::memset(&prepared, kPreparedByte, sizeof prepared);
  if (head[0] != prepared || head[1] != prepared)
    return Status::invalid_argument("workspace", "one prepared by m3sa::prepare_workspace",
                                    "no preparation mark (its error flag and counters are not "
                                    "initialised; runs on it are undefined)");
  *flags = head[kFlagOffset];
  return {};
}

Status make_context_parallel_plan(const PlanRequest& request, const ContextShard& shard,
                                  ContextParallelPlan* plan) {
  plan->request = request;
  plan->shard = shard;
  M3SA_RETURN_IF_ERROR(cuda::make_plan(request, &plan->scoring));
  plan->ranked_slots = ranked_slots(request.config);
  plan->candidate_bytes = static_cast<size_t>(request.config.num_index_heads) *
                          request.capacities.max_tokens * std::max(1, plan->ranked_slots) *
                          sizeof(uint64_t);
  carve(*plan, nullptr, &plan->workspace_bytes);
  plan->scoring.workspace_bytes = plan->workspace_bytes;
  return {};
}

Status prepare_context_parallel_workspace(const ContextParallelPlan& plan, Workspace workspace,
                                          void* stream) {
  return initialise_control(carve(plan, workspace.data, nullptr).scoring, as_stream(stream));
}

Status score_shard_candidates(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                              uint64_t* candidates, Workspace workspace, void* stream) {
  const Layout l = carve(plan, workspace.data, nullptr).scoring;
  DecodeTopkParams p = decode_params(plan.scoring, args, l);
  p.scoring.shard_count = plan.shard.num_ranks;
  p.scoring.shard_rank = plan.shard.rank;
  p.scoring.shard_span = plan.shard.mode == ShardMode::contiguous
                             ? static_cast<int32_t>(shard_span(plan.request.capacities, plan.shard))
                             : 0;
  p.candidates = candidates;
  p.candidate_token_capacity = static_cast<int32_t>(plan.request.capacities.max_tokens);
  return launch_decode_topk(plan.scoring, p, args.index_k_cache.dtype, as_stream(stream));
}

Status merge_shard_candidates(const ContextParallelPlan& plan, const uint64_t* gathered,
                              const BatchMetadata& batch, const TensorView& topk, void* stream) {
  MergeCandidatesParams p{};
  p.candidates = gathered;
  p.num_ranks = plan.shard.num_ranks;
  p.rank_stride = static_cast<int64_t>(plan.candidate_bytes / sizeof(uint64_t));
  p.rows = selection_rows(plan.scoring, batch, topk);
  M3SA_CUDA_RETURN_IF_ERROR(launch_merge_candidates(p, as_stream(stream)));
  return {};
}

Status context_parallel_index_topk(const ContextParallelPlan& plan, const IndexTopkArgs& args,
                                   void* nccl_comm, Workspace workspace, void* stream) {
  const ContextParallelLayout c = carve(plan, workspace.data, nullptr);
  M3SA_RETURN_IF_ERROR(score_shard_candidates(plan, args, c.candidates, workspace, stream));
  M3SA_RETURN_IF_ERROR(all_gather_u64(c.candidates, c.gathered,
                                      plan.candidate_bytes / sizeof(uint64_t), nccl_comm,
                                      as_stream(stream)));
  return merge_shard_candidates(plan, c.gathered, args.batch, args.topk, stream);
}

} // namespace m3sa::cuda
