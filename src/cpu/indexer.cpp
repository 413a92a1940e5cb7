// CPU indexer. Scoring works on tiles of consecutive tokens of one request with all their index
// heads, so each 128x128 key block is widened to fp32 once per tile instead of once per row.
// Selection keeps a running top-K per row (insertion into a sorted list), a different algorithm
// from the reference's sort, so the two check each other.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/host_batch.h"
#include "common/workspace.h"
#include "cpu/cpu.h"
#include "cpu/simd.h"
#include "m3sa/numeric.h"
#include "registry/registry.h"

namespace m3sa::cpu {
namespace {

using detail::HostBatch;
constexpr int kTileRows = 64; // query rows (token x head) scored together
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-thread scratch.
struct Scratch {
  float* q_rows;  // [kTileRows, 128]
  float* k_block; // [128, 128]
  float* dots;    // [kTileRows]
  float* scores;  // [kTileRows, W]
  float* reduced; // [W] max over heads (reduce_heads)
  uint32_t* keys; // [K] running top-K: rank keys
  int32_t* ids;   // [K] running top-K: block ids
};

Scratch carve_thread(detail::WorkspaceCarver& carver, int64_t width, int top_k) {
  Scratch s;
  s.q_rows = carver.take<float>(kTileRows * kHeadDim);
  s.k_block = carver.take<float>(kBlockTokens * kHeadDim);
  s.dots = carver.take<float>(kTileRows);
  s.scores = carver.take<float>(kTileRows * width);
  s.reduced = carver.take<float>(width);
  s.keys = carver.take<uint32_t>(top_k);
  s.ids = carver.take<int32_t>(top_k);
  return s;
}

Scratch thread_scratch(Workspace workspace, int64_t width, int top_k) {
  detail::WorkspaceCarver carver(workspace.data);
  Scratch s{};
  for (int i = 0; i <= omp_get_thread_num(); ++i) s = carve_thread(carver, width, top_k);
  return s;
}

int tile_tokens(int heads) { return std::max(1, kTileRows / heads); }

// Orders scores as unsigned integers: larger is better, every NaN below -inf, -0 equal to +0.
uint32_t rank_key(float score) {
  if (std::isnan(score)) return 0;
  const uint32_t bits = std::bit_cast<uint32_t>(score == 0.f ? 0.f : score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Contract §5 for one row of n causal blocks; out[slot * out_stride].
void select_row(const MsaConfig& config, const float* scores, int64_t n, const Scratch& s,
                int32_t* out, int64_t out_stride) {
  const int k = config.top_k;
  int slot = 0;
  if (n <= k) {
    for (int32_t b = 0; b < n; ++b) out[(slot++) * out_stride] = b;
  } else {
    const int fill = k - config.init_blocks - config.local_blocks;
    const int64_t local_begin = n - config.local_blocks;
    int kept =
        0; // s.keys/s.ids sorted best first; ascending ids make "strictly better" the tie rule
    for (int32_t b = config.init_blocks; b < local_begin && fill > 0; ++b) {
      const uint32_t key = rank_key(scores[b]);
      if (kept == fill && key <= s.keys[fill - 1]) continue;
      int pos = kept < fill ? kept++ : fill - 1;
      while (pos > 0 && s.keys[pos - 1] < key) {
        s.keys[pos] = s.keys[pos - 1];
        s.ids[pos] = s.ids[pos - 1];
        --pos;
      }
      s.keys[pos] = key;
      s.ids[pos] = b;
    }
    std::sort(s.ids, s.ids + fill);
    for (int32_t b = 0; b < config.init_blocks; ++b) out[(slot++) * out_stride] = b;
    for (int i = 0; i < fill; ++i) out[(slot++) * out_stride] = s.ids[i];
    for (int64_t b = local_begin; b < n; ++b) out[(slot++) * out_stride] = static_cast<int32_t>(b);
  }
  for (; slot < k; ++slot) out[slot * out_stride] = -1;
}

float max_ignoring_nan(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return std::max(a, b);
}

int64_t causal_blocks(int64_t position) { return position < 0 ? 0 : position / kBlockTokens + 1; }

// Selects for every head of one token from `scores` (head h at scores + h * head_stride).
void select_token(const MsaConfig& config, const float* scores, int64_t head_stride,
                  int64_t position, const TensorView& topk, int64_t t, const Scratch& s) {
  const int64_t n = causal_blocks(position);
  const int heads = config.num_index_heads;
  if (config.reduce_heads) {
    for (int64_t b = 0; b < n; ++b) {
      float best = scores[b];
      for (int h = 1; h < heads; ++h) best = max_ignoring_nan(best, scores[h * head_stride + b]);
      s.reduced[b] = best;
    }
  }
  for (int h = 0; h < heads; ++h) {
    const float* row = config.reduce_heads ? s.reduced : scores + h * head_stride;
    select_row(config, row, n, s, topk.ptr<int32_t>() + topk.offset({h, t}), topk.strides[2]);
  }
}

// Scores tokens [t0, t1) of request r (positions p0, p0 + 1, ...) for all heads into
// s.scores[(token - t0) * H + h][0..width).
void score_tile(const MsaConfig& config, const HostBatch& batch, const TensorView& q,
                const TensorView& cache, int r, int64_t t0, int64_t t1, int64_t p0, int64_t width,
                const Scratch& s) {
  const int heads = config.num_index_heads;
  const int rows = static_cast<int>((t1 - t0) * heads);
  for (int64_t t = t0; t < t1; ++t)
    for (int h = 0; h < heads; ++h)
      load_row(q.dtype, static_cast<const char*>(q.data) + q.offset({t, h}) * dtype_size(q.dtype),
               1.f, s.q_rows + ((t - t0) * heads + h) * kHeadDim);
  std::fill(s.scores, s.scores + rows * width, kNegInf);
  if (p0 < 0) return; // padding request: nothing is visible
  const int64_t p_last = p0 + (t1 - t0) - 1;
  const int64_t seq_len = batch.seq_len(static_cast<int>(r));
  for (int64_t b = 0; b < causal_blocks(p_last); ++b) {
    const int64_t page = batch.page(r, b);
    const int64_t first_key = b * kBlockTokens;
    const int64_t num_keys =
        std::min<int64_t>({kBlockTokens, seq_len - first_key, p_last - first_key + 1});
    for (int64_t j = 0; j < num_keys; ++j)
      load_row(cache.dtype,
               static_cast<const char*>(cache.data) +
                   cache.offset({page, j}) * dtype_size(cache.dtype),
               1.f, s.k_block + j * kHeadDim);
    for (int64_t j = 0; j < num_keys; ++j) {
      dot_rows(s.q_rows, rows, s.k_block + j * kHeadDim, s.dots);
      // Key first_key + j is visible to the tokens at positions >= it. NaN propagates (contract
      // §4).
      const int64_t first_row = std::max<int64_t>(0, first_key + j - p0) * heads;
      for (int64_t row = first_row; row < rows; ++row) {
        float& best = s.scores[row * width + b];
        const float dot = s.dots[row];
        if (dot > best || std::isnan(dot)) best = std::isnan(best) ? best : dot;
      }
    }
  }
  if (config.score_scale != 1.f)
    for (int64_t i = 0; i < rows * width; ++i) s.scores[i] *= config.score_scale;
}

// Runs fn(request, t0, t1, p0, scratch) over tiles of tokens that never cross a request, in
// parallel.
template <typename Fn>
void for_each_tile(const MsaConfig& config, const HostBatch& batch, Workspace workspace,
                   int64_t width, int num_threads, Fn&& fn) {
  const int64_t tile = tile_tokens(config.num_index_heads);
  const int64_t num_tiles = (batch.num_tokens() + tile - 1) / tile;
#pragma omp parallel num_threads(num_threads)
  {
    const Scratch s = thread_scratch(workspace, width, config.top_k);
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < num_tiles; ++g) {
      int64_t t = g * tile;
      const int64_t end = std::min<int64_t>(batch.num_tokens(), t + tile);
      int r = batch.request_of_token(t);
      while (t < end) {
        while (batch.q_begin(r) + batch.q_len(r) <= t) ++r;
        const int64_t stop = std::min<int64_t>(end, batch.q_begin(r) + batch.q_len(r));
        const int64_t seq_len = batch.seq_len(r);
        const int64_t p0 = seq_len == 0 ? -1 : seq_len - batch.q_len(r) + (t - batch.q_begin(r));
        fn(r, t, stop, p0, s);
        t = stop;
      }
    }
  }
}

// Selection and scoring need per-thread scratch; insert_index_k none.
Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  plan->num_threads = plan_threads(request);
  detail::WorkspaceCarver carver;
  if (request.op != OpKind::insert_index_k)
    for (int i = 0; i < plan->num_threads; ++i)
      carve_thread(carver, request.capacities.max_blocks_per_request, request.config.top_k);
  plan->workspace_bytes = carver.bytes_used();
  return {};
}

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace,
                      const ExecContext& ctx) {
  const int num_threads = detail::run_threads(plan, ctx);
  const TensorView& k = args.index_k;
  const TensorView& cache = args.index_k_cache;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t t = 0; t < k.shape[0]; ++t) {
    const int64_t slot = args.slot_mapping.ptr<const int64_t>()[t * args.slot_mapping.strides[0]];
    if (slot < 0) continue;
    float row[kHeadDim];
    load_row(k.dtype, static_cast<const char*>(k.data) + k.offset({t}) * dtype_size(k.dtype), 1.f,
             row);
    const int64_t dst = cache.offset({slot / kBlockTokens, slot % kBlockTokens});
    for (int d = 0; d < kHeadDim; ++d) {
      if (cache.dtype == DType::bf16)
        cache.ptr<uint16_t>()[dst + d] = float_to_bf16_bits(row[d]);
      else
        cache.ptr<uint8_t>()[dst + d] = float_to_e4m3_bits(row[d]);
    }
  }
  return {};
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    const ExecContext& ctx) {
  const MsaConfig& config = plan.request.config;
  const int num_threads = detail::run_threads(plan, ctx);
  const HostBatch batch(args.batch);
  const int64_t width = batch.block_table_width();
  const TensorView& out = args.scores;
  for_each_tile(config, batch, workspace, width, num_threads,
                [&](int r, int64_t t0, int64_t t1, int64_t p0, const Scratch& s) {
                  score_tile(config, batch, args.index_q, args.index_k_cache, r, t0, t1, p0, width,
                             s);
                  for (int64_t t = t0; t < t1; ++t)
                    for (int h = 0; h < config.num_index_heads; ++h) {
                      const float* row = s.scores + ((t - t0) * config.num_index_heads + h) * width;
                      float* dst = out.ptr<float>() + out.offset({h, t});
                      for (int64_t b = 0; b < out.shape[2]; ++b)
                        dst[b * out.strides[2]] = b < width ? row[b] : kNegInf;
                    }
                });
  return {};
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext& ctx) {
  const MsaConfig& config = plan.request.config;
  const int num_threads = detail::run_threads(plan, ctx);
  const HostBatch batch(args.batch);
  const int64_t width = batch.block_table_width();
  const int heads = config.num_index_heads;
  for_each_tile(config, batch, workspace, width, num_threads,
                [&](int r, int64_t t0, int64_t t1, int64_t p0, const Scratch& s) {
                  score_tile(config, batch, args.index_q, args.index_k_cache, r, t0, t1, p0, width,
                             s);
                  for (int64_t t = t0; t < t1; ++t)
                    select_token(config, s.scores + (t - t0) * heads * width, width,
                                 p0 < 0 ? -1 : p0 + (t - t0), args.topk, t, s);
                });
  return {};
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext& ctx) {
  const MsaConfig& config = plan.request.config;
  const int num_threads = detail::run_threads(plan, ctx);
  const HostBatch batch(args.batch);
  const int64_t width = batch.block_table_width();
  const TensorView& in = args.scores;
  const int heads = config.num_index_heads;
  for_each_tile(config, batch, workspace, width, num_threads,
                [&](int, int64_t t0, int64_t t1, int64_t p0, const Scratch& s) {
                  for (int64_t t = t0; t < t1; ++t) {
                    const int64_t n = causal_blocks(p0 < 0 ? -1 : p0 + (t - t0));
                    for (int h = 0; h < heads; ++h) // gather the strided input into contiguous rows
                      for (int64_t b = 0; b < n; ++b)
                        s.scores[h * width + b] = in.ptr<const float>()[in.offset({h, t, b})];
                    select_token(config, s.scores, width, p0 < 0 ? -1 : p0 + (t - t0), args.topk, t,
                                 s);
                  }
                });
  return {};
}

} // namespace

