// CPU indexer. Scoring works on tiles (segments) of consecutive tokens of one request with all
// their index heads, so each 128x128 key block is widened to fp32 once per tile instead of once
// per row. Tiles go in waves of one per thread, and a wave's causal blocks are scored in ranges
// spread over the threads, so that a batch of a few long decode rows keeps every thread busy (a
// thread a tile left B=16 decode on one thread).
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
  float* k_block; // [128, 128]: a block's keys as rows, or transposed (dims x keys)
  float* k_rows;  // [8, 128]: widen_keys_transposed's scratch
  float* dots;    // [kTileRows, 128]: the tile's rows by a block's keys
  float* scores;  // [kTileRows, W]
  float* reduced; // [W] max over heads (reduce_heads)
  uint32_t* keys; // [K] running top-K: rank keys
  int32_t* ids;   // [K] running top-K: block ids
};

Scratch carve_thread(detail::WorkspaceCarver& carver, int64_t width, int top_k) {
  Scratch s;
  s.q_rows = carver.take<float>(kTileRows * kHeadDim);
  s.k_block = carver.take<float>(kBlockTokens * kHeadDim);
  s.k_rows = carver.take<float>(8 * kHeadDim);
  s.dots = carver.take<float>(kBlockTokens * kTileRows);
  s.scores = carver.take<float>(kTileRows * width);
  s.reduced = carver.take<float>(width);
  s.keys = carver.take<uint32_t>(top_k);
  s.ids = carver.take<int32_t>(top_k);
  return s;
}

// Scratch k of the workspace (thread k's, and the score rows of a wave's segment k).
Scratch scratch_of(Workspace workspace, int64_t width, int top_k, int k) {
  detail::WorkspaceCarver carver(workspace.data);
  Scratch s{};
  for (int i = 0; i <= k; ++i) s = carve_thread(carver, width, top_k);
  return s;
}

int tile_tokens(int heads) { return std::max(1, kTileRows / heads); }

// Up to tile_tokens(H) consecutive tokens of one request, whose rows (token x head) are scored and
// selected together.
struct Segment {
  int request;
  int64_t t0, t1; // tokens [t0, t1)
  int64_t p0;     // position of t0; -1 in a padding request (nothing visible)
};

// The workspace: a scratch per thread, then the segments of one wave (a segment per thread).
Segment* carve_workspace(detail::WorkspaceCarver& carver, int64_t width, int top_k,
                         int num_threads) {
  for (int i = 0; i < num_threads; ++i) carve_thread(carver, width, top_k);
  return carver.take<Segment>(num_threads);
}

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

int64_t segment_blocks(const Segment& seg) {
  return seg.p0 < 0 ? 0 : causal_blocks(seg.p0 + (seg.t1 - seg.t0) - 1);
}

// Up to this many rows (a decode step's heads, a few MTP tokens), a block's keys are widened as
// rows and dotted by dot_rows_keys; above it (prefill tiles), widened transposed and dotted with
// keys in lanes (dot_rows_transposed_keys: 1.4x on prefill scoring; at 4 rows the transpose costs
// more than it saves, 4-16 % slower, s39). Both sum in fp32; the orders differ.
constexpr int kRowMajorKeyRows = 8;

