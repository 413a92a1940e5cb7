// Reference block-sparse attention, contract §6: exact softmax over the selected blocks' keys,
// token-level causal mask, double accumulation, one bf16 rounding of the output.
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/host_batch.h"
#include "common/workspace.h"
#include "m3sa/numeric.h"
#include "registry/registry.h"

namespace m3sa::ref {
namespace {

double load_cache(const TensorView& cache, int64_t page, int64_t offset, int64_t head, int d) {
  const int64_t i = cache.offset({page, offset, head, d});
  if (cache.dtype == DType::bf16) return bf16_bits_to_float(cache.ptr<const uint16_t>()[i]);
  return e4m3_bits_to_float(cache.ptr<const uint8_t>()[i]);
}

struct Scratch {
  double* logits; // [K * 128] of one query row
  int64_t* keys;  // [K * 128] absolute key positions
};

// The one description of the workspace: sizes it at plan time, carves it at run time.
Scratch carve(detail::WorkspaceCarver& carver, int64_t top_k) {
  return {carver.take<double>(top_k * kBlockTokens), carver.take<int64_t>(top_k * kBlockTokens)};
}

Status plan(const PlanRequest& request, const detail::DeviceCaps&, OpPlan* plan) {
  detail::WorkspaceCarver carver;
  carve(carver, request.config.top_k);
  plan->num_threads = 1;
  plan->workspace_bytes = carver.bytes_used();
  return {};
}

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
  double* logits = scratch.logits;
  int64_t* keys = scratch.keys;

  for (int r = 0; r < batch.num_requests(); ++r) {
    const int64_t q_len = batch.q_len(r), seq_len = batch.seq_len(r);
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t t = batch.q_begin(r) + i;
      const int64_t p = seq_len == 0 ? -1 : seq_len - q_len + i;
      for (int64_t qh = 0; qh < num_q_heads; ++qh) {
        const int64_t g = qh / group;
        int64_t num_keys = 0;
        for (int64_t slot = 0; slot < top_k; ++slot) {
          const int32_t b = args.topk.ptr<const int32_t>()[args.topk.offset({g, t, slot})];
          if (b < 0) continue;
          for (int64_t j = b * kBlockTokens; j < (b + 1) * kBlockTokens && j <= p && j < seq_len;
               ++j)
            keys[num_keys++] = j;
        }
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int64_t n = 0; n < num_keys; ++n) {
          const int64_t page = batch.page(kv_table, r, keys[n] / kBlockTokens);
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d) {
            dot += bf16_bits_to_float(args.q.ptr<const uint16_t>()[args.q.offset({t, qh, d})]) *
                   load_cache(args.k_cache, page, keys[n] % kBlockTokens, g, d) * args.k_scale;
          }
          logits[n] = dot * softmax_scale;
          max_logit = std::max(max_logit, logits[n]);
        }
        double denominator = 0;
        for (int64_t n = 0; n < num_keys; ++n) {
          logits[n] = std::exp(logits[n] - max_logit); // from here on: unnormalised weights
          denominator += logits[n];
        }
        for (int d = 0; d < kHeadDim; ++d) {
          double acc = 0;
          for (int64_t n = 0; n < num_keys; ++n) {
            const int64_t page = batch.page(kv_table, r, keys[n] / kBlockTokens);
            acc += logits[n] * load_cache(args.v_cache, page, keys[n] % kBlockTokens, g, d) *
                   args.v_scale;
          }
          const double value = num_keys == 0 ? 0.0 : acc / denominator;
          args.out.ptr<uint16_t>()[args.out.offset({t, qh, d})] =
              float_to_bf16_bits(static_cast<float>(value));
        }
        if (args.lse.present()) {
          args.lse.ptr<float>()[args.lse.offset({t, qh})] =
              num_keys == 0 ? -std::numeric_limits<float>::infinity()
                            : static_cast<float>(max_logit + std::log(denominator));
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
