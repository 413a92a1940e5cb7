// Reference indexer: contract §3 (insert), §4 (block score) and §5 (selection), one row at a time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/host_batch.h"
#include "common/workspace.h"
#include "m3sa/numeric.h"
#include "registry/registry.h"

namespace m3sa::ref {
namespace {

using detail::HostBatch;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double load(DType dtype, const void* base, int64_t offset) {
  if (dtype == DType::bf16) return bf16_bits_to_float(static_cast<const uint16_t*>(base)[offset]);
  if (dtype == DType::fp8_e4m3)
    return e4m3_bits_to_float(static_cast<const uint8_t*>(base)[offset]);
  return static_cast<const float*>(base)[offset];
}

struct Regions {
  float* head_scores; // [H, W] scores of the current token
  float* row;         // [W] the scores one selection is made from
  int32_t* order;     // [W] candidate block ids
};

Regions carve(detail::WorkspaceCarver& carver, int64_t heads, int64_t width) {
  Regions r;
  r.head_scores = carver.take<float>(heads * width);
  r.row = carver.take<float>(width);
  r.order = carver.take<int32_t>(width);
  return r;
}

// Larger score first, NaN below every number, lower block id on ties.
bool ranks_before(const float* scores, int32_t a, int32_t b) {
  const float sa = scores[a], sb = scores[b];
  const bool nan_a = std::isnan(sa), nan_b = std::isnan(sb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && sa != sb) return sa > sb;
  return a < b;
}

// Contract §5 for one row: `scores` holds the n causal blocks of a token at position p.
// Forced init blocks < ranked candidates < forced local blocks, so writing the three groups in
// that order, each ascending, gives the ascending output.
void select_row(const MsaConfig& config, const float* scores, int64_t n, int32_t* order,
                int32_t* out, int64_t out_stride) {
  const int k = config.top_k;
  int count = 0;
  if (n <= k) {
    for (int32_t b = 0; b < n; ++b) out[(count++) * out_stride] = b;
  } else {
    const int64_t local_begin = n - config.local_blocks;
    int64_t num_candidates = 0;
    for (int32_t b = config.init_blocks; b < local_begin; ++b) order[num_candidates++] = b;
    const int64_t fill = k - config.init_blocks - config.local_blocks;
    std::partial_sort(order, order + fill, order + num_candidates,
                      [&](int32_t a, int32_t b) { return ranks_before(scores, a, b); });
    std::sort(order, order + fill);
    for (int32_t b = 0; b < config.init_blocks; ++b) out[(count++) * out_stride] = b;
    for (int64_t i = 0; i < fill; ++i) out[(count++) * out_stride] = order[i];
    for (int64_t b = local_begin; b < n; ++b) out[(count++) * out_stride] = static_cast<int32_t>(b);
  }
  for (; count < k; ++count) out[count * out_stride] = -1;
}

// max(a, b) over numbers; NaN only when both are NaN (reduce_heads mode).
float max_ignoring_nan(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return std::max(a, b);
}

// Scores of index head h, token t at position p of request r: row[b * stride] for b < width.
void score_row(const MsaConfig& config, const HostBatch& batch, const IndexTopkArgs& args, int r,
               int64_t t, int h, int64_t p, float* row, int64_t stride, int64_t width) {
  const TensorView& q = args.index_q;
  const TensorView& cache = args.index_k_cache;
  const int64_t seq_len = batch.seq_len(r);
  const int64_t n = p < 0 ? 0 : p / kBlockTokens + 1;
  for (int64_t b = 0; b < width; ++b) {
    double best = -std::numeric_limits<double>::infinity();
    bool any = false;
    if (b < n) {
      const int64_t page = batch.page(r, b);
      for (int64_t j = b * kBlockTokens; j < (b + 1) * kBlockTokens && j <= p && j < seq_len; ++j) {
        double dot = 0;
        for (int d = 0; d < kHeadDim; ++d) {
          dot += load(q.dtype, q.data, q.offset({t, h, d})) *
                 load(cache.dtype, cache.data, cache.offset({page, j % kBlockTokens, d}));
        }
        // NaN propagates: a block with any NaN product scores NaN (contract §4).
        if (dot > best || std::isnan(dot)) best = std::isnan(best) ? best : dot;
        any = true;
      }
    }
    row[b * stride] = any ? static_cast<float>(config.score_scale * best) : kNegInf;
  }
}

template <typename Fn>
void for_each_token(const HostBatch& batch, Fn&& fn) { // fn(request, token, position or -1)
  for (int r = 0; r < batch.num_requests(); ++r) {
    const int64_t q_len = batch.q_len(r), seq_len = batch.seq_len(r);
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t position = seq_len == 0 ? -1 : seq_len - q_len + i; // seq_len 0: padding row
      fn(r, batch.q_begin(r) + i, position);
    }
  }
}

// Selects for every head of token t from head_scores [H, W] and writes topk[h][t][:].
void select_token(const MsaConfig& config, const TensorView& topk, int64_t t, int64_t position,
                  const Regions& ws, int64_t width, int heads) {
  const int64_t n = position < 0 ? 0 : position / kBlockTokens + 1;
  if (config.reduce_heads) {
    for (int64_t b = 0; b < width; ++b) {
      ws.row[b] = ws.head_scores[b];
      for (int h = 1; h < heads; ++h)
        ws.row[b] = max_ignoring_nan(ws.row[b], ws.head_scores[h * width + b]);
    }
  }
  for (int h = 0; h < heads; ++h) {
    const float* scores = config.reduce_heads ? ws.row : ws.head_scores + h * width;
    select_row(config, scores, n, ws.order, topk.ptr<int32_t>() + topk.offset({h, t}),
               topk.strides[2]);
  }
}

// score_blocks and insert_index_k need no workspace; the selecting ops one token's rows.
Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  detail::WorkspaceCarver carver;
  if (request.op == OpKind::index_topk || request.op == OpKind::select_topk_blocks)
    carve(carver, request.config.num_index_heads, request.capacities.max_blocks_per_request);
  plan->num_threads = 1;
  plan->workspace_bytes = carver.bytes_used();
  return {};
}

