// Public entry points: validate once, then dispatch on the plan's backend.
#include "m3sa/ops.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "api/validate.h"
#include "common/check.h"
#include "common/host_batch.h"
#include "cpu/cpu.h"
#ifdef M3SA_HAVE_CUDA
#include "cuda/backend.h"
#endif
#include "m3sa/capabilities.h"
#include "reference/reference.h"

namespace m3sa {
namespace {

using detail::check_cache_dtype_rows;
using detail::check_disjoint;
using detail::check_disjoint_from_scoring_inputs;
using detail::check_index_cache;
using detail::check_scoring_inputs;
using detail::check_tensor;
using detail::check_topk_out;
using detail::kAnyExtent;
using detail::kAtLeastOne;
using detail::TensorRule;

Status with_op(OpKind op, Status status) {
  if (status.ok()) return status;
  return {status.code(), std::string("m3sa::") + to_string(op) + ": " + status.message()};
}

int threads_for(const OpPlan& plan, const ExecContext& ctx) {
  return ctx.num_threads > 0 ? std::min(ctx.num_threads, plan.num_threads) : plan.num_threads;
}

#ifdef M3SA_HAVE_CUDA
#define M3SA_CUDA_DISPATCH(call) return cuda::call
#else
#define M3SA_CUDA_DISPATCH(call)                                                                   \
  return Status::unsupported("backend cuda", "m3sa was built without it")
#endif

int64_t rows_of(const BatchMetadata& batch) { return batch.num_tokens; }

// Every op's body: common run checks and the op's own validation (errors prefixed with the op's
// name), then the plan's backend.
template <typename Validate, typename OnReference, typename OnCpu, typename OnCuda>
Status validate_and_dispatch(OpKind op, const OpPlan& plan, const Workspace& workspace,
                             const ExecContext& ctx, Validate validate, OnReference on_reference,
                             OnCpu on_cpu, OnCuda on_cuda) {
  M3SA_RETURN_IF_ERROR(with_op(op, detail::check_run_common(plan, op, workspace, ctx)));
  M3SA_RETURN_IF_ERROR(with_op(op, validate()));
  switch (plan.request.backend) {
  case Backend::reference:
    on_reference();
    return {};
  case Backend::cpu:
    on_cpu();
    return {};
  case Backend::cuda:
    return with_op(op, on_cuda());
  }
  return Status(StatusCode::internal, "unknown backend");
}

Status check_scores(const OpPlan& plan, const TensorView& scores, const BatchMetadata& batch,
                    bool output, DeviceKind device) {
  M3SA_RETURN_IF_ERROR(
      check_tensor(scores,
                   {"scores",
                    {DType::f32},
                    {plan.request.config.num_index_heads, rows_of(batch), kAtLeastOne},
                    "[num_index_heads, num_tokens, N]",
                    false,
                    output},
                   device));
  if (scores.shape[2] < batch.block_table.shape[1])
    return Status::invalid_argument(
        "scores", detail::concat("N >= block-table width ", batch.block_table.shape[1]),
        scores.describe());
  return {};
}

// Contract §5 output format for rows sparse_attention reads: ascending ids of causal blocks, then
// -1.
Status check_topk_contents(const SparseAttentionArgs& args) {
  const detail::HostBatch batch(args.batch);
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
                                          detail::concat("ascending unique block ids in [0, ", n,
                                                         ") then -1 (contract §5) for head ", h,
                                                         " token ", t),
                                          detail::concat(b, " in slot ", k));
        if (b == -1)
          padding = true;
        else
          previous = b;
      }
    }
  }
  return {};
}

// An output may be its input exactly (in place: same pointer, dtype, shape and strides), or
// disjoint from it.
Status check_in_place_or_disjoint(const TensorView& out, const char* out_name, const TensorView& in,
                                  const char* in_name) {
  bool same = out.data == in.data && out.dtype == in.dtype && out.rank == in.rank;
  for (int d = 0; same && d < out.rank; ++d)
    same = out.shape[d] == in.shape[d] && out.strides[d] == in.strides[d];
  return same ? Status{} : check_disjoint(out, out_name, in, in_name);
}

