// CUDA sparse_attention host side. Implementations: cuda.sparse_attention.sm80 (mma.sync, SM80+)
// and cuda.sparse_attention.sm90 (the same, but decode rows stream K/V by TMA:
// sparse_attention_decode_sm90.cuh, and the prefill's attend step runs on wgmma fed by TMA:
// sparse_attention_prefill_sm90.cuh, where the views allow it).
// Decode rows run token-major (sparse_attention_decode.cuh): one token per CTA, its selection
// split over CTAs when the decode rows alone cannot fill the GPU, merged in a cluster or by the
// last CTA to arrive. Prefill rows run block-major (sparse_attention_prefill.cuh) in passes whose
// per-(token, KV head, slot) partials fit the workspace. Grids depend on the plan (the SM count)
// and the batch's host-side counts (fixed within a captured graph); lengths, selections and
// tables are read on the device.
#include <algorithm>

#include "common/check.h"
#include "cuda/control.h"
#include "cuda/decode_splits.h"
#include "cuda/launch.h"
#include "cuda/launchers.h"
#include "cuda/tensor_maps.h"
#include "registry/registry.h"

namespace m3sa::cuda {
namespace {

struct AttentionPlanInfo {
  static constexpr uint32_t kVersion = 7;
  int32_t sm_count;
  int32_t pass_tokens;     // prefill tokens per block-major pass
  int64_t sort_temp_bytes; // CUB's radix sort scratch for a pass's entries, asked once at plan time
  // Decode clusters of 2, 4, 8, 16 CTAs the device holds at once ([i]: 2^(i+1) CTAs; all 0 where
  // the splits merge in the workspace).
  int32_t active_clusters[4];
  // 1 (cuda.sparse_attention.sm90): decode rows take the TMA kernel where the K/V views allow it
  // and no cluster is chosen, the decode kernels overlap the previous kernel (PDL), and prefill
  // passes attend on the wgmma kernel where q, K and V are TMA-addressable.
  int32_t sm90;
};

// (token, KV head) pairs that may split their selection: at most the resident CTAs, since a
// split count > 1 is only chosen for fewer pairs than that.
int64_t split_pairs(int sm_count) { return int64_t{kAttentionCtasPerSm} * sm_count; }

struct AttentionLayout {
  ControlArea control;   // arrivals: [split pairs]
  float* split_partials; // [split pairs, kPartialFloats]
  uint32_t* entry_keys;  // [pass entries] each: keys, values, sorted keys, sorted values
  uint32_t* entry_values;
  uint32_t* sorted_keys;
  uint32_t* sorted_values;
  void* sort_temp;
  size_t sort_temp_bytes;
  // The counting sort: what is zeroed before a pass's gather (counting_zeroed_words, at most
  // for kCountingSortBins keys and kCountingSortWords bitmap words), the words' ranks
  // [kCountingSortWords], the keys' totals [kCountingSortBins] and the live entries [1].
  uint32_t* counting_zeroed;
  uint32_t* key_token_ranks;
  uint32_t* key_totals;
  int32_t* live_entries;
  unsigned char* prefill_partials; // [pass tokens, Hkv, top_k] compact partials
  int32_t* union_counts;           // [Hkv * union tiles] (attention_params.h)
  uint32_t* union_pages;           // [Hkv * union tiles, kUnionPages]
  uint64_t* union_visible;         // [Hkv * union tiles, kUnionPages]
  uint32_t* union_listed;          // [kUnionPages, Hkv * union tiles]
  uint32_t* union_queue;           // [kUnionQueueWords] where the pass does not sort by counting
  // sm90 plans: the union tiles' fp16 V (attention_params.h kUnionValueCells; 128 MB of pages)
  uint32_t* union_value_keys = nullptr;  // [kUnionValueCells]
  uint32_t* union_value_forms = nullptr; // [kUnionValueCells]
  uint32_t* union_value_cells = nullptr; // [Hkv * union tiles, kUnionPages]
  uint16_t* union_values = nullptr;      // [kUnionValueCells, 128, 128] fp16
};

// Entries of a prefill pass: one per (token, KV head, selection slot).
int64_t pass_entries(const PlanRequest& request, const AttentionPlanInfo& info) {
  return int64_t{info.pass_tokens} * request.config.num_index_heads * request.config.top_k;
}
// Page-union tiles of `tokens` pass tokens, over `kv_heads` KV heads.
int64_t union_tile_count(int64_t tokens, int64_t kv_heads) {
  return union_tiles_of(tokens) * kv_heads;
}

AttentionLayout carve_attention(const PlanRequest& request, const AttentionPlanInfo& info,
                                detail::WorkspaceCarver& carver) {
  AttentionLayout l;
  const int64_t pairs = split_pairs(info.sm_count);
  l.control = take_control_area(carver, pairs);
  l.split_partials = carver.take<float>(pairs * kPartialFloats);
  const int64_t entries = pass_entries(request, info);
  l.entry_keys = carver.take<uint32_t>(entries);
  l.entry_values = carver.take<uint32_t>(entries);
  l.sorted_keys = carver.take<uint32_t>(entries);
  l.sorted_values = carver.take<uint32_t>(entries);
  l.sort_temp_bytes = static_cast<size_t>(info.sort_temp_bytes);
  l.sort_temp = carver.take<unsigned char>(l.sort_temp_bytes);
  l.counting_zeroed =
      carver.take<uint32_t>(counting_zeroed_words(kCountingSortBins, kCountingSortWords));
  l.key_token_ranks = carver.take<uint32_t>(kCountingSortWords);
  l.key_totals = carver.take<uint32_t>(kCountingSortBins);
  l.live_entries = carver.take<int32_t>(1);
  l.prefill_partials = carver.take<unsigned char>(entries * kCompactPartialBytes);
  const int64_t tiles = union_tile_count(info.pass_tokens, request.config.num_index_heads);
  l.union_counts = carver.take<int32_t>(tiles);
  l.union_pages = carver.take<uint32_t>(tiles * kUnionPages);
  l.union_visible = carver.take<uint64_t>(tiles * kUnionPages);
  l.union_listed = carver.take<uint32_t>(tiles * kUnionPages);
  l.union_queue = carver.take<uint32_t>(kUnionQueueWords);
  if (info.sm90 && tiles > 0) {
    l.union_value_keys = carver.take<uint32_t>(kUnionValueCells);
    l.union_value_forms = carver.take<uint32_t>(kUnionValueCells);
    l.union_value_cells = carver.take<uint32_t>(tiles * kUnionPages);
    l.union_values = carver.take<uint16_t>(int64_t{kUnionValueCells} * 128 * 128);
  }
  return l;
}

AttentionLayout run_layout(const OpPlan& plan, Workspace workspace) {
  detail::WorkspaceCarver carver(workspace.data);
  return carve_attention(plan.request, detail::load_plan_info<AttentionPlanInfo>(plan), carver);
}

#ifndef M3SA_ATTENTION_DECODE_MAX_CLUSTER // diagnostic builds only: 8 = no 16-CTA cluster
// (compute-sanitizer's synccheck cannot run many 16-CTA clusters; capped at 8 the attention cases
// pass it, bench/NOTES.md s26 r1-r3)
#define M3SA_ATTENTION_DECODE_MAX_CLUSTER 16
#endif
Status plan_attention_with(bool sm90, const PlanRequest& request, const detail::DeviceCaps& caps,
                           OpPlan* plan) {
  AttentionPlanInfo info{caps.sm_count, 0, 0, {}, sm90 ? 1 : 0};
  info.pass_tokens = prefill_pass_capacity(request.config.num_index_heads, request.config.top_k,
                                           request.capacities.max_tokens);
  for (int i = 0;
       i < 4 && caps.compute_capability >= 90 && (2 << i) <= M3SA_ATTENTION_DECODE_MAX_CLUSTER; ++i)
    info.active_clusters[i] = std::min(sparse_attention_decode_bf16_active_clusters(2 << i),
                                       sparse_attention_decode_fp8_active_clusters(2 << i));
  size_t sort_bytes = 0;
  M3SA_CUDA_RETURN_IF_ERROR(
      selection_sort_temp_bytes(static_cast<int>(pass_entries(request, info)), &sort_bytes));
  info.sort_temp_bytes = static_cast<int64_t>(sort_bytes);
  plan->num_threads = 1;
  detail::WorkspaceCarver carver;
  carve_attention(request, info, carver);
  plan->workspace_bytes = carver.bytes_used();
  detail::store_plan_info(plan, info);
  return {};
}

Status plan_attention(const PlanRequest& request, const detail::DeviceCaps& caps, OpPlan* plan) {
  return plan_attention_with(false, request, caps, plan);
}
Status plan_attention_sm90(const PlanRequest& request, const detail::DeviceCaps& caps,
                           OpPlan* plan) {
  return plan_attention_with(true, request, caps, plan);
}

// The TMA decode kernels and the wgmma prefill kernel.
Status can_run_attention_sm90(const PlanRequest& request, const detail::DeviceCaps& caps) {
  return can_run_sm90a(request, caps,
                       sparse_attention_decode_sm90_bf16_has_sm90a_code() &&
                           sparse_attention_decode_sm90_fp8_has_sm90a_code() &&
                           attend_block_members_sm90_bf16_has_sm90a_code() &&
                           attend_block_members_sm90_fp8_has_sm90a_code() &&
                           attend_page_unions_sm90_bf16_has_sm90a_code(),
                       "the TMA / wgmma attention kernels");
}

Status prepare_attention(const OpPlan& plan, Workspace workspace, void* stream) {
  return initialise_control_area(run_layout(plan, workspace).control, stream);
}

#ifndef M3SA_PREFILL_PAGE_UNIONS // diagnostic builds only: 0 = every prefill token block-major
#define M3SA_PREFILL_PAGE_UNIONS 1
#endif
#ifndef M3SA_ATTENTION_DECODE_MIN_CLUSTER // diagnostic builds only: 32 = never a cluster on SM90
#define M3SA_ATTENTION_DECODE_MIN_CLUSTER 8
#endif
DecodeSplits decode_splits(const OpPlan& plan, const AttentionPlanInfo& info, int64_t decode_pairs,
                           int min_cluster, SplitMerge otherwise) {
  return choose_decode_splits(decode_pairs, info.sm_count, plan.request.config.top_k,
                              info.active_clusters, min_cluster, otherwise);
}

Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& a, Workspace workspace,
                        const ExecContext& ctx) {
  const AttentionPlanInfo info = detail::load_plan_info<AttentionPlanInfo>(plan);
  const AttentionLayout l = run_layout(plan, workspace);
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
  p.decode_q_len = a.batch.decode_q_len;
  p.kv_heads = static_cast<int32_t>(a.k_cache.shape[2]);
  p.group = static_cast<int32_t>(a.q.shape[1] / a.k_cache.shape[2]);
  p.top_k = plan.request.config.top_k;
  p.out = a.out.data, p.out_stride_token = a.out.strides[0], p.out_stride_head = a.out.strides[1];
  if (a.lse.present()) {
    p.lse = a.lse.ptr<float>();
    p.lse_stride_token = a.lse.strides[0], p.lse_stride_head = a.lse.strides[1];
  }
  p.partials = l.split_partials;
  p.arrivals = l.control.arrivals;
  p.error_flags = l.control.error_flags;
  // Decode rows token-major with split selections, prefill rows block-major: any split of the
  // tokens is correct (each kernel reads its tokens' requests on the device); this one gives the
  // decode rows all the CTAs and the prefill rows the shared page reads.
  const bool fp8 = a.k_cache.dtype == DType::fp8_e4m3;
  const int tokens = a.batch.num_tokens;
  const int decode_tokens = std::min(tokens, a.batch.num_decode_requests * a.batch.decode_q_len);
  const cudaStream_t s = as_stream(ctx.stream);
  if (decode_tokens > 0) {
    p.token_begin = 0, p.token_end = decode_tokens;
    const int64_t pairs = int64_t{decode_tokens} * p.kv_heads;
    // An sm90 plan takes clusters only from 8 CTAs (the cp.async kernel's: the smallest batches,
    // where one selected block a CTA is what counts) and the TMA kernel for everything else,
    // where both views are TMA-addressable.
    const int min_cluster = info.sm90 ? M3SA_ATTENTION_DECODE_MIN_CLUSTER : 2;
    DecodeSplits splits = decode_splits(plan, info, pairs, min_cluster,
                                        info.sm90 ? kMergeByNextKernel : kMergeByLastArrival);
    SparseAttentionSm90Params sm90{};
    const int stage_keys = fp8 ? kDecodeSm90StageKeysFp8 : kDecodeSm90StageKeysBf16;
    const bool tma = info.sm90 && splits.merge != kMergeInCluster &&
                     encode_kv_cache_map(a.k_cache, stage_keys, sm90.k_map) &&
                     encode_kv_cache_map(a.v_cache, stage_keys, sm90.v_map);
    if (!tma && splits.merge != kMergeInCluster) // views TMA cannot address: the cp.async kernel
      splits = decode_splits(plan, info, pairs, min_cluster, kMergeByLastArrival);
    p.splits = splits.splits;
    p.split_merge = splits.merge;
    if (tma) { // one CTA an item
      sm90.attention = p;
      M3SA_CUDA_RETURN_IF_ERROR((fp8 ? launch_sparse_attention_decode_sm90_fp8
                                     : launch_sparse_attention_decode_sm90_bf16)(
          sm90, static_cast<int>(pairs * p.splits), s));
      if (p.split_merge == kMergeByNextKernel && p.splits > 1)
        M3SA_CUDA_RETURN_IF_ERROR(launch_merge_decode_splits(p, true, s));
    } else { // persistent; clustered: a whole number of clusters, no more CTAs than items
      const int cluster = p.split_merge == kMergeInCluster ? p.splits : 1;
      const int64_t resident = split_pairs(info.sm_count);
      const int grid = static_cast<int>(
          cluster > 1 ? std::min(pairs * p.splits, resident / cluster * cluster) : resident);
      M3SA_CUDA_RETURN_IF_ERROR(
          (fp8 ? launch_sparse_attention_decode_fp8
               : launch_sparse_attention_decode_bf16)(p, grid, cluster, info.sm90 != 0, s));
    }
  }
  if (tokens == decode_tokens) return {};
  // Keys (KV head, page) and the sentinel above them must fit the sort's 32 bits.
  const uint64_t keys = static_cast<uint64_t>(p.kv_heads) * static_cast<uint64_t>(p.num_pages) + 1;
  int key_bits = 1;
  while (key_bits < 64 && (uint64_t{1} << key_bits) - 1 < keys) ++key_bits;
  if (key_bits > 32)
    return Status::unsupported(
        "k_cache", detail::concat("num_kv_heads x num_pages below 2^32 - 1 for the prefill sort, "
                                  "got ",
                                  keys - 1));
  p.entry_sentinel = static_cast<uint32_t>((uint64_t{1} << key_bits) - 1);
  p.entry_keys = l.entry_keys, p.entry_values = l.entry_values;
  p.sorted_keys = l.sorted_keys, p.sorted_values = l.sorted_values;
  p.prefill_partials = l.prefill_partials;
  p.splits = 1;
  // The wgmma attend kernel: a GQA group within its 16-row member tiles, and views that TMA can
  // address (else the mma.sync kernel, the same partials).
  SparseAttentionPrefillSm90Params prefill_sm90{};
  const bool prefill_wgmma =
      info.sm90 && p.group <= kAttentionRows &&
      encode_query_map(a.q, kAttentionRows, prefill_sm90.q_map) &&
      encode_kv_cache_map(a.k_cache, 128, prefill_sm90.k_map) &&
      encode_kv_cache_map(a.v_cache, 128, prefill_sm90.v_map) &&
      encode_compact_partials_map(l.prefill_partials, pass_entries(plan.request, info),
                                  prefill_sm90.partial_map);
  // With the wgmma kernels and a bf16 cache, tiles of 8 tokens whose selections share their pages
  // attend over the union of those pages, token-major (the gather decides per tile, on the
  // device). Not for e4m3: its two relay warps widen each page once per tile there (against once
  // per page's members block-major), which bounded the kernel below the block-major path
  // (bench/NOTES.md s14 r3).
  if (prefill_wgmma && !fp8 && M3SA_PREFILL_PAGE_UNIONS) {
    p.union_counts = l.union_counts, p.union_pages = l.union_pages;
    p.union_visible = l.union_visible, p.union_listed = l.union_listed;
    // Their V in fp16, converted once a pass, as a page cache of one head for the union kernel's
    // TMA (the map's type is bf16: TMA moves 16-bit values and converts nothing).
    TensorView cells{};
    cells.data = l.union_values, cells.dtype = DType::bf16, cells.rank = 4;
    cells.shape[0] = kUnionValueCells, cells.shape[1] = 128, cells.shape[2] = 1;
    cells.shape[3] = 128;
    cells.strides[0] = 128 * 128, cells.strides[1] = 128, cells.strides[2] = 128;
    cells.strides[3] = 1;
    cells.device = a.v_cache.device;
    if (l.union_values && encode_kv_cache_map(cells, 128, prefill_sm90.union_values_map)) {
      p.union_value_keys = l.union_value_keys, p.union_value_forms = l.union_value_forms;
      p.union_value_cells = l.union_value_cells, p.union_values = l.union_values;
    }
  }
  const int per_pass = prefill_pass_tokens(tokens - decode_tokens, info.pass_tokens);
  // Few keys (the pass's pages are the pool's, as in a single long prefill): sort by counting.
  const bool counting_sort =
      prefill_sorts_by_counting(prefill_wgmma, p.kv_heads, p.num_pages, per_pass);
  if (counting_sort) {
    p.key_space = static_cast<int32_t>(keys - 1);
    p.key_repeats = l.counting_zeroed, p.key_tokens = l.counting_zeroed + 2 * p.key_space;
    p.key_token_ranks = l.key_token_ranks, p.key_totals = l.key_totals;
    p.live_entries = l.live_entries;
  }
  for (int begin = decode_tokens; begin < tokens; begin += per_pass) {
    p.token_begin = begin;
    p.token_end = static_cast<int>(std::min<int64_t>(tokens, int64_t{begin} + per_pass));
    p.entry_count = (p.token_end - p.token_begin) * p.kv_heads * p.top_k;
    const int64_t union_tiles = union_tile_count(p.token_end - p.token_begin, p.kv_heads);
    const int gather_grid = static_cast<int>(std::min<int64_t>(
        (union_tiles + kGatherThreads / 32 - 1) / (kGatherThreads / 32), 8 * info.sm_count));
    if (counting_sort) { // repeats, cursors, token bitmaps, the block-major flag, union queue
      p.token_words = static_cast<int32_t>(token_bitmap_words(p.token_end - p.token_begin));
      uint32_t* const after_bitmaps = p.key_tokens + int64_t{p.key_space} * p.token_words;
      if (p.union_counts) p.block_major_flag = after_bitmaps, p.union_queue = after_bitmaps + 1;
      M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          p.key_repeats, 0,
          sizeof(uint32_t) *
              counting_zeroed_words(p.key_space, int64_t{p.key_space} * p.token_words),
          s));
    } else if (p.union_counts) {
      p.union_queue = l.union_queue;
      M3SA_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(p.union_queue, 0, kUnionQueueWords * sizeof(uint32_t), s));
    }
    M3SA_CUDA_RETURN_IF_ERROR(launch_gather_selection_entries(p, gather_grid, s));
    if (counting_sort) {
      // About 4 entries a thread: each CTA first scans the keys' totals on its own.
      const int64_t ctas =
          (int64_t{p.entry_count} + 4 * kScatterThreads - 1) / (4 * kScatterThreads);
      M3SA_CUDA_RETURN_IF_ERROR(sort_selection_entries_by_counting(
          p, l.sorted_keys, l.sorted_values,
          static_cast<int>(std::min<int64_t>(ctas, 2 * int64_t{info.sm_count})), s));
    } else {
      M3SA_CUDA_RETURN_IF_ERROR(sort_selection_entries(p, l.sorted_keys, l.sorted_values, key_bits,
                                                       l.sort_temp, l.sort_temp_bytes, s));
    }
    if (prefill_wgmma) {
      prefill_sm90.attention = p;
      const int64_t items = (int64_t{p.entry_count} + kRunEntries - 1) / kRunEntries;
      M3SA_CUDA_RETURN_IF_ERROR(
          (fp8 ? launch_attend_block_members_sm90_fp8 : launch_attend_block_members_sm90_bf16)(
              prefill_sm90, static_cast<int>(std::min<int64_t>(items, info.sm_count)), s));
      if (p.union_value_cells) {
        M3SA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.union_value_keys, 0,
                                                  kUnionValueCells * sizeof(uint32_t), s));
        M3SA_CUDA_RETURN_IF_ERROR(launch_convert_union_values(p, gather_grid, s));
      }
      if (p.union_counts)
        M3SA_CUDA_RETURN_IF_ERROR(launch_attend_page_unions_sm90_bf16(
            prefill_sm90, static_cast<int>(std::min<int64_t>(union_tiles, info.sm_count)), s));
    } else {
      M3SA_CUDA_RETURN_IF_ERROR((fp8 ? launch_attend_block_members_fp8
                                     : launch_attend_block_members_bf16)(p, info.sm_count, s));
    }
    // The merge waits on its partials' loads: as many 128-thread groups as an SM holds at once
    // (s13 r3's ncu measured 25 % occupancy and 2.5 TB/s with 4), each with several partials'
    // loads in flight.
    const int64_t merge_pairs = int64_t{p.token_end - p.token_begin} * p.kv_heads;
    M3SA_CUDA_RETURN_IF_ERROR(launch_merge_token_partials(
        p,
        static_cast<int>(
            std::min<int64_t>(merge_pairs, kMergeTokenPartialsCtasPerSm * int64_t{info.sm_count})),
        s));
  }
  return {};
}

} // namespace
} // namespace m3sa::cuda