int plan_threads(const PlanRequest& request) {
  return request.num_threads > 0 ? request.num_threads : omp_get_max_threads();
}

} // namespace m3sa::cpu

namespace m3sa::detail {
namespace {
constexpr const char* kDescription = "OpenMP over row tiles, fp32, AVX2 clones";
} // namespace

extern const Implementation kCpuInsertIndexK, kCpuScoreBlocks, kCpuSelectTopkBlocks, kCpuIndexTopk;
const Implementation kCpuInsertIndexK =
    host_implementation("cpu.insert_index_k", kDescription, Backend::cpu, OpKind::insert_index_k,
                        cpu::plan, cpu::insert_index_k);
const Implementation kCpuScoreBlocks =
    host_implementation("cpu.score_blocks", kDescription, Backend::cpu, OpKind::score_blocks,
                        cpu::plan, cpu::score_blocks);
const Implementation kCpuSelectTopkBlocks =
    host_implementation("cpu.select_topk_blocks", kDescription, Backend::cpu,
                        OpKind::select_topk_blocks, cpu::plan, cpu::select_topk_blocks);
const Implementation kCpuIndexTopk = host_implementation(
    "cpu.index_topk", kDescription, Backend::cpu, OpKind::index_topk, cpu::plan, cpu::index_topk);

} // namespace m3sa::detail