Status insert_index_k(const OpPlan&, const InsertIndexKArgs& args, Workspace, const ExecContext&) {
  const TensorView& k = args.index_k;
  const TensorView& cache = args.index_k_cache;
  for (int64_t t = 0; t < k.shape[0]; ++t) {
    const int64_t slot = args.slot_mapping.ptr<const int64_t>()[t * args.slot_mapping.strides[0]];
    if (slot < 0) continue;
    const int64_t page = slot / kBlockTokens, offset = slot % kBlockTokens;
    for (int d = 0; d < kHeadDim; ++d) {
      const float value = static_cast<float>(load(k.dtype, k.data, k.offset({t, d})));
      const int64_t dst = cache.offset({page, offset, d});
      if (cache.dtype == DType::bf16)
        cache.ptr<uint16_t>()[dst] = float_to_bf16_bits(value);
      else
        cache.ptr<uint8_t>()[dst] = float_to_e4m3_bits(value);
    }
  }
  return {};
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace,
                    const ExecContext&) {
  const MsaConfig& config = plan.request.config;
  const HostBatch batch(args.batch);
  const IndexTopkArgs as_index{args.index_q, args.index_k_cache, args.batch, {}};
  const TensorView& s = args.scores;
  for_each_token(batch, [&](int r, int64_t t, int64_t p) {
    for (int h = 0; h < config.num_index_heads; ++h)
      score_row(config, batch, as_index, r, t, h, p, s.ptr<float>() + s.offset({h, t}),
                s.strides[2], s.shape[2]);
  });
  return {};
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext&) {
  const MsaConfig& config = plan.request.config;
  const HostBatch batch(args.batch);
  // Columns past the block-table width are never causal (contract §5) and the workspace holds only
  // max_blocks_per_request of them, so wider scores are read up to the block-table width only.
  const int64_t width = batch.block_table_width();
  detail::WorkspaceCarver carver(workspace.data);
  const Regions ws = carve(carver, config.num_index_heads, width);
  for_each_token(batch, [&](int, int64_t t, int64_t p) {
    for (int h = 0; h < config.num_index_heads; ++h)
      for (int64_t b = 0; b < width; ++b)
        ws.head_scores[h * width + b] =
            args.scores.ptr<const float>()[args.scores.offset({h, t, b})];
    select_token(config, args.topk, t, p, ws, width, config.num_index_heads);
  });
  return {};
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext&) {
  const MsaConfig& config = plan.request.config;
  const HostBatch batch(args.batch);
  const int64_t width = batch.block_table_width();
  detail::WorkspaceCarver carver(workspace.data);
  const Regions ws = carve(carver, config.num_index_heads, width);
  for_each_token(batch, [&](int r, int64_t t, int64_t p) {
    for (int h = 0; h < config.num_index_heads; ++h)
      score_row(config, batch, args, r, t, h, p, ws.head_scores + h * width, 1, width);
    select_token(config, args.topk, t, p, ws, width, config.num_index_heads);
  });
  return {};
}

} // namespace
} // namespace m3sa::ref

namespace m3sa::detail {

namespace {
constexpr const char* kDescription = "the oracle: scalar, double accumulation, one thread";
} // namespace

extern const Implementation kReferenceInsertIndexK, kReferenceScoreBlocks,
    kReferenceSelectTopkBlocks, kReferenceIndexTopk;
const Implementation kReferenceInsertIndexK =
    host_implementation("reference.insert_index_k", kDescription, Backend::reference,
                        OpKind::insert_index_k, ref::plan, ref::insert_index_k);
const Implementation kReferenceScoreBlocks =
    host_implementation("reference.score_blocks", kDescription, Backend::reference,
                        OpKind::score_blocks, ref::plan, ref::score_blocks);
const Implementation kReferenceSelectTopkBlocks =
    host_implementation("reference.select_topk_blocks", kDescription, Backend::reference,
                        OpKind::select_topk_blocks, ref::plan, ref::select_topk_blocks);
const Implementation kReferenceIndexTopk =
    host_implementation("reference.index_topk", kDescription, Backend::reference,
                        OpKind::index_topk, ref::plan, ref::index_topk);

} // namespace m3sa::detail
