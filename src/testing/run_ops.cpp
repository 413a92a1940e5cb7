#include "testing/run_ops.h"

#include <limits>

namespace m3sa::testing {
namespace {

void poison_f32(const HostTensor& t) {
  for (int64_t i = 0; i < t.view().numel(); ++i)
    t.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
}

Status run(OpKind op, const MsaConfig& config, const SyntheticBatch& sb, const RunOptions& options,
           const auto& invoke) {
  PlannedOp planned(plan_request(op, config, sb, options));
  if (!planned.status.ok()) return planned.status;
  return invoke(planned.plan, planned.workspace(), ExecContext{options.num_threads, nullptr});
}

} // namespace

PlanRequest plan_request(OpKind op, const MsaConfig& config, const SyntheticBatch& sb,
                         const RunOptions& options) {
  PlanRequest request;
  request.op = op;
  request.backend = options.backend;
  request.config = config;
  request.capacities = sb.capacities();
  request.cache_dtype = op == OpKind::sparse_attention ? sb.spec().kv_dtype : sb.spec().index_dtype;
  request.num_threads = options.num_threads;
  return request;
}

Status run_score_blocks(const MsaConfig& config, const SyntheticBatch& sb,
                        const RunOptions& options, HostTensor* scores) {
  scores->reset(DType::f32, {config.num_index_heads, sb.num_tokens(), sb.width()});
  poison_f32(*scores);
  return run(OpKind::score_blocks, config, sb, options,
             [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
               return score_blocks(
                   plan, {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), scores->view()},
                   ws, ctx);
             });
}

Status run_select_topk_blocks(const MsaConfig& config, const SyntheticBatch& sb,
                              const HostTensor& scores, const RunOptions& options,
                              HostTensor* topk) {
  topk->reset(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k});
  topk->fill_bytes(0x5a);
  return run(OpKind::select_topk_blocks, config, sb, options,
             [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
               return select_topk_blocks(plan, {scores.view(), sb.batch(), topk->view()}, ws, ctx);
             });
}

Status run_index_topk(const MsaConfig& config, const SyntheticBatch& sb, const RunOptions& options,
                      HostTensor* topk) {
  topk->reset(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k});
  topk->fill_bytes(0x5a);
  return run(OpKind::index_topk, config, sb, options,
             [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
               return index_topk(
                   plan, {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk->view()}, ws,
                   ctx);
             });
}

SparseAttentionArgs attention_args(const SyntheticBatch& sb, const HostTensor& topk,
                                   const HostTensor& out, const HostTensor& lse,
                                   bool use_kv_block_table) {
  SparseAttentionArgs args;
  args.q = sb.q.view();
  args.k_cache = sb.k_cache.view();
  args.v_cache = sb.v_cache.view();
  args.topk = topk.view();
  args.batch = sb.batch();
  if (use_kv_block_table) args.kv_block_table = sb.kv_block_table.view();
  args.out = out.view();
  args.lse = lse.view();
  return args;
}

Status run_sparse_attention(const MsaConfig& config, const SyntheticBatch& sb,
                            const HostTensor& topk, const RunOptions& options, HostTensor* out,
                            HostTensor* lse) {
  out->reset(DType::bf16, {sb.num_tokens(), sb.spec().q_heads, kHeadDim});
  out->fill_bytes(0xff); // bf16 NaN
  lse->reset(DType::f32, {sb.num_tokens(), sb.spec().q_heads});
  poison_f32(*lse);
  return run(OpKind::sparse_attention, config, sb, options,
             [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx) {
               SparseAttentionArgs args =
                   attention_args(sb, topk, *out, *lse, options.use_kv_block_table);
               args.k_scale = options.k_scale;
               args.v_scale = options.v_scale;
               return sparse_attention(plan, args, ws, ctx);
             });
}

} // namespace m3sa::testing
