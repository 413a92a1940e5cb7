#include "demo.h"
#ifdef M3SA_HAVE_CUDA
#include "demo_cuda.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/simd.h"
#include "m3sa/m3sa.h"
#include "testing/compare.h"
#include "testing/norm_rope_batch.h"
#include "testing/run_ops.h"
#include "testing/sample_batch.h"
#include "testing/synthetic_batch.h"

namespace m3sa::cli {
namespace {

using testing::gather_tokens;
using testing::HostTensor;
using testing::make_sample;
using testing::PlannedOp;
using testing::SampleBatch;
using testing::SyntheticBatch;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void progress(const char* what) { std::fprintf(stderr, "[m3sa demo] %s\n", what); }

DType parse_dtype(const std::string& name) { return name == "fp8" ? DType::fp8_e4m3 : DType::bf16; }

// Runs `body` on a freshly planned op and reports its wall time in milliseconds.
template <typename Body> Status timed(const PlanRequest& request, double* elapsed_ms, Body&& body) {
  PlannedOp planned(request);
  if (!planned.status.ok()) return planned.status;
  const auto start = Clock::now();
  const Status status = body(planned.plan, planned.workspace());
  *elapsed_ms = ms_since(start);
  return status;
}

// Sizes inside the CLI's ranges can still exceed this machine's memory: a failed host allocation
// ends the demo with its message instead of a crash on the null data.
bool allocation_failed(const Status& status) {
  if (status.ok()) return false;
  std::fprintf(stderr, "m3sa demo: %s\n", status.message().c_str());
  return true;
}

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

} // namespace

int run_demo(const DemoOptions& o) {
  if (o.kv_heads != o.index_heads || o.q_heads % o.kv_heads != 0 ||
      o.q_heads / o.kv_heads > kMaxGqaGroup) {
    std::fprintf(stderr,
                 "m3sa demo: usage error: --index-heads (%d) must equal --kv-heads (%d), and "
                 "--q-heads (%d) must be a multiple of it with at most 16 per KV head\n",
                 o.index_heads, o.kv_heads, o.q_heads);
    return 2;
  }
  if (o.decode_requests > 0 && o.decode_context < o.mtp) {
    std::fprintf(stderr,
                 "m3sa demo: usage error: --decode-context (%d) must be at least --mtp (%d)\n",
                 o.decode_context, o.mtp);
    return 2;
  }
  if (o.decode_requests == 0 && o.prefill_chunk == 0) {
    std::fprintf(stderr, "m3sa demo: usage error: --decode-requests and --prefill-chunk are both "
                         "0: nothing to run\n");
    return 2;
  }
  MsaConfig config;
  config.top_k = o.top_k;
  config.num_index_heads = o.index_heads;
  const DType index_dtype = parse_dtype(o.index_dtype), kv_dtype = parse_dtype(o.kv_dtype);
  // Each stage runs on the requested backend, or with "auto" on the best one that supports it.
  Backend backend = Backend::cpu, indexer_backend = Backend::cpu;
  if (o.backend == "auto") {
    backend = best_available_backend(OpKind::sparse_attention, config, kv_dtype);
    indexer_backend = best_available_backend(OpKind::index_topk, config, index_dtype);
  } else {
    backend = o.backend == "cuda" ? Backend::cuda
                                  : (o.backend == "reference" ? Backend::reference : Backend::cpu);
    indexer_backend = backend;
  }
  for (auto [stage_backend, op, dtype] :
       {std::tuple{indexer_backend, OpKind::index_topk, index_dtype},
        std::tuple{indexer_backend, OpKind::norm_rope_insert, index_dtype},
        std::tuple{backend, OpKind::sparse_attention, kv_dtype}})
    if (const Status s = supports(stage_backend, op, config, dtype); !s.ok()) {
      std::fprintf(stderr, "m3sa demo: usage error: --backend %s: %s\n", o.backend.c_str(),
                   s.message().c_str());
      return 2;
    }
#ifndef M3SA_HAVE_CUDA
  indexer_backend = indexer_backend == Backend::cuda ? Backend::cpu : indexer_backend;
#endif

  testing::BatchSpec spec;
  for (int r = 0; r < o.decode_requests; ++r)
    spec.q_lens.push_back(o.mtp), spec.seq_lens.push_back(o.decode_context);
  if (o.prefill_chunk > 0)
    spec.q_lens.push_back(o.prefill_chunk),
        spec.seq_lens.push_back(o.prefill_prefix + o.prefill_chunk);
  spec.num_decode = o.decode_requests;
  spec.decode_q_len = o.mtp;
  spec.index_heads = o.index_heads;
  spec.index_dtype = index_dtype;
  spec.q_heads = o.q_heads;
  spec.kv_heads = o.kv_heads;
  spec.kv_dtype = kv_dtype;
  spec.seed = o.seed;

  progress("building the synthetic batch and caches");
  SyntheticBatch sb(spec);
  if (allocation_failed(sb.status())) return 1;
  sb.fill_index_random(o.seed);
  sb.fill_attention_random(o.seed + 1);
  const int64_t tokens = sb.num_tokens();
  // This step's tokens arrive as raw projections (q, k, v, index q, index k); norm_rope_insert
  // normalises and rotates them, writes q and index-Q, and puts k, v and index-K into the caches
  // at the tokens' slots (the caches already hold the earlier tokens).
  testing::NormRopeSpec step_spec;
  step_spec.tokens = static_cast<int>(tokens);
  step_spec.q_heads = o.q_heads, step_spec.kv_heads = o.kv_heads;
  step_spec.index_heads = o.index_heads;
  step_spec.kv_dtype = kv_dtype, step_spec.index_dtype = index_dtype;
  step_spec.kv_pages = step_spec.index_pages = 1; // its own outputs are unused
  step_spec.padding_every = 0;
  step_spec.seed = o.seed + 2;
  const testing::NormRopeBatch step(step_spec);
  if (allocation_failed(step.status())) return 1;
  for (int64_t t = 0; t < tokens; ++t) {
    const int r = sb.request_of(t);
    const int64_t p = sb.position(t), block = p / kBlockTokens, offset = p % kBlockTokens;
    step.positions.data<int64_t>()[t] = p;
    step.index_slot_mapping.data<int64_t>()[t] = int64_t{sb.page(r, block)} * kBlockTokens + offset;
    step.slot_mapping.data<int64_t>()[t] =
        int64_t{sb.kv_block_table.data<int32_t>()[r * sb.width() + block]} * kBlockTokens + offset;
  }
  NormRopeInsertArgs step_args = step.args();
  step_args.q_out = sb.q.view(), step_args.k_cache = sb.k_cache.view();
  step_args.v_cache = sb.v_cache.view(), step_args.index_q_out = sb.index_q.view();
  step_args.index_k_cache = sb.index_k_cache.view();

  testing::RunOptions run_options{backend, o.threads};
  const auto request_for = [&](OpKind op, const testing::RunOptions& ro) {
    return testing::plan_request(op, config, sb, ro);
  };
  double norm_rope_ms = 0, topk_ms = 0, attention_ms = 0;
  HostTensor topk(DType::i32, {o.index_heads, tokens, o.top_k});
  HostTensor out(DType::bf16, {tokens, o.q_heads, kHeadDim}), lse(DType::f32, {tokens, o.q_heads});
  if (allocation_failed(testing::check_allocated({&topk, &out, &lse}, "demo outputs"))) return 1;
  topk.fill_bytes(0x5a), out.fill_bytes(0xff), lse.fill_bytes(0xff); // poisoned
  Status status;
  // On a GPU the whole layer runs there, the attention reading the selections in device memory.
  const bool attention_on_gpu = indexer_backend == Backend::cuda && backend == Backend::cuda;
  if (indexer_backend == Backend::cuda) {
#ifdef M3SA_HAVE_CUDA
    progress(attention_on_gpu ? "norm_rope_insert + index_topk + sparse_attention on the GPU"
                              : "norm_rope_insert + index_topk on the GPU");
    const GpuAttention gpu_attention{&out, &lse, &attention_ms};
    status = run_layer_on_cuda(config, sb, step_args, topk, &norm_rope_ms, &topk_ms,
                               attention_on_gpu ? &gpu_attention : nullptr);
#endif
  } else {
    const testing::RunOptions indexer_options{indexer_backend, o.threads};
    progress("norm_rope_insert");
    status = timed(request_for(OpKind::norm_rope_insert, indexer_options), &norm_rope_ms,
                   [&](const OpPlan& plan, Workspace ws) {
                     return norm_rope_insert(plan, step_args, ws, {o.threads, nullptr});
                   });
    if (status.ok()) {
      progress("index_topk");
      status =
          timed(request_for(OpKind::index_topk, indexer_options), &topk_ms,
                [&](const OpPlan& plan, Workspace ws) {
                  return index_topk(
                      plan, {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()},
                      ws, {o.threads, nullptr});
                });
    }
  }
  if (status.ok() && !attention_on_gpu) {
    progress("sparse_attention");
    status =
        timed(request_for(OpKind::sparse_attention, run_options), &attention_ms,
              [&](const OpPlan& plan, Workspace ws) {
                return sparse_attention(plan, testing::attention_args(sb, topk, out, lse, true), ws,
                                        {o.threads, nullptr});
              });
  }
  if (!status.ok()) {
    std::fprintf(stderr, "m3sa demo: %s\n", status.to_string().c_str());
    std::printf("[FAIL] %s\n", status.to_string().c_str());
    return 1;
  }

  // Verification on sampled tokens: every decode token plus evenly spaced prefill tokens.
  progress("verifying sampled rows against the reference");
  std::vector<int64_t> sample;
  const int64_t decode_tokens = int64_t{o.decode_requests} * o.mtp;
  for (int64_t t = 0; t < decode_tokens; ++t) sample.push_back(t);
  const int64_t prefill_tokens = tokens - decode_tokens;
  const int64_t picks = std::min<int64_t>(o.sample_rows, prefill_tokens);
  for (int64_t i = 0; i < picks; ++i)
    sample.push_back(decode_tokens +
                     (picks == 1 ? prefill_tokens - 1 : i * (prefill_tokens - 1) / (picks - 1)));
  SampleBatch sampled = make_sample(sb, sample);
  const int64_t s_count = static_cast<int64_t>(sample.size());

  // norm_rope_insert: the reference on the sampled tokens into compact outputs (slot i for the
  // i-th sample), against what the pipeline wrote into the batch's tensors and caches.
  const testing::NormRopeCheck insert_check = testing::check_norm_rope_sample(
      config, step, sample, sb.q, sb.index_q, sb.k_cache, sb.v_cache, sb.index_k_cache);

  const testing::RunOptions reference_options{Backend::reference, 1};
  PlanRequest sample_request =
      testing::plan_request(OpKind::index_topk, config, sb, reference_options);
  sample_request.capacities = {s_count, s_count, sb.width()};
  HostTensor ref_topk(DType::i32, {o.index_heads, s_count, o.top_k}),
      ref_scores(DType::f32, {o.index_heads, s_count, sb.width()});
  HostTensor ref_out(DType::bf16, {s_count, o.q_heads, kHeadDim}),
      ref_lse(DType::f32, {s_count, o.q_heads});
  const HostTensor got_topk = gather_tokens(topk, sample, 1),
                   got_out = gather_tokens(out, sample, 0), got_lse = gather_tokens(lse, sample, 0);
  double ref_topk_ms = 0, ref_attention_ms = 0, unused_ms = 0;
  status = timed(sample_request, &ref_topk_ms, [&](const OpPlan& plan, Workspace ws) {
    return index_topk(
        plan, {sampled.index_q.view(), sb.index_k_cache.view(), sampled.batch(), ref_topk.view()},
        ws);
  });
  sample_request.op = OpKind::score_blocks;
  if (status.ok())
    status = timed(sample_request, &unused_ms, [&](const OpPlan& plan, Workspace ws) {
      return score_blocks(
          plan,
          {sampled.index_q.view(), sb.index_k_cache.view(), sampled.batch(), ref_scores.view()},
          ws);
    });
  sample_request.op = OpKind::sparse_attention;
  sample_request.cache_dtype = kv_dtype;
  if (status.ok())
    status = timed(sample_request, &ref_attention_ms, [&](const OpPlan& plan, Workspace ws) {
      SparseAttentionArgs args;
      args.q = sampled.q.view(), args.k_cache = sb.k_cache.view(), args.v_cache = sb.v_cache.view();
      args.topk = got_topk.view(), args.batch = sampled.batch(),
      args.kv_block_table = sampled.kv_block_table.view();
      args.out = ref_out.view(), args.lse = ref_lse.view();
      return sparse_attention(plan, args, ws);
    });
  if (!status.ok()) {
    std::printf("[FAIL] reference: %s\n", status.to_string().c_str());
    return 1;
  }
  const testing::TopkComparison topk_check =
      testing::compare_topk(ref_topk.view(), got_topk.view(), ref_scores.view());
  const testing::AttentionComparison attention_check =
      testing::compare_attention(ref_out.view(), got_out.view(), ref_lse.view(), got_lse.view());

  double full_reference_ms = -1;
  if (o.reference_full && backend != Backend::reference) {
    progress("timing the reference on the whole batch (--reference-full)");
    HostTensor full_topk, full_out, full_lse;
    const auto start = Clock::now();
    status = testing::run_index_topk(config, sb, reference_options, &full_topk);
    if (status.ok())
      status =
          testing::run_sparse_attention(config, sb, topk, reference_options, &full_out, &full_lse);
    full_reference_ms = ms_since(start);
    if (!status.ok())
      std::fprintf(stderr, "m3sa demo: reference: %s\n", status.to_string().c_str());
  }

  // Report.
  const bool insert_ok = insert_check.ok(), topk_ok = topk_check.ok(),
             attention_ok = backend == Backend::cuda
                                ? attention_check.ok(testing::kGpuAttentionRelativeL2,
                                                     testing::kGpuAttentionLse)
                                : attention_check.ok();
  const bool all_ok = insert_ok && topk_ok && attention_ok && status.ok();
  OpPlan cpu_plan; // only its resolved thread count is reported: no workspace is needed
  const int threads =
      make_plan(request_for(OpKind::sparse_attention, {Backend::cpu, o.threads}), &cpu_plan).ok()
          ? cpu_plan.num_threads
          : 1;
  std::printf("m3sa demo: one MiniMax-M3 sparse attention layer; indexer on %s, attention on %s",
              to_string(indexer_backend), to_string(backend));
  if (backend == Backend::cpu || indexer_backend == Backend::cpu)
    std::printf(" (CPU threads: %d, %s kernels)", threads, cpu::to_string(cpu::simd_level()));
  std::printf("\n");
  std::printf("  batch      %d decode requests x %d tokens (q_len %d) + prefill chunk %d after %d "
              "= %lld query tokens\n",
              o.decode_requests, o.decode_context, o.mtp, o.prefill_chunk, o.prefill_prefix,
              static_cast<long long>(tokens));
  std::printf(
      "  indexer    %d index heads, %s index cache (%d pages, %s), top-k %d, local %d, init %d\n",
      o.index_heads, to_string(index_dtype), sb.num_pages(), mib(sb.index_k_cache.bytes()).c_str(),
      config.top_k, config.local_blocks, config.init_blocks);
  std::printf("  attention  %d query / %d KV heads, %s KV cache (%s)\n", o.q_heads, o.kv_heads,
              to_string(kv_dtype), mib(sb.k_cache.bytes() + sb.v_cache.bytes()).c_str());
  // The implementation each stage ran on ("cuda.sparse_attention.sm90"): what make_plan picks for
  // the stage's request (no workspace needed), or the backend's name where it picks none.
  const auto implementation_of = [&](OpKind op, Backend stage_backend) -> std::string {
    OpPlan plan;
    return make_plan(request_for(op, {stage_backend, o.threads}), &plan).ok()
               ? std::string(implementation_name(plan))
               : std::string(to_string(stage_backend));
  };
  std::printf("\n  stage              time\n");
  std::printf("  norm_rope_insert %10.3f ms  (%s)\n  index_topk       %10.3f ms  (%s)\n  "
              "sparse_attention %10.3f ms  (%s)\n  total            %10.3f ms\n",
              norm_rope_ms, implementation_of(OpKind::norm_rope_insert, indexer_backend).c_str(),
              topk_ms, implementation_of(OpKind::index_topk, indexer_backend).c_str(), attention_ms,
              implementation_of(OpKind::sparse_attention, backend).c_str(),
              norm_rope_ms + topk_ms + attention_ms);
  std::printf(
      "\n  verification against the reference on %lld tokens (%lld decode, %lld prefill):\n",
      static_cast<long long>(s_count), static_cast<long long>(decode_tokens),
      static_cast<long long>(picks));
  std::printf("  norm_rope_insert %s %s\n", insert_check.to_string().c_str(),
              insert_ok ? "[OK]" : "[FAIL]");
  std::printf("  index_topk       %s %s\n", testing::describe(topk_check).c_str(),
              topk_ok ? "[OK]" : "[FAIL]");
  std::printf("  sparse_attention %s %s\n", testing::describe(attention_check).c_str(),
              attention_ok ? "[OK]" : "[FAIL]");
  const double per_token_ref = (ref_topk_ms + ref_attention_ms) / static_cast<double>(s_count);
  const double projected = per_token_ref * static_cast<double>(tokens);
  std::printf("\n  reference: %.1f ms for %lld sampled tokens -> %.1f s projected for the batch",
              ref_topk_ms + ref_attention_ms, static_cast<long long>(s_count), projected / 1e3);
  if (backend != Backend::reference)
    std::printf("; the %s/%s pipeline is %.1fx faster (projected)", to_string(indexer_backend),
                to_string(backend), projected / (topk_ms + attention_ms));
  std::printf("\n");
  if (full_reference_ms >= 0)
    std::printf("  reference on the whole batch: %.1f s (index_topk + sparse_attention); %.1fx "
                "slower than the %s/%s pipeline (measured)\n",
                full_reference_ms / 1e3, full_reference_ms / (topk_ms + attention_ms),
                to_string(indexer_backend), to_string(backend));
  std::printf("\n%s\n", all_ok ? "[OK]" : "[FAIL]");
  return all_ok ? 0 : 1;
}

} // namespace m3sa::cli
