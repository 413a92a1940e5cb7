// The context-parallel decode cases of `m3sa bench`: rank 0's share of the work on one GPU, and
// (with NCCL) the whole exchange across the visible GPUs.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "testing/host_tensor.h"

#ifdef M3SA_HAVE_NCCL
#include "testing/nccl_ranks.h"
#endif

namespace m3sa::cli::bench {
namespace {

using testing::HostTensor;

// B single-token decode requests of `context` tokens on the current device: lengths, a
// [B, width] block table and one bf16 query each; args() adds the cache and the output.
struct DecodeRequests {
  int batch;
  int64_t width;
  DeviceBuffer cu, seq, table, q;
  Status status;
  DecodeRequests(int b, int context, const HostTensor& host_table)
      : batch(b), width(host_table.view().shape[1]), cu(lengths(b + 1, [](int r) { return r; })),
        seq(lengths(b, [&](int) { return context; })), table(host_table), q(int64_t{b} * 256) {
    status = q.fill_random(DType::bf16, 29);
    for (const DeviceBuffer* d : {&cu, &seq, &table})
      if (status.ok()) status = d->status();
  }
  IndexTopkArgs args(const DeviceBuffer& cache, int64_t pages, const TensorView& topk) const {
    return {q.view(DType::bf16, {batch, 1, 128}),
            cache.view(DType::bf16, {pages, 128, 128}),
            {cu.view(), seq.view(), table.view(), batch, batch, 1, batch},
            topk};
  }

private:
  template <typename Value> static HostTensor lengths(int n, Value&& value) {
    HostTensor h(DType::i32, {n});
    for (int r = 0; r < n; ++r) h.data<int32_t>()[r] = value(r);
    return h;
  }
};

} // namespace

// Context-parallel decode at 1M tokens on ONE GPU: the work of rank 0 of R contiguous shards
// (score its 1/R of every request's blocks, then merge R candidate lists), timed alone. With
// the all-gather left out (it needs R GPUs), t(1) / (R * t(R)) is the scaling efficiency the
// kernels allow; the exchange (R x H x B x 15 keys of 8 bytes) adds NCCL latency on top.
// Timed as the decode cases are (decode_rotation_sets, decode_graph_calls, pages shuffled unless
// `pages_in_order`): a graph of back-to-back steps, each reading other pages of the cache, so
// that a rank's 34-67 MB shard does not start warm in the 50 MB L2 and one graph launch is not
// charged to one step. The scoring alone (score_shard) and the merge alone (merge_shard) are
// records too. Until session 30 a graph held one step, on in-order pages (2.7-7.5 us slower for
// 2-4 ranks at batch 1, bench/NOTES.md s30 r2): the one-step time stays in the note, and is what
// the NCCL cases compare with.
Status run_context_parallel_cases(int batch, bool pages_in_order, cudaStream_t stream,
                                  const Ceilings& ceilings, std::vector<Record>* records,
                                  double* single_gpu_us) {
  constexpr int kContext = 1 << 20, kBlocks = kContext / 128;
  const int64_t pages = int64_t{batch} * kBlocks;
  const DeviceBuffer cache(static_cast<size_t>(pages) * 128 * 128 * 2);
  M3SA_RETURN_IF_ERROR(cache.fill_random(DType::bf16, 21));
  MsaConfig config;
  config.num_index_heads = 1;
  const PlanRequest request{OpKind::index_topk, Backend::cuda, config,
                            Capacities{batch, batch, kBlocks}, DType::bf16};
  const std::vector<int32_t> pool = page_order(pages, pages_in_order);
  double one_rank_us = 0; // rank 0 of 1, as t is timed
  for (int ranks : {1, 2, 4, 8}) {
    ContextParallelPlan plan;
    M3SA_RETURN_IF_ERROR(
        make_context_parallel_plan(request, {0, ranks, ShardMode::contiguous}, &plan));
    const int64_t span = shard_local_blocks(request.capacities, plan.shard, kBlocks);
    const double shard_bytes = static_cast<double>(batch) * span * 128 * 128 * 2;
    // Set i reads the i-th batch x span pages of the (shuffled or ordered) pool: sets <= ranks,
    // so no two sets share a page (the shard map, not the pages, gives the positions).
    const int sets = std::min(ranks, decode_rotation_sets(static_cast<size_t>(shard_bytes)));
    std::deque<DecodeRequests> requests; // DeviceBuffers stay where they were made
    for (int i = 0; i < sets; ++i) {
      HostTensor host_table(DType::i32, {batch, span});
      for (int64_t e = 0; e < batch * span; ++e)
        host_table.data<int32_t>()[e] = pool[i * batch * span + e];
      requests.emplace_back(batch, kContext, host_table);
      M3SA_RETURN_IF_ERROR(requests.back().status);
    }
    const DeviceBuffer ws(plan.workspace_bytes), topk(int64_t{batch} * 16 * 4),
        gathered(plan.candidate_bytes * ranks);
    for (const DeviceBuffer* d : {&ws, &topk, &gathered}) M3SA_RETURN_IF_ERROR(d->status());
    const TensorView all = gathered.view(DType::i64, {ranks, 1, batch, plan.ranked_slots});
    const TensorView mine = gathered.view(DType::i64, {1, batch, plan.ranked_slots});
    const TensorView out = topk.view(DType::i32, {1, batch, 16});
    const ExecContext ctx{0, stream};
    M3SA_RETURN_IF_ERROR(prepare_context_parallel_workspace(plan, ws.workspace(), ctx));
    // Step i: the scoring (its candidates into `mine`), the merge, or both.
    const auto step = [&](int i, bool score, bool merge) {
      const IndexTopkArgs args = requests[i % sets].args(cache, pages, {});
      Status s;
      if (score) s = score_shard_candidates(plan, args, mine, ws.workspace(), ctx);
      if (s.ok() && merge) s = merge_shard_candidates(plan, all, args.batch, out, ctx);
      return s;
    };
    const int calls = decode_graph_calls(sets);
    Timing t, scoring, merging, alone;
    M3SA_RETURN_IF_ERROR(time_graph(
        stream, calls, 20, [&](int i) { return step(i, true, true); }, &t));
    M3SA_RETURN_IF_ERROR(time_graph(
        stream, calls, 20, [&](int i) { return step(i, true, false); }, &scoring));
    M3SA_RETURN_IF_ERROR(time_graph(
        stream, calls, 20, [&](int i) { return step(i, false, true); }, &merging));
    M3SA_RETURN_IF_ERROR(time_graph(
        stream, 1, 20, [&](int i) { return step(i, true, true); }, &alone));
    if (ranks == 1) {
      one_rank_us = t.median_us;
      *single_gpu_us = alone.median_us;
    }
    const std::string name = "context parallel B=" + std::to_string(batch) +
                             " S=1M H=1 bf16, rank 0 of " + std::to_string(ranks);
    Record score_rec{name, "score_shard", scoring};
    score_rec.bytes = shard_bytes;
    score_rec.fraction = shard_bytes / (scoring.median_us * 1e3) / ceilings.copy_gbps;
    score_rec.ceiling = "copy";
    records->push_back(score_rec);
    print_progress(score_rec, true);
    records->push_back(Record{name, "merge_shard", merging});
    print_progress(records->back(), true);
    Record rec{name, "score_shard+merge", t};
    rec.bytes = shard_bytes;
    rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
    rec.ceiling = "copy";
    char note[160];
    std::snprintf(note, sizeof note,
                  "projected scaling efficiency without the all-gather %.0f%%; one step a "
                  "graph: %.1f us",
                  100 * one_rank_us / (ranks * t.median_us), alone.median_us);
    rec.note = note;
    records->push_back(rec);
    print_progress(rec, true);
  }
  return {};
}

#ifdef M3SA_HAVE_NCCL
// Context-parallel decode at 1M tokens across 2, 4 and 8 GPUs (as many as are visible) through
// NCCL: each rank holds only its round-robin shard of each request's index cache and runs
// context_parallel_index_topk (score, all-gather, merge) on its own stream, (a) as eager steps
// timed with events and (b) captured in a CUDA graph per rank (thread-local capture: the ranks
// capture at the same time) and replayed - how a decode step runs in an engine. Rank 0's median
// against one GPU running the whole batch in a graph (score + merge, no exchange).
Status run_context_parallel_nccl(int batch, int ranks, double single_gpu_us,
                                 const Ceilings& ceilings, std::vector<Record>* records) {
  const cuda::NcclLibrary& nccl = cuda::nccl_library();
  if (!nccl.loaded()) {
    std::fprintf(stderr, "m3sa bench: %s: multi-GPU cases skipped\n", nccl.error.c_str());
    return {};
  }
  constexpr int kContext = 1 << 20, kBlocks = kContext / 128;
  MsaConfig config;
  config.num_index_heads = 1;
  const PlanRequest request{OpKind::index_topk, Backend::cuda, config,
                            Capacities{batch, batch, kBlocks}, DType::bf16};
  std::vector<Timing> eager(ranks), graph(ranks);
  const std::vector<Status> results =
      testing::run_on_ranks(ranks, [&](int rank, ncclComm_t comm) -> Status {
        ContextParallelPlan plan;
        M3SA_RETURN_IF_ERROR(
            make_context_parallel_plan(request, {rank, ranks, ShardMode::round_robin}, &plan));
        const int64_t span = shard_local_blocks(request.capacities, plan.shard, kBlocks);
        const int64_t pages = batch * span;
        const DeviceBuffer cache(static_cast<size_t>(pages) * 128 * 128 * 2),
            topk(int64_t{batch} * 64), ws(plan.workspace_bytes);
        HostTensor host_table(DType::i32, {batch, span}); // the rank's pages, in order
        for (int64_t i = 0; i < pages; ++i) host_table.data<int32_t>()[i] = static_cast<int32_t>(i);
        const DecodeRequests requests(batch, kContext, host_table);
        M3SA_RETURN_IF_ERROR(requests.status);
        M3SA_RETURN_IF_ERROR(cache.fill_random(DType::bf16, 30 + rank));
        for (const DeviceBuffer* d : {&topk, &ws}) M3SA_RETURN_IF_ERROR(d->status());
        const IndexTopkArgs args =
            requests.args(cache, pages, topk.view(DType::i32, {1, batch, 16}));
        cudaStream_t stream;
        M3SA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const ExecContext ctx{0, stream};
        const auto step = [&] {
          return context_parallel_index_topk(plan, args, comm, ws.workspace(), ctx);
        };
        Status s = prepare_context_parallel_workspace(plan, ws.workspace(), ctx);
        if (s.ok()) s = time_eager(stream, step, &eager[rank].median_us);
        if (s.ok())
          s = time_graph(
              stream, 1, 20, [&](int) { return step(); }, &graph[rank],
              cudaStreamCaptureModeThreadLocal);
        cudaStreamDestroy(stream);
        return s;
      });
  for (int rank = 0; rank < ranks; ++rank)
    if (!results[rank].ok())
      return {results[rank].code(), "rank " + std::to_string(rank) + " of " +
                                        std::to_string(ranks) + ": " + results[rank].message()};
  for (const bool replayed : {true, false}) {
    const Timing& t = replayed ? graph[0] : eager[0];
    Record rec("context parallel NCCL B=" + std::to_string(batch) + " S=1M H=1 bf16, " +
                   std::to_string(ranks) + " GPUs" + (replayed ? "" : " eager"),
               "context_parallel_index_topk", t);
    rec.bytes = static_cast<double>(batch) * kContext * 128 * 2 / ranks; // per rank
    rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
    rec.ceiling = "copy";
    char note[160];
    std::snprintf(note, sizeof note,
                  "%s, round robin; scaling efficiency vs one GPU (%.1f us, graph) %.0f%%",
                  replayed ? "graph-replayed steps" : "eager steps", single_gpu_us,
                  100 * single_gpu_us / (ranks * t.median_us));
    rec.note = note;
    records->push_back(rec);
    print_progress(rec, false);
  }
  return {};
}
#endif

} // namespace m3sa::cli::bench
