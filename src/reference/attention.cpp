// Reference block-sparse attention, contract §6: exact softmax over the selected blocks' keys,
// token-level causal mask, double accumulation, one bf16 rounding of the output.
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

// Row (page, offset, head) of a K or V cache, widened.
void load_cache_row(const TensorView& cache, int64_t page, int64_t offset, int64_t head,
                    double* row) {
  const int64_t first = cache.offset({page, offset, head, 0});
  for (int d = 0; d < kHeadDim; ++d) {
    const int64_t i = first + d * cache.strides[3];
    row[d] = cache.dtype == DType::bf16 ? bf16_bits_to_float(cache.ptr<const uint16_t>()[i])
                                        : e4m3_bits_to_float(cache.ptr<const uint8_t>()[i]);
  }
}

struct Scratch {
  double* logits; // [kMaxGqaGroup][K * 128]: a GQA group's query rows, key by key
  int64_t* keys;  // [K * 128] absolute key positions
};

// The one description of the workspace: sizes it at plan time, carves it at run time.
Scratch carve(detail::WorkspaceCarver& carver, int64_t top_k) {
  return {carver.take<double>(kMaxGqaGroup * top_k * kBlockTokens),
          carver.take<int64_t>(top_k * kBlockTokens)};
}

Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  detail::WorkspaceCarver carver;
  carve(carver, request.config.top_k);
  plan->num_threads = 1;
  plan->workspace_bytes = carver.bytes_used();
  return {};
}

// Each query row's sums run in the contract's order (a logit over the dims, a weighted value over
// the keys); the rows of a GQA group go together only so that each K / V row is widened once and
// the group's independent sums overlap.
Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& args, Workspace workspace,
                        const ExecContext&) {
  const detail::HostBatch batch(args.batch);
  const TensorView& kv_table =
      args.kv_block_table.present() ? args.kv_block_table : args.batch.block_table;
  const int64_t num_q_heads = args.q.shape[1];
  const int64_t num_kv_heads = args.k_cache.shape[2];
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t top_k = args.topk.shape[2];
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));

  detail::WorkspaceCarver carver(workspace.data);
  const Scratch scratch = carve(carver, plan.request.config.top_k);
  const int64_t max_keys = plan.request.config.top_k * int64_t{kBlockTokens};
  int64_t* keys = scratch.keys;

  for (int r = 0; r < batch.num_requests(); ++r) {
    const int64_t q_len = batch.q_len(r), seq_len = batch.seq_len(r);
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t t = batch.q_begin(r) + i;
      const int64_t p = seq_len == 0 ? -1 : seq_len - q_len + i;
      for (int64_t g = 0; g < num_kv_heads; ++g) {
        int64_t num_keys = 0;
        for (int64_t slot = 0; slot < top_k; ++slot) {
          const int32_t b = args.topk.ptr<const int32_t>()[args.topk.offset({g, t, slot})];
          if (b < 0) continue;
          for (int64_t j = b * kBlockTokens; j < (b + 1) * kBlockTokens && j <= p && j < seq_len;
               ++j)
            keys[num_keys++] = j;
        }
        double query[kMaxGqaGroup][kHeadDim], row[kHeadDim];
        for (int64_t h = 0; h < group; ++h)
          for (int d = 0; d < kHeadDim; ++d)
            query[h][d] = bf16_bits_to_float(
                args.q.ptr<const uint16_t>()[args.q.offset({t, g * group + h, d})]);
        double max_logit[kMaxGqaGroup], denominator[kMaxGqaGroup];
        std::fill_n(max_logit, group, -std::numeric_limits<double>::infinity());
        for (int64_t n = 0; n < num_keys; ++n) {
          const int64_t page = batch.page(kv_table, r, keys[n] / kBlockTokens);
          load_cache_row(args.k_cache, page, keys[n] % kBlockTokens, g, row);
          double dot[kMaxGqaGroup] = {};
          for (int d = 0; d < kHeadDim; ++d)
            for (int64_t h = 0; h < group; ++h) dot[h] += query[h][d] * row[d] * args.k_scale;
          for (int64_t h = 0; h < group; ++h) {
            double& logit = scratch.logits[h * max_keys + n];
            logit = dot[h] * softmax_scale;
            max_logit[h] = std::max(max_logit[h], logit);
          }
        }
        for (int64_t h = 0; h < group; ++h) {
          double* weights = scratch.logits + h * max_keys; // from here on: unnormalised weights
          denominator[h] = 0;
          for (int64_t n = 0; n < num_keys; ++n) {
            weights[n] = std::exp(weights[n] - max_logit[h]);
            denominator[h] += weights[n];
          }
        }
        double acc[kMaxGqaGroup][kHeadDim] = {};
        for (int64_t n = 0; n < num_keys; ++n) {
          const int64_t page = batch.page(kv_table, r, keys[n] / kBlockTokens);
          load_cache_row(args.v_cache, page, keys[n] % kBlockTokens, g, row);
          for (int64_t h = 0; h < group; ++h)
            for (int d = 0; d < kHeadDim; ++d)
              acc[h][d] += scratch.logits[h * max_keys + n] * row[d] * args.v_scale;
        }
        for (int64_t h = 0; h < group; ++h) {
          const int64_t qh = g * group + h;
          for (int d = 0; d < kHeadDim; ++d) {
            const double value = num_keys == 0 ? 0.0 : acc[h][d] / denominator[h];
            args.out.ptr<uint16_t>()[args.out.offset({t, qh, d})] =
                float_to_bf16_bits(static_cast<float>(value));
          }
          if (args.lse.present()) {
            args.lse.ptr<float>()[args.lse.offset({t, qh})] =
                num_keys == 0 ? -std::numeric_limits<float>::infinity()
                              : static_cast<float>(max_logit[h] + std::log(denominator[h]));
          }
        }
      }
    }
  }
  return {};
}

} // namespace
} // namespace m3sa::ref

namespace m3sa::detail {
extern const Implementation kReferenceSparseAttention;
const Implementation kReferenceSparseAttention = host_implementation(
    "reference.sparse_attention", "the oracle: exact softmax in double, one thread",
    Backend::reference, OpKind::sparse_attention, ref::plan, ref::sparse_attention);
} // namespace m3sa::detail