// The scores of blocks [b0, b1) for the rows of `seg` ((token - t0) * H + h) into
// scores[row * width + b]: the largest dot of the keys a row sees (up to its token's position),
// NaN propagating (contract §4); -inf where it sees none. s: the calling thread's scratch.
void score_block_range(const MsaConfig& config, const HostBatch& batch, const TensorView& q,
                       const TensorView& cache, const Segment& seg, int64_t b0, int64_t b1,
                       int64_t width, float* scores, const Scratch& s) {
  const int heads = config.num_index_heads;
  const int rows = static_cast<int>((seg.t1 - seg.t0) * heads);
  for (int64_t t = seg.t0; t < seg.t1; ++t)
    for (int h = 0; h < heads; ++h)
      load_row(q.dtype, static_cast<const char*>(q.data) + q.offset({t, h}) * dtype_size(q.dtype),
               1.f, s.q_rows + ((t - seg.t0) * heads + h) * kHeadDim);
  const int64_t p_last = seg.p0 + (seg.t1 - seg.t0) - 1;
  const int64_t seq_len = batch.seq_len(seg.request);
  const int64_t row_bytes = kHeadDim * static_cast<int64_t>(dtype_size(cache.dtype));
  const auto key_row = [&](int64_t page, int64_t j) {
    return static_cast<const char*>(cache.data) + cache.offset({page, j}) * dtype_size(cache.dtype);
  };
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t page = batch.page(seg.request, b);
    const int64_t next_page = b + 1 < b1 ? batch.page(seg.request, b + 1) : -1;
    const int64_t first_key = b * kBlockTokens;
    const int64_t num_keys =
        std::min<int64_t>({kBlockTokens, seq_len - first_key, p_last - first_key + 1});
    // Pages are scattered, and the hardware prefetchers stop at every 4 KB: the next block's rows
    // are asked for while this one's are scored (with each row's widening, which was measurably
    // faster for e4m3 at decode than all of them first, s39).
    if (rows > kRowMajorKeyRows) {
      if (next_page >= 0)
        for (int64_t j = 0; j < num_keys; ++j) prefetch_bytes(key_row(next_page, j), row_bytes);
      widen_keys_transposed(cache.dtype, key_row(page, 0),
                            cache.strides[1] * static_cast<int64_t>(dtype_size(cache.dtype)),
                            static_cast<int>(num_keys), s.k_block, s.k_rows);
      dot_rows_transposed_keys(s.q_rows, rows, s.k_block,
                               static_cast<int>((num_keys + 15) / 16 * 16), s.dots, kBlockTokens);
    } else {
      load_rows(cache.dtype, key_row(page, 0),
                cache.strides[1] * static_cast<int64_t>(dtype_size(cache.dtype)),
                static_cast<int>(num_keys), 1.f, s.k_block,
                next_page >= 0 ? key_row(next_page, 0) : nullptr);
      dot_rows_keys(s.q_rows, rows, s.k_block, static_cast<int>(num_keys),
                    {s.dots, kBlockTokens, 1});
    }
    for (int row = 0; row < rows; ++row) {
      const int64_t visible = std::min(num_keys, seg.p0 + row / heads - first_key + 1);
      scores[row * width + b] =
          visible > 0 ? max_propagating_nan(s.dots + row * kBlockTokens, static_cast<int>(visible))
                      : kNegInf;
    }
  }
}

// After every range of `seg` is scored: -inf past its causal blocks, then the score scale.
void finish_scores(const MsaConfig& config, const Segment& seg, int64_t width, float* scores) {
  const int64_t rows = (seg.t1 - seg.t0) * config.num_index_heads, blocks = segment_blocks(seg);
  for (int64_t row = 0; row < rows; ++row)
    std::fill(scores + row * width + blocks, scores + (row + 1) * width, kNegInf);
  if (config.score_scale != 1.f)
    for (int64_t i = 0; i < rows * width; ++i) scores[i] *= config.score_scale;
}

// What the scoring ops score; absent for select_topk_blocks.
struct ScoringInputs {
  const TensorView& q;
  const TensorView& cache;
};

constexpr int kItemsPerThread = 4;    // block ranges a thread takes in a wave, for balance
constexpr int64_t kMinItemBlocks = 4; // blocks a range scores at least (its q rows are reloaded)