namespace m3sa::detail {

extern const Implementation kCudaSparseAttentionSm80, kCudaSparseAttentionSm90;

const Implementation kCudaSparseAttentionSm80 = {
    "cuda.sparse_attention.sm80",
    "mma.sync, GQA group = 16 MMA rows; decode token-major with split selections, prefill "
    "block-major (each page read once for all tokens that selected it)",
    Backend::cuda,
    OpKind::sparse_attention,
    0,
    cuda::can_run_sm80,
    cuda::plan_attention,
    cuda::sparse_attention,
    cuda::prepare_attention,
    cuda::read_control_errors,
    cuda::AttentionPlanInfo::kVersion};

const Implementation kCudaSparseAttentionSm90 = {
    "cuda.sparse_attention.sm90",
    "as cuda.sparse_attention.sm80, but decode rows stream the selected K/V by TMA into a ring per "
    "warp (four independent warps a CTA, two CTAs per SM) where the K and V views allow TMA and "
    "no cluster merge is chosen; decode kernels overlap the previous kernel (PDL); prefill pages "
    "attend 4 member tokens a wgmma tile (TMA-fed, warp-specialised) where q, K and V allow TMA, "
    "and with a bf16 cache tiles of 8 tokens whose selections share their pages attend over the "
    "union of those pages, token-major",
    Backend::cuda,
    OpKind::sparse_attention,
    1,
    cuda::can_run_attention_sm90,
    cuda::plan_attention_sm90,
    cuda::sparse_attention,
    cuda::prepare_attention,
    cuda::read_control_errors,
    cuda::AttentionPlanInfo::kVersion};

} // namespace m3sa::detail
