// Sparse attention cases of `m3sa bench` at MiniMax-M3 shapes (64/4 at TP1, 16/1 per TP4 rank),
// top_k 16, with selections made by index_topk on random index data, as an engine makes them.
// Decode: B single-token requests of S tokens replayed from a graph, rotating over block tables
// that draw pages at random from a pool larger than L2 (cold L2, like the peer's rotations).
// Prefill: one 8K chunk at the end of S. The KV cache is laid out as vLLM keeps it, [pages, Hkv,
// 128, 2 x 128] (K and V of a token side by side), and passed as two strided views, as an engine
// would. Bytes: K and V of every token's selected keys (what a token-major kernel reads); prefill
// FLOPs: 4 x 128 per (query head, key).
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

std::vector<AttentionCase> attention_cases(const std::string& set) {
  std::vector<AttentionCase> all;
  const auto suffix = [](int s, int hq, int hkv) {
    return " S=" + std::to_string(s / 1024) + "K Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv);
  };
  for (DType d : {DType::bf16, DType::fp8_e4m3}) {
    const std::string dn = d == DType::bf16 ? "bf16" : "fp8";
    for (auto [hq, hkv] : {std::pair{64, 4}, std::pair{16, 1}})
      for (int s : {8192, 32768, 131072}) {
        if (set == "full" || d == DType::bf16 || s == 131072)
          all.push_back({"attention prefill " + dn + " C=8K" + suffix(s, hq, hkv), false, 1, s,
                         8192, hq, hkv, d});
        for (int b : {1, 32, 128})
          if (set == "full" || (b != 32 && s != 8192))
            all.push_back(
                {"attention decode " + dn + " B=" + std::to_string(b) + suffix(s, hq, hkv), true, b,
                 s, 1, hq, hkv, d});
      }
    // Structured selections at both head configs: issue 11's 3x holds for each, and 16/1 (one
    // pass of 1,024 tiles) weighs a pass's fixed cost and the tiles' tail more than 64/4.
    if (set == "full" || d == DType::bf16)
      for (auto [hq, hkv] : {std::pair{64, 4}, std::pair{16, 1}})
        all.push_back({"attention prefill " + dn + " structured C=8K" + suffix(131072, hq, hkv),
                       false, 1, 131072, 8192, hq, hkv, d, true});
  }
  return all;
}

namespace {

// Index-q for the structured case: one random vector per (query block of 128 tokens, head), each
// token's a 2% perturbation of its block's, so neighbouring tokens rank the blocks nearly alike.
HostTensor block_shared_index_q(int64_t tokens, int heads) {
  HostTensor q(DType::bf16, {tokens, heads, 128});
  Rng rng(46);
  std::vector<float> base(static_cast<size_t>(heads) * 128);
  for (int64_t t = 0; t < tokens; ++t) {
    if (t % 128 == 0)
      for (float& v : base) v = static_cast<float>(rng.uniform() * 4 - 2);
    for (int64_t i = 0; i < int64_t{heads} * 128; ++i)
      testing::store(DType::bf16, q.view().data, t * heads * 128 + i,
                     base[i] + static_cast<float>(rng.uniform() * 0.08 - 0.04));
  }
  return q;
}

// Mean, over query blocks of 128 tokens and heads, of the distinct blocks their selections hold.
double mean_block_union(const HostTensor& topk, int64_t tokens, int heads, int k) {
  double total = 0;
  int64_t groups = 0;
  for (int h = 0; h < heads; ++h)
    for (int64_t t0 = 0; t0 < tokens; t0 += 128, ++groups) {
      std::vector<int32_t> ids;
      for (int64_t t = t0; t < std::min(tokens, t0 + 128); ++t)
        for (int s = 0; s < k; ++s) ids.push_back(topk.data<int32_t>()[(h * tokens + t) * k + s]);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      total += static_cast<double>(
          std::count_if(ids.begin(), ids.end(), [](int32_t b) { return b >= 0; }));
    }
  return groups ? total / groups : 0;
}

} // namespace