// Slots of a [T] i64 mapping below pages x 128 (or negative: skipped).
Status check_slots(const TensorView& slots, const char* name, int64_t pages) {
  for (int64_t t = 0; t < slots.shape[0]; ++t) {
    const int64_t slot = slots.ptr<const int64_t>()[t * slots.strides[0]];
    if (slot >= pages * kBlockTokens)
      return Status::invalid_argument(
          name,
          detail::concat("slots < num_pages x 128 = ", pages * kBlockTokens, ", or < 0 to skip"),
          detail::concat(slot, " at row ", t));
  }
  return {};
}

Status check_norm_rope_args(const OpPlan& plan, const NormRopeInsertArgs& a, DeviceKind device) {
  const MsaConfig& config = plan.request.config;
  if (!std::isfinite(config.rms_norm_eps) || config.rms_norm_eps < 0.f)
    return Status::invalid_argument("config.rms_norm_eps", "a finite value >= 0",
                                    std::to_string(config.rms_norm_eps));
  if (!std::isfinite(config.norm_weight_offset))
    return Status::invalid_argument("config.norm_weight_offset", "a finite value",
                                    std::to_string(config.norm_weight_offset));
  if (!a.cos_sin_cache.present() && !(config.rope_theta > 1.0 && std::isfinite(config.rope_theta)))
    return Status::invalid_argument("config.rope_theta", "a finite value > 1",
                                    std::to_string(config.rope_theta));
  const auto rows = [&](const TensorView& t, const char* name, std::initializer_list<DType> dtypes,
                        std::initializer_list<int64_t> shape, const char* text,
                        bool output) -> Status {
    M3SA_RETURN_IF_ERROR(check_tensor(t, {name, dtypes, shape, text, true, output}, device));
    return detail::check_vector_rows(t, name, device);
  };
  M3SA_RETURN_IF_ERROR(
      rows(a.q, "q", {DType::bf16}, {kAtLeastOne, kAtLeastOne, kHeadDim}, "[T, Hq, 128]", false));
  const int64_t tokens = a.q.shape[0], q_heads = a.q.shape[1];
  if (tokens > plan.request.capacities.max_tokens)
    return Status::invalid_argument(
        "q",
        detail::concat("at most ", plan.request.capacities.max_tokens, " tokens (plan capacity)"),
        a.q.describe());
  M3SA_RETURN_IF_ERROR(
      rows(a.k, "k", {DType::bf16}, {tokens, kAtLeastOne, kHeadDim}, "[T, Hkv, 128]", false));
  const int64_t kv_heads = a.k.shape[1];
  M3SA_RETURN_IF_ERROR(
      rows(a.v, "v", {DType::bf16}, {tokens, kv_heads, kHeadDim}, "[T, Hkv, 128]", false));
  M3SA_RETURN_IF_ERROR(rows(a.index_q, "index_q", {DType::bf16},
                            {tokens, config.num_index_heads, kHeadDim}, "[T, num_index_heads, 128]",
                            false));
  M3SA_RETURN_IF_ERROR(
      rows(a.index_k, "index_k", {DType::bf16}, {tokens, kHeadDim}, "[T, 128]", false));
  const std::pair<const TensorView*, const char*> weights[] = {
      {&a.q_norm_weight, "q_norm_weight"},
      {&a.k_norm_weight, "k_norm_weight"},
      {&a.index_q_norm_weight, "index_q_norm_weight"},
      {&a.index_k_norm_weight, "index_k_norm_weight"}};
  for (const auto& [w, name] : weights)
    M3SA_RETURN_IF_ERROR(
        check_tensor(*w, {name, {DType::bf16, DType::f32}, {kHeadDim}, "[128]"}, device));
  M3SA_RETURN_IF_ERROR(detail::check_optional_tensor(
      a.cos_sin_cache,
      {"cos_sin_cache", {DType::bf16, DType::f32}, {kAtLeastOne, kRotaryDim}, "[max_pos, 64]"},
      device));
  M3SA_RETURN_IF_ERROR(
      check_tensor(a.positions, {"positions", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(
      check_tensor(a.slot_mapping, {"slot_mapping", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(check_tensor(
      a.index_slot_mapping, {"index_slot_mapping", {DType::i64}, {tokens}, "[T]", false}, device));
  M3SA_RETURN_IF_ERROR(
      rows(a.q_out, "q_out", {DType::bf16}, {tokens, q_heads, kHeadDim}, "[T, Hq, 128]", true));
  M3SA_RETURN_IF_ERROR(rows(a.k_cache, "k_cache", {DType::bf16, DType::fp8_e4m3},
                            {kAtLeastOne, kBlockTokens, kv_heads, kHeadDim},
                            "[num_pages, 128, Hkv, 128]", true));
  M3SA_RETURN_IF_ERROR(rows(a.v_cache, "v_cache", {a.k_cache.dtype},
                            {a.k_cache.shape[0], kBlockTokens, kv_heads, kHeadDim},
                            "[num_pages, 128, Hkv, 128] like k_cache", true));
  for (const auto& [scale, name] :
       {std::pair{a.k_scale, "k_scale"}, std::pair{a.v_scale, "v_scale"}})
    if (!(scale > 0.f) || !std::isfinite(scale))
      return Status::invalid_argument(name, "a finite value > 0", std::to_string(scale));
  M3SA_RETURN_IF_ERROR(check_cache_dtype_rows(plan, a.index_q_out,
                                              {"index_q_out",
                                               {DType::bf16, DType::fp8_e4m3},
                                               {tokens, config.num_index_heads, kHeadDim},
                                               "[T, num_index_heads, 128]",
                                               true,
                                               true},
                                              "index-Q follows the index cache dtype", device));
  M3SA_RETURN_IF_ERROR(check_cache_dtype_rows(plan, a.index_k_cache,
                                              {"index_k_cache",
                                               {DType::bf16, DType::fp8_e4m3},
                                               {kAtLeastOne, kBlockTokens, kHeadDim},
                                               "[num_pages, 128, 128]",
                                               true,
                                               true},
                                              "the plan's cache_dtype", device));

  // Outputs: pairwise disjoint, disjoint from every input except their own (in place).
  const std::pair<const TensorView*, const char*> outputs[] = {{&a.q_out, "q_out"},
                                                               {&a.k_cache, "k_cache"},
                                                               {&a.v_cache, "v_cache"},
                                                               {&a.index_q_out, "index_q_out"},
                                                               {&a.index_k_cache, "index_k_cache"}};
  const std::pair<const TensorView*, const char*> inputs[] = {
      {&a.q, "q"},
      {&a.k, "k"},
      {&a.v, "v"},
      {&a.index_q, "index_q"},
      {&a.index_k, "index_k"},
      {&a.positions, "positions"},
      {&a.q_norm_weight, "q_norm_weight"},
      {&a.k_norm_weight, "k_norm_weight"},
      {&a.index_q_norm_weight, "index_q_norm_weight"},
      {&a.index_k_norm_weight, "index_k_norm_weight"},
      {&a.cos_sin_cache, "cos_sin_cache"},
      {&a.slot_mapping, "slot_mapping"},
      {&a.index_slot_mapping, "index_slot_mapping"}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    const auto& [out, out_name] = outputs[i];
    for (size_t j = i + 1; j < std::size(outputs); ++j)
      M3SA_RETURN_IF_ERROR(check_disjoint(*out, out_name, *outputs[j].first, outputs[j].second));
    for (const auto& [in, in_name] : inputs) {
      const bool own_input =
          (out == &a.q_out && in == &a.q) || (out == &a.index_q_out && in == &a.index_q);
      M3SA_RETURN_IF_ERROR(own_input ? check_in_place_or_disjoint(*out, out_name, *in, in_name)
                                     : check_disjoint(*out, out_name, *in, in_name));
    }
  }
  if (!detail::host_readable(device)) return {}; // positions and slots: the device flags them
  const int64_t max_position = a.cos_sin_cache.present()
                                   ? std::min<int64_t>(a.cos_sin_cache.shape[0], kMaxRopePosition)
                                   : kMaxRopePosition;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t position = a.positions.ptr<const int64_t>()[t * a.positions.strides[0]];
    if (position < 0 || position >= max_position)
      return Status::invalid_argument(
          "positions",
          detail::concat("values in [0, ", max_position, ")",
                         a.cos_sin_cache.present() ? " (cos_sin_cache rows)" : ""),
          detail::concat(position, " at row ", t));
  }
  M3SA_RETURN_IF_ERROR(check_slots(a.slot_mapping, "slot_mapping", a.k_cache.shape[0]));
  return check_slots(a.index_slot_mapping, "index_slot_mapping", a.index_k_cache.shape[0]);
}

} // namespace

Status make_plan(const PlanRequest& request, OpPlan* plan) {
  if (plan == nullptr) return Status::invalid_argument("plan", "a non-null OpPlan*", "nullptr");
  M3SA_RETURN_IF_ERROR(with_op(request.op, detail::check_plan_request(request)));
  M3SA_RETURN_IF_ERROR(with_op(
      request.op, supports(request.backend, request.op, request.config, request.cache_dtype)));
  OpPlan result;
  result.request = request;
  switch (request.backend) {
  case Backend::reference:
    result.num_threads = 1;
    result.workspace_bytes = ref::workspace_bytes(request);
    break;
  case Backend::cpu:
    result.num_threads = request.num_threads > 0 ? request.num_threads : cpu::default_num_threads();
    result.workspace_bytes = cpu::workspace_bytes(request, result.num_threads);
    break;
  case Backend::cuda: {
#ifdef M3SA_HAVE_CUDA
    M3SA_RETURN_IF_ERROR(with_op(request.op, cuda::make_plan(request, &result)));
    break;
#else
    return Status::unsupported("backend cuda", "m3sa was built without it");
#endif
  }
  }
  *plan = result;
  return {};
}

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      const ExecContext& ctx) {
  const OpKind op = OpKind::insert_index_k;
  const DeviceKind device = detail::device_of(plan.request.backend);
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&]() -> Status {
        M3SA_RETURN_IF_ERROR(check_tensor(
            args.index_k,
            {"index_k", {DType::bf16, DType::f32}, {kAnyExtent, kHeadDim}, "[num_tokens, 128]"},
            device));
        M3SA_RETURN_IF_ERROR(detail::check_vector_rows(args.index_k, "index_k", device));
        const int64_t tokens = args.index_k.shape[0];
        if (tokens > plan.request.capacities.max_tokens)
          return Status::invalid_argument("index_k",
                                          detail::concat("at most ",
                                                         plan.request.capacities.max_tokens,
                                                         " rows (plan capacity)"),
                                          args.index_k.describe());
        M3SA_RETURN_IF_ERROR(
            check_tensor(args.slot_mapping,
                         {"slot_mapping", {DType::i64}, {tokens}, "[num_tokens]", false}, device));
        TensorView cache = args.index_k_cache;
        M3SA_RETURN_IF_ERROR(check_index_cache(plan, cache, device));
        M3SA_RETURN_IF_ERROR(check_tensor(cache,
                                          {"index_k_cache",
                                           {cache.dtype},
                                           {kAtLeastOne, kBlockTokens, kHeadDim},
                                           "[num_pages, 128, 128]",
                                           true,
                                           true},
                                          device));
        M3SA_RETURN_IF_ERROR(check_disjoint(cache, "index_k_cache", args.index_k, "index_k"));
        M3SA_RETURN_IF_ERROR(
            check_disjoint(cache, "index_k_cache", args.slot_mapping, "slot_mapping"));
        if (detail::host_readable(device)) {
          const int64_t slots = cache.shape[0] * kBlockTokens;
          for (int64_t t = 0; t < tokens; ++t) {
            const int64_t slot =
                args.slot_mapping.ptr<const int64_t>()[t * args.slot_mapping.strides[0]];
            if (slot >= slots)
              return Status::invalid_argument(
                  "slot_mapping",
                  detail::concat("slots < num_pages x 128 = ", slots, ", or < 0 to skip"),
                  detail::concat(slot, " at row ", t));
          }
        }
        return {};
      },
      [&] { ref::insert_index_k(args); },
      [&] { cpu::insert_index_k(args, threads_for(plan, ctx)); },
      [&]() -> Status { M3SA_CUDA_DISPATCH(insert_index_k(plan, args, workspace, ctx.stream)); });
}

Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    const ExecContext& ctx) {
  const OpKind op = OpKind::score_blocks;
  const DeviceKind device = detail::device_of(plan.request.backend);
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&]() -> Status {
        M3SA_RETURN_IF_ERROR(
            check_scoring_inputs(plan, args.index_q, args.index_k_cache, args.batch, device));
        M3SA_RETURN_IF_ERROR(check_scores(plan, args.scores, args.batch, true, device));
        return check_disjoint_from_scoring_inputs(args.scores, "scores", args.index_q,
                                                  args.index_k_cache);
      },
      [&] { ref::score_blocks(plan.request.config, args); },
      [&] { cpu::score_blocks(plan.request.config, args, workspace, threads_for(plan, ctx)); },
      [&]() -> Status { M3SA_CUDA_DISPATCH(score_blocks(plan, args, workspace, ctx.stream)); });
}

Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext& ctx) {
  const OpKind op = OpKind::select_topk_blocks;
  const DeviceKind device = detail::device_of(plan.request.backend);
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&]() -> Status {
        M3SA_RETURN_IF_ERROR(detail::check_batch(plan, args.batch, device, -1));
        M3SA_RETURN_IF_ERROR(check_scores(plan, args.scores, args.batch, false, device));
        M3SA_RETURN_IF_ERROR(check_topk_out(plan, args.topk, rows_of(args.batch), device));
        M3SA_RETURN_IF_ERROR(check_disjoint(args.topk, "topk", args.scores, "scores"));
        return {};
      },
      [&] { ref::select_topk_blocks(plan.request.config, args, workspace); },
      [&] {
        cpu::select_topk_blocks(plan.request.config, args, workspace, threads_for(plan, ctx));
      },
      [&]() -> Status {
        M3SA_CUDA_DISPATCH(select_topk_blocks(plan, args, workspace, ctx.stream));
      });
}

Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext& ctx) {
  const OpKind op = OpKind::index_topk;
  const DeviceKind device = detail::device_of(plan.request.backend);
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&]() -> Status {
        M3SA_RETURN_IF_ERROR(
            check_scoring_inputs(plan, args.index_q, args.index_k_cache, args.batch, device));
        M3SA_RETURN_IF_ERROR(check_topk_out(plan, args.topk, rows_of(args.batch), device));
        return check_disjoint_from_scoring_inputs(args.topk, "topk", args.index_q,
                                                  args.index_k_cache);
      },
      [&] { ref::index_topk(plan.request.config, args, workspace); },
      [&] { cpu::index_topk(plan.request.config, args, workspace, threads_for(plan, ctx)); },
      [&]() -> Status { M3SA_CUDA_DISPATCH(index_topk(plan, args, workspace, ctx.stream)); });
}

Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& args, Workspace workspace,
                        const ExecContext& ctx) {
  const OpKind op = OpKind::sparse_attention;
  const DeviceKind device = detail::device_of(plan.request.backend);
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&]() -> Status {
        const DType kv = plan.request.cache_dtype;
        M3SA_RETURN_IF_ERROR(
            check_tensor(args.k_cache,
                         {"k_cache",
                          {kv},
                          {kAtLeastOne, kBlockTokens, kAtLeastOne, kHeadDim},
                          "[num_pages, 128, num_kv_heads, 128] (plan cache_dtype)"},
                         device));
        const int64_t pages = args.k_cache.shape[0], kv_heads = args.k_cache.shape[2];
        M3SA_RETURN_IF_ERROR(check_tensor(
            args.v_cache,
            {"v_cache", {kv}, {pages, kBlockTokens, kv_heads, kHeadDim}, "like k_cache"}, device));
        const bool separate_table = args.kv_block_table.present();
        M3SA_RETURN_IF_ERROR(
            detail::check_batch(plan, args.batch, device, separate_table ? -1 : pages));
        const int64_t tokens = rows_of(args.batch);
        M3SA_RETURN_IF_ERROR(check_tensor(
            args.q,
            {"q", {DType::bf16}, {tokens, kAtLeastOne, kHeadDim}, "[num_tokens, num_q_heads, 128]"},
            device));
        M3SA_RETURN_IF_ERROR(detail::check_vector_rows(args.q, "q", device));
        M3SA_RETURN_IF_ERROR(detail::check_vector_rows(args.k_cache, "k_cache", device));
        M3SA_RETURN_IF_ERROR(detail::check_vector_rows(args.v_cache, "v_cache", device));
        const int64_t q_heads = args.q.shape[1];
        if (q_heads % kv_heads != 0 || q_heads / kv_heads > kMaxGqaGroup)
          return Status::invalid_argument("q",
                                          detail::concat("num_q_heads a multiple of num_kv_heads (",
                                                         kv_heads, ") with at most ", kMaxGqaGroup,
                                                         " per KV head"),
                                          args.q.describe());
        if (kv_heads != plan.request.config.num_index_heads)
          return Status::invalid_argument(
              "k_cache",
              detail::concat("num_kv_heads == config.num_index_heads (",
                             plan.request.config.num_index_heads,
                             "): KV head g reads index head g's selection"),
              args.k_cache.describe());
        if (!(args.k_scale > 0.f) || !std::isfinite(args.k_scale))
          return Status::invalid_argument("k_scale", "a finite value > 0",
                                          std::to_string(args.k_scale));
        if (!(args.v_scale > 0.f) || !std::isfinite(args.v_scale))
          return Status::invalid_argument("v_scale", "a finite value > 0",
                                          std::to_string(args.v_scale));
        M3SA_RETURN_IF_ERROR(check_tensor(args.topk,
                                          {"topk",
                                           {DType::i32},
                                           {kv_heads, tokens, plan.request.config.top_k},
                                           "[num_kv_heads, num_tokens, top_k]",
                                           false},
                                          device));
        M3SA_RETURN_IF_ERROR(detail::check_optional_tensor(args.kv_block_table,
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
        M3SA_RETURN_IF_ERROR(detail::check_vector_rows(args.out, "out", device));
        M3SA_RETURN_IF_ERROR(detail::check_optional_tensor(
            args.lse,
            {"lse", {DType::f32}, {tokens, q_heads}, "[num_tokens, num_q_heads]", false, true},
            device));
        const std::pair<const TensorView*, const char*> inputs[] = {{&args.q, "q"},
                                                                    {&args.k_cache, "k_cache"},
                                                                    {&args.v_cache, "v_cache"},
                                                                    {&args.topk, "topk"}};
        for (const auto& [input, name] : inputs) {
          M3SA_RETURN_IF_ERROR(check_disjoint(args.out, "out", *input, name));
          M3SA_RETURN_IF_ERROR(check_disjoint(args.lse, "lse", *input, name));
        }
        M3SA_RETURN_IF_ERROR(check_disjoint(args.out, "out", args.lse, "lse"));
        if (detail::host_readable(device)) {
          if (separate_table)
            M3SA_RETURN_IF_ERROR(detail::check_block_table_pages(args.batch, args.kv_block_table,
                                                                 "kv_block_table", pages));
          M3SA_RETURN_IF_ERROR(check_topk_contents(args));
        }
        return {};
      },
      [&] { ref::sparse_attention(args, workspace); },
      [&] { cpu::sparse_attention(plan.request, args, workspace, threads_for(plan, ctx)); },
      [&]() -> Status { M3SA_CUDA_DISPATCH(sparse_attention(plan, args, workspace, ctx.stream)); });
}

