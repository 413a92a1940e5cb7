// sparse_attention arguments.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/host_batch.h"

namespace m3sa::detail {
namespace {

// Contract §5 output format for rows sparse_attention reads: ascending ids of causal blocks, then
// -1.
Status check_topk_contents(const SparseAttentionArgs& args) {
  const HostBatch batch(args.batch);
  const TensorView& topk = args.topk;
  for (int64_t t = 0; t < topk.shape[1]; ++t) {
    const int r = batch.request_of_token(t);
    const int64_t seq_len = batch.seq_len(r);
    const int64_t position = seq_len == 0 ? -1 : seq_len - batch.q_len(r) + (t - batch.q_begin(r));
    const int64_t n = position < 0 ? 0 : position / kBlockTokens + 1;
    for (int64_t h = 0; h < topk.shape[0]; ++h) {
      int64_t previous = -1;
      bool padding = false;
      for (int64_t k = 0; k < topk.shape[2]; ++k) {
        const int32_t b = topk.ptr<const int32_t>()[topk.offset({h, t, k})];
        const bool ok = b == -1 ? true : (!padding && b > previous && b < n);
        if (!ok)
          return Status::invalid_argument("topk",
                                          concat("ascending unique block ids in [0, ", n,
                                                 ") then -1 (contract §5) for head ", h, " token ",
                                                 t),
                                          concat(b, " in slot ", k));
        if (b == -1)
          padding = true;
        else
          previous = b;
      }
    }
  }
  return {};
}

} // namespace

Status validate_args(const OpPlan& plan, const SparseAttentionArgs& args,
                     const Workspace& workspace) {
  const DeviceKind device = device_of(plan.request.backend);
  const DType kv = plan.request.cache_dtype;
  M3SA_RETURN_IF_ERROR(check_tensor(args.k_cache,
                                    {"k_cache",
                                     {kv},
                                     {kAtLeastOne, kBlockTokens, kAtLeastOne, kHeadDim},
                                     "[num_pages, 128, num_kv_heads, 128] (plan cache_dtype)"},
                                    device));
  const int64_t pages = args.k_cache.shape[0], kv_heads = args.k_cache.shape[2];
  M3SA_RETURN_IF_ERROR(check_tensor(
      args.v_cache, {"v_cache", {kv}, {pages, kBlockTokens, kv_heads, kHeadDim}, "like k_cache"},
      device));
  const bool separate_table = args.kv_block_table.present();
  M3SA_RETURN_IF_ERROR(check_batch(plan, args.batch, device, separate_table ? -1 : pages));
  const int64_t tokens = args.batch.num_tokens;
  M3SA_RETURN_IF_ERROR(check_tensor(
      args.q,
      {"q", {DType::bf16}, {tokens, kAtLeastOne, kHeadDim}, "[num_tokens, num_q_heads, 128]"},
      device));
  const int64_t q_heads = args.q.shape[1];
  if (q_heads % kv_heads != 0 || q_heads / kv_heads > kMaxGqaGroup)
    return Status::invalid_argument("q",
                                    concat("num_q_heads a multiple of num_kv_heads (", kv_heads,
                                           ") with at most ", kMaxGqaGroup, " per KV head"),
                                    args.q.describe());
  if (kv_heads != plan.request.config.num_index_heads)
    return Status::invalid_argument("k_cache",
                                    concat("num_kv_heads == config.num_index_heads (",
                                           plan.request.config.num_index_heads,
                                           "): KV head g reads index head g's selection"),
                                    args.k_cache.describe());
  if (!(args.k_scale > 0.f) || !std::isfinite(args.k_scale))
    return Status::invalid_argument("k_scale", "a finite value > 0", std::to_string(args.k_scale));
  if (!(args.v_scale > 0.f) || !std::isfinite(args.v_scale))
    return Status::invalid_argument("v_scale", "a finite value > 0", std::to_string(args.v_scale));
  M3SA_RETURN_IF_ERROR(check_tensor(args.topk,
                                    {"topk",
                                     {DType::i32},
                                     {kv_heads, tokens, plan.request.config.top_k},
                                     "[num_kv_heads, num_tokens, top_k]",
                                     false},
                                    device));
  M3SA_RETURN_IF_ERROR(check_optional_tensor(args.kv_block_table,
                                             {"kv_block_table",
                                              {DType::i32},
                                              {args.batch.num_requests, kAtLeastOne},
                                              "[num_requests, max_blocks]",
                                              false},
                                             device));
  M3SA_RETURN_IF_ERROR(check_tensor(args.out,
                                    {"out",
                                     {DType::bf16},
                                     {tokens, q_heads, kHeadDim},
                                     "[num_tokens, num_q_heads, 128]",
                                     true,
                                     true},
                                    device));
  M3SA_RETURN_IF_ERROR(check_optional_tensor(
      args.lse, {"lse", {DType::f32}, {tokens, q_heads}, "[num_tokens, num_q_heads]", false, true},
      device));
  // CUDA kernels copy 16-byte chunks of q, K, V and out rows.
  for (const auto& [rows, name] : {std::pair{&args.q, "q"}, std::pair{&args.k_cache, "k_cache"},
                                   std::pair{&args.v_cache, "v_cache"}, std::pair{&args.out, "out"}})
    M3SA_RETURN_IF_ERROR(check_vector_rows(*rows, name, device));
  M3SA_RETURN_IF_ERROR(check_aliasing({{args.out, "out"}, {args.lse, "lse"}},
                                      {{args.q, "q"},
                                       {args.k_cache, "k_cache"},
                                       {args.v_cache, "v_cache"},
                                       {args.topk, "topk"},
                                       {args.kv_block_table, "kv_block_table"}},
                                      &args.batch, workspace));
  if (host_readable(device)) {
    if (separate_table)
      M3SA_RETURN_IF_ERROR(
          check_block_table_pages(args.batch, args.kv_block_table, "kv_block_table", pages));
    M3SA_RETURN_IF_ERROR(check_topk_contents(args));
  }
  return {};
}
} // namespace m3sa::detail