// Runs finish(segment, score rows, thread scratch) for every segment of the batch, request by
// request. Segments go in waves of one per thread, each with its score rows in workspace scratch
// k; with `scoring`, a wave's causal blocks are first scored in ranges spread over the threads,
// so that a few long decode rows keep every thread busy, and not one thread a segment.
template <typename Finish>
void run_segments(const MsaConfig& config, const HostBatch& batch, const ScoringInputs* scoring,
                  Workspace workspace, int64_t width, int num_threads, Finish&& finish) {
  const int top_k = config.top_k;
  const int64_t tile = tile_tokens(config.num_index_heads);
  detail::WorkspaceCarver carver(workspace.data);
  Segment* wave = carve_workspace(carver, width, top_k, num_threads);
  int r = 0;
  int64_t t = batch.num_requests() > 0 ? batch.q_begin(0) : 0;
  for (;;) {
    int count = 0;
    int64_t wave_blocks = 0;
    for (; count < num_threads && r < batch.num_requests(); ++count) {
      while (r < batch.num_requests() && t >= batch.q_begin(r) + batch.q_len(r))
        if (++r < batch.num_requests()) t = batch.q_begin(r);
      if (r == batch.num_requests()) break;
      const int64_t end = std::min<int64_t>(t + tile, batch.q_begin(r) + batch.q_len(r));
      const int64_t seq_len = batch.seq_len(r);
      wave[count] = {r, t, end,
                     seq_len == 0 ? -1 : seq_len - batch.q_len(r) + (t - batch.q_begin(r))};
      wave_blocks += segment_blocks(wave[count]);
      t = end;
    }
    if (count == 0) return;
    const int64_t item_blocks =
        std::max<int64_t>(kMinItemBlocks, (wave_blocks + kItemsPerThread * num_threads - 1) /
                                              (kItemsPerThread * num_threads));
    const auto ranges = [&](int k) {
      return (segment_blocks(wave[k]) + item_blocks - 1) / item_blocks;
    };
    int64_t items = 0;
    if (scoring)
      for (int k = 0; k < count; ++k) items += ranges(k);
#pragma omp parallel num_threads(num_threads)
    {
      const Scratch own = scratch_of(workspace, width, top_k, omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) {
        int k = 0;
        int64_t range = item;
        while (range >= ranges(k)) range -= ranges(k++);
        const int64_t b0 = range * item_blocks;
        score_block_range(config, batch, scoring->q, scoring->cache, wave[k], b0,
                          std::min(b0 + item_blocks, segment_blocks(wave[k])), width,
                          scratch_of(workspace, width, top_k, k).scores, own);
      }
#pragma omp for schedule(dynamic, 1)
      for (int k = 0; k < count; ++k)
        finish(wave[k], scratch_of(workspace, width, top_k, k).scores, own);
    }
  }
}

// Selection and scoring need per-thread scratch; insert_index_k none.
Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  plan->num_threads = plan_threads(request);
  detail::WorkspaceCarver carver;
  if (request.op != OpKind::insert_index_k)
    carve_workspace(carver, request.capacities.max_blocks_per_request, request.config.top_k,
                    plan->num_threads);
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
  const ScoringInputs scoring{args.index_q, args.index_k_cache};
  run_segments(config, batch, &scoring, workspace, width, num_threads,
               [&](const Segment& seg, float* scores, const Scratch&) {
                 finish_scores(config, seg, width, scores);
                 for (int64_t t = seg.t0; t < seg.t1; ++t)
                   for (int h = 0; h < config.num_index_heads; ++h) {
                     const float* row =
                         scores + ((t - seg.t0) * config.num_index_heads + h) * width;
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
  const ScoringInputs scoring{args.index_q, args.index_k_cache};
  run_segments(config, batch, &scoring, workspace, width, num_threads,
               [&](const Segment& seg, float* scores, const Scratch& s) {
                 finish_scores(config, seg, width, scores);
                 for (int64_t t = seg.t0; t < seg.t1; ++t)
                   select_token(config, scores + (t - seg.t0) * heads * width, width,
                                seg.p0 < 0 ? -1 : seg.p0 + (t - seg.t0), args.topk, t, s);
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
  run_segments(config, batch, nullptr, workspace, width, num_threads,
               [&](const Segment& seg, float* scores, const Scratch& s) {
                 for (int64_t t = seg.t0; t < seg.t1; ++t) {
                   const int64_t position = seg.p0 < 0 ? -1 : seg.p0 + (t - seg.t0);
                   const int64_t n = causal_blocks(position);
                   for (int h = 0; h < heads; ++h) // gather the strided input into contiguous rows
                     for (int64_t b = 0; b < n; ++b)
                       scores[h * width + b] = in.ptr<const float>()[in.offset({h, t, b})];
                   select_token(config, scores, width, position, args.topk, t, s);
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
constexpr const char* kDescription =
    "OpenMP over row tiles and block ranges, fp32, AVX-512 / AVX2 / SSE2 kernels by the CPU";
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