Status run_attention_case(const AttentionCase& c, cudaStream_t stream, const Ceilings& ceilings,
                          std::vector<Record>* records) {
  constexpr int kTopK = 16;
  const int blocks = (c.context + 127) / 128;
  const int64_t tokens = c.decode ? c.batch : c.chunk;
  const size_t elem = dtype_size(c.kv_dtype);
  double keys = 0; // visible selected keys over all tokens (per KV head)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = c.decode ? c.context - 1 : c.context - c.chunk + t;
    keys += (std::min<int64_t>(kTopK, p / 128 + 1) - 1) * 128.0 + p % 128 + 1;
  }
  const double kv_bytes = keys * c.kv_heads * 2 * 128 * elem;
  const double flops = keys * c.q_heads * 4 * 128;
  // Decode rotates over block tables as the peer does (bench_timing.h); pages come from one pool
  // per case, of at most c.kv_pool_bytes of K and V (and at least one request's blocks).
  const int sets = c.decode ? decode_rotation_sets(static_cast<size_t>(kv_bytes)) : 1;
  const int calls = c.decode ? decode_graph_calls(sets) : 1; // a timed graph's calls
  const int64_t page_bytes = int64_t{128} * c.kv_heads * 128 * static_cast<int64_t>(elem);
  const int64_t pool =
      c.decode ? std::min<int64_t>(int64_t{c.batch} * blocks * sets,
                                   std::max<int64_t>(blocks, c.kv_pool_bytes / (2 * page_bytes)))
               : blocks;
  const DeviceBuffer kv_cache(2 * pool * page_bytes), index_cache(pool * 128 * 128 * 2),
      q(tokens * c.q_heads * 128 * 2), index_q(tokens * c.kv_heads * 128 * 2),
      out(tokens * c.q_heads * 128 * 2);
  M3SA_RETURN_IF_ERROR(kv_cache.fill_random(c.kv_dtype, 41));
  // K (half 0) or V (half 1) of the combined cache as [pages, 128, Hkv, 128].
  const auto kv_view = [&](int half) {
    TensorView v = kv_cache.view(c.kv_dtype, {pool, 128, c.kv_heads, 128});
    v.strides[0] = int64_t{c.kv_heads} * 128 * 256, v.strides[1] = 256;
    v.strides[2] = 128 * 256, v.strides[3] = 1;
    v.data = static_cast<char*>(v.data) + half * 128 * elem;
    return v;
  };
  M3SA_RETURN_IF_ERROR(index_cache.fill_random(DType::bf16, 43));
  M3SA_RETURN_IF_ERROR(q.fill_random(DType::bf16, 44));
  M3SA_RETURN_IF_ERROR(c.structured ? index_q.upload(block_shared_index_q(tokens, c.kv_heads))
                                    : index_q.fill_random(DType::bf16, 45));
  HostTensor host_cu(DType::i32, {c.batch + 1}), host_seq(DType::i32, {c.batch});
  for (int r = 0; r <= c.batch; ++r) host_cu.data<int32_t>()[r] = c.decode ? r : (r ? c.chunk : 0);
  for (int r = 0; r < c.batch; ++r) host_seq.data<int32_t>()[r] = c.context;
  const DeviceBuffer cu(host_cu), seq(host_seq);
  M3SA_RETURN_IF_ERROR(cu.status());
  M3SA_RETURN_IF_ERROR(seq.status());
  MsaConfig config;
  config.num_index_heads = c.kv_heads;
  config.top_k = kTopK;
  const Capacities capacities{c.batch, tokens, blocks};
  const ExecContext ctx{0, stream};
  OpPlan index_plan;
  M3SA_RETURN_IF_ERROR(
      make_plan({OpKind::index_topk, Backend::cuda, config, capacities, DType::bf16}, &index_plan));
  const DeviceBuffer index_ws = testing::device_workspace(index_plan, true, ctx);
  M3SA_RETURN_IF_ERROR(index_ws.status());
  // Per set: a block table (random pool pages for decode) and the selections index_topk makes.
  std::vector<DeviceBuffer> tables, selections;
  Rng rng(17);
  const auto batch_of = [&](int set) {
    return BatchMetadata{cu.view(),
                         seq.view(),
                         tables[set].view(),
                         c.batch,
                         c.decode ? c.batch : 0,
                         1,
                         static_cast<int>(tokens)};
  };
  for (int set = 0; set < sets; ++set) {
    HostTensor table(DType::i32, {c.batch, blocks});
    for (int64_t i = 0; i < int64_t{c.batch} * blocks; ++i)
      table.data<int32_t>()[i] =
          c.decode ? rng.uniform_int(0, static_cast<int>(pool - 1)) : static_cast<int32_t>(i);
    tables.emplace_back(table);
    selections.emplace_back(DType::i32, std::initializer_list<int64_t>{c.kv_heads, tokens, kTopK},
                            uint8_t{0xff});
    M3SA_RETURN_IF_ERROR(tables.back().status());
    M3SA_RETURN_IF_ERROR(selections.back().status());
    M3SA_RETURN_IF_ERROR(index_topk(index_plan,
                                    {index_q.view(DType::bf16, {tokens, c.kv_heads, 128}),
                                     index_cache.view(DType::bf16, {pool, 128, 128}), batch_of(set),
                                     selections.back().view()},
                                    index_ws.workspace(), ctx));
  }
  Timing t;
  OpPlan plan;
  M3SA_RETURN_IF_ERROR(
      make_plan({OpKind::sparse_attention, Backend::cuda, config, capacities, c.kv_dtype}, &plan));
  const DeviceBuffer ws = testing::device_workspace(plan, true, ctx);
  M3SA_RETURN_IF_ERROR(ws.status());
  M3SA_RETURN_IF_ERROR(time_graph(
      stream, calls, c.decode ? 20 : 5,
      [&](int i) {
        SparseAttentionArgs a;
        a.q = q.view(DType::bf16, {tokens, c.q_heads, 128});
        a.k_cache = kv_view(0);
        a.v_cache = kv_view(1);
        a.topk = selections[i % sets].view();
        a.batch = batch_of(i % sets);
        a.out = out.view(DType::bf16, {tokens, c.q_heads, 128});
        return sparse_attention(plan, a, ws.workspace(), ctx);
      },
      &t));
  int32_t flags = 0;
  M3SA_RETURN_IF_ERROR(read_device_errors(plan, ws.workspace(), ctx, &flags));
  if (flags != 0)
    return Status(StatusCode::internal, "device error flags " + std::to_string(flags));
  Record rec{c.name, to_string(OpKind::sparse_attention), t};
  rec.implementation = implementation_name(plan);
  rec.bytes = kv_bytes, rec.flops = flops;
  if (c.decode) {
    rec.fraction = kv_bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
    rec.ceiling = "copy";
    rec.note = "K|V page pool " +
               std::to_string(2.0 * pool * page_bytes / double{1 << 30}).substr(0, 5) + " GiB";
  } else {
    rec.fraction =
        ceilings.bf16_gemm_tflops > 0 ? flops / (t.median_us * 1e6) / ceilings.bf16_gemm_tflops : 0;
    rec.ceiling = "bf16 GEMM";
    rec.note = "GB/s: K and V of every token's selected keys";
    if (c.structured) {
      const HostTensor topk = selections[0].download();
      rec.note += "; a query block's selections hold " +
                  std::to_string(mean_block_union(topk, tokens, c.kv_heads, kTopK)).substr(0, 5) +
                  " distinct blocks on average (top_k 16)";
    }
  }
  records->push_back(rec);
  print_progress(rec, false);
  return {};
}

} // namespace m3sa::cli::bench