namespace {
// The workspace arguments of prepare_workspace and read_device_errors.
Status check_control_workspace(const OpPlan& plan, Workspace workspace) {
  if (workspace.bytes < plan.workspace_bytes || (workspace.data == nullptr && workspace.bytes > 0))
    return Status::invalid_argument(
        "workspace", detail::concat("the plan's workspace (>= ", plan.workspace_bytes, " bytes)"),
        detail::concat(workspace.bytes, " bytes at ", workspace.data));
  return {};
}
} // namespace

Status prepare_workspace(const OpPlan& plan, Workspace workspace, const ExecContext& ctx) {
  (void)ctx; // only the CUDA backend has a stream (and a build without it none)
  M3SA_RETURN_IF_ERROR(check_control_workspace(plan, workspace));
  if (plan.request.backend != Backend::cuda) return {};
  M3SA_CUDA_DISPATCH(prepare_workspace(plan, workspace, ctx.stream));
}

Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& args, Workspace workspace,
                        const ExecContext& ctx) {
  const OpKind op = OpKind::norm_rope_insert;
  return validate_and_dispatch(
      op, plan, workspace, ctx,
      [&] { return check_norm_rope_args(plan, args, detail::device_of(plan.request.backend)); },
      [&] { ref::norm_rope_insert(plan.request.config, args); },
      [&] { cpu::norm_rope_insert(plan.request.config, args, threads_for(plan, ctx)); },
      [&]() -> Status { M3SA_CUDA_DISPATCH(norm_rope_insert(plan, args, workspace, ctx.stream)); });
}

Status read_device_errors(const OpPlan& plan, Workspace workspace, const ExecContext& ctx,
                          int32_t* flags) {
  (void)ctx; // only the CUDA backend has a stream (and a build without it none)
  if (flags == nullptr) return Status::invalid_argument("flags", "a non-null int32_t*", "nullptr");
  *flags = 0;
  M3SA_RETURN_IF_ERROR(check_control_workspace(plan, workspace));
  if (plan.request.backend != Backend::cuda) return {};
  M3SA_CUDA_DISPATCH(read_device_errors(plan, workspace, ctx.stream, flags));
}

} // namespace m3sa
