#pragma once
// `m3sa bench` timing (CUDA): one CUDA graph of back-to-back launches replayed and timed with
// events, eager steps timed one at a time, and the cold-L2 rotation of data sets. Every CUDA call
// is checked (cuda/cuda_status.h) and a failure comes back as a Status naming the call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "bench.h"
#include "cuda/cuda_status.h"
#include "m3sa/m3sa.h"
#include "testing/device_buffer.h"

namespace m3sa::cli::bench {

using testing::DeviceBuffer;

// How many copies of a `bytes` data set a timed graph rotates over (its launch i reads copy
// i % sets): enough to pass 240 MiB, about twice the L2, so each launch starts from a cold L2
// as a layer of a real model does; 1 to 16.
inline int cold_l2_sets(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{240} << 20) / bytes + 1, 1, 16));
}

// Decode cases, as the peer (../shared/peer/peer_bench.py: rotations, bench_graph) times them, so
// that the side-by-side compares the same method: data sets to touch 256 MiB (1 to 128), and a
// graph of max(sets, 16) calls, at most 128. With cold_l2_sets' 16 copies a batch-1 case touched
// 16-32 MB (inside the 50 MB L2) and spread the graph's launch over 16 calls, against the peer's
// 128 calls over 128-256 MB.
inline int decode_rotation_sets(size_t bytes) {
  const size_t target = size_t{256} << 20;
  return static_cast<int>(
      std::clamp<size_t>((target + bytes - 1) / std::max<size_t>(bytes, 1), 1, 128));
}
inline int decode_graph_calls(int sets) { return std::min(128, std::max(sets, 16)); }

// Median and CV over `samples` timings of one graph that runs `launches` back-to-back calls
// `enqueue(i)` (each a Status; rotating over data sets larger than L2 when the caller built them
// so), per call; three warm-up replays first.
template <typename Enqueue>
Status time_graph(cudaStream_t stream, int launches, int samples, Enqueue&& enqueue, Timing* out,
                  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3SA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, mode));
  Status s;
  for (int i = 0; i < launches && s.ok(); ++i) s = enqueue(i);
  M3SA_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
  M3SA_RETURN_IF_ERROR(s);
  M3SA_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) M3SA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream)); // warm-up
  std::vector<double> us;
  for (int i = 0; i < samples; ++i) {
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    M3SA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1e3 * ms / launches);
  }
  *out = summarize(us);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return {};
}

// Plans `request`, gives the plan a prepared device workspace and times
// `run(plan, workspace, ctx)` with time_graph (`launches` calls, `run(..., i)` for the i-th);
// `implementation` (if given) receives the name of the implementation the plan picked.
template <typename Run>
Status time_planned(const PlanRequest& request, cudaStream_t stream, int launches, int samples,
                    Run&& run, Timing* out, std::string* implementation = nullptr) {
  OpPlan plan;
  M3SA_RETURN_IF_ERROR(make_plan(request, &plan));
  if (implementation != nullptr) *implementation = implementation_name(plan);
  const ExecContext ctx{0, stream};
  const DeviceBuffer ws = testing::device_workspace(plan, true, ctx);
  M3SA_RETURN_IF_ERROR(ws.status());
  return time_graph(
      stream, launches, samples, [&](int i) { return run(plan, ws.workspace(), ctx, i); }, out);
}

// Median over 20 eager calls of `step()` (a Status), each timed alone with events on `stream`,
// after three untimed warm-ups.
template <typename Step> Status time_eager(cudaStream_t stream, Step&& step, double* median_us) {
  cudaEvent_t start, stop;
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  M3SA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < 23; ++i) {
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    M3SA_RETURN_IF_ERROR(step());
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    M3SA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) us.push_back(1e3 * ms); // three warm-ups
  }
  *median_us = summarize(us).median_us;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return {};
}

// bench_ceilings.cpp: device-to-device copy of 2 GiB (GB/s, read + write); cuBLAS bf16 and
// cuBLASLt e4m3 GEMMs 8192^3 (TFLOP/s; unsupported where the library is absent).
Status measure_copy(cudaStream_t stream, double* gbps);
Status measure_bf16_gemm(cudaStream_t stream, double* tflops);
Status measure_fp8_gemm(cudaStream_t stream, double* tflops);

// bench_cases.cpp: the indexer cases (decode / prefill, bf16 / fp8) of a set ("full" or
// "quick"), each timing score_blocks, select_topk_blocks and index_topk; and norm_rope_insert.
struct Case {
  std::string name;
  bool decode;
  int batch;   // decode requests (prefill: 1)
  int context; // tokens cached per request, this step's included
  int chunk;   // prefill query tokens (decode: 1)
  int heads;
  DType dtype;
  bool pages_in_order = false; // the block table's pages in order, not shuffled
  int plan_requests = 0;       // > batch: the plans' max_requests (BenchOptions::plan_requests)
};
std::vector<Case> cases(const std::string& set);
// Page ids 0 .. pages - 1 in order, or shuffled (a fixed seed: every run reads the same layout).
std::vector<int32_t> page_order(int64_t pages, bool in_order);
Status run_case(const Case& c, cudaStream_t stream, const Ceilings& ceilings,
                std::vector<Record>* records);
std::string norm_rope_case_name(int tokens, DType kv_dtype, DType index_dtype);
Status run_norm_rope_case(int tokens, DType kv_dtype, DType index_dtype, cudaStream_t stream,
                          const Ceilings& ceilings, std::vector<Record>* records);

// bench_attention.cpp: sparse_attention at M3 shapes (64/4 and 16/1), selections from index_topk
// on random index data; names "attention prefill <dtype> C=8K S=.. Hq=.. Hkv=.." and
// "attention decode <dtype> B=.. S=.. Hq=.. Hkv=..", as ../shared/peer/side_by_side.py reads them.
// "attention prefill <dtype> structured ...": the tokens of a query block share nearly the same
// index-q, so their selections overlap (the note reports by how much); the peer has no such case.
struct AttentionCase {
  std::string name;
  bool decode;
  int batch, context, chunk, q_heads, kv_heads;
  DType kv_dtype;
  bool structured = false;
  int64_t kv_pool_bytes = int64_t{8} << 30; // decode: cap of the K|V page pool the tables draw from
};
std::vector<AttentionCase> attention_cases(const std::string& set);
Status run_attention_case(const AttentionCase& c, cudaStream_t stream, const Ceilings& ceilings,
                          std::vector<Record>* records);

// bench_context_parallel.cpp: decode at 1M tokens sharded over R ranks, rank 0's work on one
// GPU (R = 1, 2, 4, 8; `single_gpu_us` is R = 1) and, with NCCL, across `ranks` GPUs.
Status run_context_parallel_cases(int batch, bool pages_in_order, cudaStream_t stream,
                                  const Ceilings& ceilings, std::vector<Record>* records,
                                  double* single_gpu_us);
#ifdef M3SA_HAVE_NCCL
Status run_context_parallel_nccl(int batch, int ranks, double single_gpu_us,
                                 const Ceilings& ceilings, std::vector<Record>* records);
#endif

} // namespace m3sa::cli::bench
