// The single-GPU cases of `m3sa bench`: the indexer ops over the case table, and norm_rope_insert.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_timing.h"
#include "testing/host_tensor.h"

namespace m3sa::cli::bench {

using testing::HostTensor;
using testing::Rng;

std::vector<Case> cases(const std::string& set) {
  std::vector<Case> all;
  const DType dtypes[2] = {DType::bf16, DType::fp8_e4m3};
  for (DType d : dtypes) {
    const char* dn = d == DType::bf16 ? "bf16" : "fp8";
    // H=4: TP1's four index heads per token (the peer's grid has both); quick keeps H=1.
    for (int h : {1, 4})
      for (int b : {1, 32, 128})
        for (int s : {8192, 32768, 131072})
          if (set == "full" ? true : h == 1 && b != 32 && s != 8192)
            all.push_back({std::string("decode ") + dn + " B=" + std::to_string(b) +
                               " S=" + std::to_string(s / 1024) + "K H=" + std::to_string(h),
                           true, b, s, 1, h, d});
    all.push_back({std::string("decode ") + dn + " B=1 S=1M H=1", true, 1, 1 << 20, 1, 1, d});
    for (int h : {1, 4})
      for (int s : {8192, 32768, 131072})
        if (set == "full" || s == 131072)
          all.push_back({std::string("prefill ") + dn + " C=8K S=" + std::to_string(s / 1024) +
                             "K H=" + std::to_string(h),
                         false, 1, s, 8192, h, d});
    if (set == "full")
      all.push_back(
          {std::string("prefill ") + dn + " C=16K S=1M H=4", false, 1, 1 << 20, 16384, 4, d});
  }
  return all;
}

std::vector<int32_t> page_order(int64_t pages, bool in_order) {
  std::vector<int32_t> perm(pages);
  for (int64_t i = 0; i < pages; ++i) perm[i] = static_cast<int32_t>(i);
  Rng rng(5);
  if (!in_order)
    for (int64_t i = pages - 1; i > 0; --i)
      std::swap(perm[i], perm[rng.uniform_int(0, static_cast<int>(i))]);
  return perm;
}

// One case: build data sets (decode: as the peer rotates them; prefill: enough to rotate past 2x
// L2 for small caches), plan the three ops, time each: score_blocks, select_topk_blocks,
// index_topk.
Status run_case(const Case& c, cudaStream_t stream, const Ceilings& ceilings,
                std::vector<Record>* records) {
  const int blocks = (c.context + 127) / 128;
  const int64_t pages = int64_t{c.batch} * blocks;
  const int64_t tokens = c.decode ? c.batch : c.chunk;
  const size_t elem = dtype_size(c.dtype);
  const size_t cache_bytes = static_cast<size_t>(pages) * 128 * 128 * elem;
  const int sets = c.decode ? decode_rotation_sets(cache_bytes) : cold_l2_sets(cache_bytes);
  const int calls = c.decode ? decode_graph_calls(sets) : sets; // a timed graph's calls
  std::vector<DeviceBuffer> caches;
  for (int i = 0; i < sets; ++i) {
    caches.emplace_back(cache_bytes);
    M3SA_RETURN_IF_ERROR(caches.back().fill_random(c.dtype, 10 + i));
  }
  // Metadata: decode requests each hold `context` tokens; a prefill request is one chunk at its
  // end.
  HostTensor cu(DType::i32, {c.batch + 1}), seq(DType::i32, {c.batch}),
      table(DType::i32, {c.batch, blocks});
  const std::vector<int32_t> perm = page_order(pages, c.pages_in_order);
  for (int r = 0; r <= c.batch; ++r) cu.data<int32_t>()[r] = c.decode ? r : (r == 0 ? 0 : c.chunk);
  for (int r = 0; r < c.batch; ++r) {
    seq.data<int32_t>()[r] = c.context;
    for (int b = 0; b < blocks; ++b) table.data<int32_t>()[r * blocks + b] = perm[r * blocks + b];
  }
  const DeviceBuffer d_cu(cu), d_seq(seq), d_table(table),
      d_q(static_cast<size_t>(tokens) * c.heads * 128 * elem);
  for (const DeviceBuffer* d : {&d_cu, &d_seq, &d_table}) M3SA_RETURN_IF_ERROR(d->status());
  M3SA_RETURN_IF_ERROR(d_q.fill_random(c.dtype, 3));
  const BatchMetadata batch{d_cu.view(),
                            d_seq.view(),
                            d_table.view(),
                            c.batch,
                            c.decode ? c.batch : 0,
                            1,
                            static_cast<int>(tokens)};
  const TensorView q = d_q.view(c.dtype, {tokens, c.heads, 128});
  MsaConfig config;
  config.num_index_heads = c.heads;
  const DeviceBuffer d_scores(static_cast<size_t>(c.heads) * tokens * blocks * 4),
      d_topk(static_cast<size_t>(c.heads) * tokens * 16 * 4);
  const TensorView scores = d_scores.view(DType::f32, {c.heads, tokens, blocks});
  const TensorView topk = d_topk.view(DType::i32, {c.heads, tokens, 16});

  // Bytes: every key row once (plus the queries); FLOPs: 2 * 128 per visible (query row, key).
  double visible = 0;
  for (int64_t t = 0; t < tokens; ++t)
    visible += c.decode ? c.context : (c.context - c.chunk + t + 1);
  const double flops = 2.0 * 128 * c.heads * visible;
  const double key_bytes = static_cast<double>(c.batch) * c.context * 128 * elem;
  for (OpKind op : {OpKind::score_blocks, OpKind::select_topk_blocks, OpKind::index_topk}) {
    const int64_t plan_requests = c.decode ? std::max(c.batch, c.plan_requests) : c.batch;
    const PlanRequest request{op, Backend::cuda, config,
                              Capacities{plan_requests, std::max(tokens, plan_requests), blocks},
                              c.dtype};
    Timing t;
    std::string implementation;
    M3SA_RETURN_IF_ERROR(time_planned(
        request, stream, calls, c.decode ? 20 : 5,
        [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx, int i) {
          const TensorView cache = caches[i % sets].view(c.dtype, {pages, 128, 128});
          if (op == OpKind::score_blocks)
            return score_blocks(plan, {q, cache, batch, scores}, ws, ctx);
          if (op == OpKind::select_topk_blocks)
            return select_topk_blocks(plan, {scores, batch, topk}, ws, ctx);
          return index_topk(plan, {q, cache, batch, topk}, ws, ctx);
        },
        &t, &implementation));
    Record rec{c.name, to_string(op), t};
    rec.implementation = implementation;
    // The name stays the case's; the plan's size is part of what was timed.
    if (plan_requests > c.batch)
      rec.note = "planned for " + std::to_string(plan_requests) + " requests";
    if (op == OpKind::select_topk_blocks || c.decode) {
      rec.bytes = op == OpKind::select_topk_blocks
                      ? static_cast<double>(c.heads) * tokens * blocks * 4
                      : key_bytes;
      rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
      rec.ceiling = "copy";
    } else {
      const bool fp8 = c.dtype == DType::fp8_e4m3;
      const double gemm = fp8 ? ceilings.fp8_gemm_tflops : ceilings.bf16_gemm_tflops;
      rec.flops = flops;
      rec.fraction = gemm > 0 ? flops / (t.median_us * 1e6) / gemm : 0;
      rec.ceiling = fp8 ? "fp8 GEMM" : "bf16 GEMM";
    }
    records->push_back(rec);
    print_progress(rec, true);
  }
  return {};
}

// norm_rope_insert at MiniMax-M3 TP1 shapes (64 q heads, 4 KV heads, 4 index heads) for
// `tokens` tokens: bytes read (q, k, v, index q / k, positions, slots) plus bytes written (q out,
// K and V rows, index-Q, index-K rows), against the copy ceiling.
std::string norm_rope_case_name(int tokens, DType kv_dtype, DType index_dtype) {
  return std::string("norm_rope_insert T=") + std::to_string(tokens / 1024) + "K kv " +
         (kv_dtype == DType::bf16 ? "bf16" : "fp8") + " index " +
         (index_dtype == DType::bf16 ? "bf16" : "fp8");
}

Status run_norm_rope_case(int tokens, DType kv_dtype, DType index_dtype, cudaStream_t stream,
                          const Ceilings& ceilings, std::vector<Record>* records) {
  constexpr int kQHeads = 64, kKvHeads = 4, kIndexHeads = 4;
  const std::string name = norm_rope_case_name(tokens, kv_dtype, index_dtype);
  const int64_t T = tokens, pages = (T + 127) / 128;
  HostTensor host_positions(DType::i64, {T}), host_slots(DType::i64, {T});
  Rng rng(11);
  for (int64_t t = 0; t < T; ++t) {
    host_positions.data<int64_t>()[t] = static_cast<int64_t>(rng.uniform() * (1 << 20));
    host_slots.data<int64_t>()[t] = t; // distinct, every one written
  }
  const DeviceBuffer q(T * kQHeads * 256), k(T * kKvHeads * 256), v(T * kKvHeads * 256),
      iq(T * kIndexHeads * 256), ik(T * 256), weights(4 * 128 * 2), positions(host_positions),
      slots(host_slots), q_out(T * kQHeads * 256),
      k_cache(pages * 128 * kKvHeads * 128 * dtype_size(kv_dtype)),
      v_cache(pages * 128 * kKvHeads * 128 * dtype_size(kv_dtype)),
      iq_out(T * kIndexHeads * 128 * dtype_size(index_dtype)),
      ik_cache(pages * 128 * 128 * dtype_size(index_dtype));
  for (const DeviceBuffer* b : {&q, &k, &v, &iq, &ik, &weights})
    M3SA_RETURN_IF_ERROR(b->fill_random(DType::bf16, 7));
  for (const DeviceBuffer* b : {&positions, &slots, &q_out, &k_cache, &v_cache, &iq_out, &ik_cache})
    M3SA_RETURN_IF_ERROR(b->status());
  NormRopeInsertArgs a;
  a.q = q.view(DType::bf16, {T, kQHeads, 128});
  a.k = k.view(DType::bf16, {T, kKvHeads, 128});
  a.v = v.view(DType::bf16, {T, kKvHeads, 128});
  a.index_q = iq.view(DType::bf16, {T, kIndexHeads, 128});
  a.index_k = ik.view(DType::bf16, {T, 128});
  a.positions = positions.view();
  TensorView* gains[4] = {&a.q_norm_weight, &a.k_norm_weight, &a.index_q_norm_weight,
                          &a.index_k_norm_weight};
  for (int i = 0; i < 4; ++i) *gains[i] = weights.view(DType::bf16, {128}, i * 256);
  a.slot_mapping = a.index_slot_mapping = slots.view();
  a.q_out = q_out.view(DType::bf16, {T, kQHeads, 128});
  a.k_cache = k_cache.view(kv_dtype, {pages, 128, kKvHeads, 128});
  a.v_cache = v_cache.view(kv_dtype, {pages, 128, kKvHeads, 128});
  a.index_q_out = iq_out.view(index_dtype, {T, kIndexHeads, 128});
  a.index_k_cache = ik_cache.view(index_dtype, {pages, 128, 128});
  MsaConfig config;
  config.num_index_heads = kIndexHeads;
  const PlanRequest request{OpKind::norm_rope_insert, Backend::cuda, config, Capacities{1, T, 1},
                            index_dtype};
  Timing t;
  M3SA_RETURN_IF_ERROR(time_planned(
      request, stream, 1, 20,
      [&](const OpPlan& plan, Workspace ws, const ExecContext& ctx, int) {
        return norm_rope_insert(plan, a, ws, ctx);
      },
      &t));
  Record rec{name, "norm_rope_insert", t};
  const double rows_read = kQHeads + 2 * kKvHeads + kIndexHeads + 1;
  rec.bytes = static_cast<double>(T) *
              (rows_read * 256 + 16 + kQHeads * 256 + 2 * kKvHeads * 128 * dtype_size(kv_dtype) +
               (kIndexHeads + 1) * 128 * dtype_size(index_dtype));
  rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
  rec.ceiling = "copy";
  records->push_back(rec);
  print_progress(rec, false);
  return {};
}

} // namespace m3sa::cli::bench
