#include "bench.h"

#include <cstdio>

#ifndef M3SA_HAVE_CUDA
namespace m3sa::cli {
int run_bench(const BenchOptions&) {
  std::fprintf(stderr,
               "m3sa bench: this build has no CUDA backend (configure with nvcc on PATH)\n");
  return 2;
}
} // namespace m3sa::cli
#else
#ifdef M3SA_BENCH_NCCL
#include <nccl.h>

#include <thread>
#endif
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "m3sa/m3sa.h"
#include "testing/host_tensor.h"

namespace m3sa::cli {
namespace {

using testing::HostTensor;
using testing::Rng;

#define BENCH_CHECK(expr)                                                                          \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "m3sa bench: %s: %s\n", #expr, cudaGetErrorString(e_));                 \
      return false;                                                                                \
    }                                                                                              \
  } while (0)

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n ? n : 16) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Fills a device buffer with random bytes that decode to finite bf16 / e4m3 values in [-2, 2):
// a 16 MiB random block, repeated.
bool fill_random(DeviceBuffer& buffer, DType dtype, uint64_t seed) {
  const size_t block = std::min<size_t>(buffer.bytes, 16u << 20);
  HostTensor host(DType::i32, {static_cast<int64_t>((block + 3) / 4)});
  Rng rng(seed);
  const int64_t elems = static_cast<int64_t>(block / dtype_size(dtype));
  for (int64_t i = 0; i < elems; ++i)
    testing::store(dtype, host.view().data, i, static_cast<float>(rng.uniform() * 4 - 2));
  for (size_t off = 0; off < buffer.bytes; off += block)
    BENCH_CHECK(cudaMemcpy(static_cast<char*>(buffer.ptr) + off, host.view().data,
                           std::min(block, buffer.bytes - off), cudaMemcpyHostToDevice));
  return true;
}

struct Timing {
  double median_us = 0, cv = 0;
};

// Median and CV over `samples` timings of one graph that runs `launches` back-to-back calls
// (rotating over data sets larger than L2 when the caller built them so), per call.
template <typename Enqueue>
bool time_graph(cudaStream_t stream, int launches, int samples, Enqueue&& enqueue, Timing* out,
                cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, mode));
  bool ok = true;
  for (int i = 0; i < launches && ok; ++i) ok = enqueue(i);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  if (!ok) return false;
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream)); // warm-up
  std::vector<double> us;
  for (int s = 0; s < samples; ++s) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(cudaGraphLaunch(exec, stream));
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1e3 * ms / launches);
  }
  std::sort(us.begin(), us.end());
  double mean = 0, var = 0;
  for (double v : us) mean += v / us.size();
  for (double v : us) var += (v - mean) * (v - mean) / us.size();
  out->median_us = us[us.size() / 2];
  out->cv = mean > 0 ? std::sqrt(var) / mean : 0;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return true;
}

// Ceiling 1: device-to-device copy of 2 GiB, bytes read + written, timed with events on the stream
// (a memcpy node inside a graph runs on the copy engines and reads about a third lower).
bool measure_copy(cudaStream_t stream, double* gbps) {
  const size_t bytes = size_t{1} << 31;
  DeviceBuffer a(bytes), b(bytes);
  if (!a.ptr || !b.ptr) return false;
  BENCH_CHECK(cudaMemset(a.ptr, 1, bytes));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < 23; ++i) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) us.push_back(1e3 * ms); // three warm-ups
  }
  std::sort(us.begin(), us.end());
  *gbps = 2.0 * bytes / (us[us.size() / 2] * 1e3);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return true;
}

// Symbols of a library opened at run time, typed by the toolkit's own declarations, so the binary
// needs no cuBLAS to start and the ceilings are simply absent where the library is.
template <typename Fn> Fn* symbol(void* lib, const char* name) {
  return lib ? reinterpret_cast<Fn*>(dlsym(lib, name)) : nullptr;
}
void* open_library(const char* versioned, const char* plain) {
  void* lib = dlopen(versioned, RTLD_NOW);
  return lib ? lib : dlopen(plain, RTLD_NOW);
}

constexpr int kGemmSize = 8192;

// Ceiling 2: cuBLAS bf16 GEMM 8192^3, fp32 accumulate.
bool measure_bf16_gemm(cudaStream_t stream, double* tflops) {
  *tflops = 0;
  void* lib = open_library("libcublas.so.13", "libcublas.so");
  auto create = symbol<decltype(cublasCreate_v2)>(lib, "cublasCreate_v2");
  auto destroy = symbol<decltype(cublasDestroy_v2)>(lib, "cublasDestroy_v2");
  auto set_stream = symbol<decltype(cublasSetStream_v2)>(lib, "cublasSetStream_v2");
  // Spelled out: C++ sees cublasGemmEx overloaded (compute type as cublasComputeType_t or int).
  using GemmEx =
      cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                     const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                     const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  auto gemm = symbol<GemmEx>(lib, "cublasGemmEx");
  if (!create || !destroy || !set_stream || !gemm) return false;
  cublasHandle_t handle = nullptr;
  if (create(&handle) != CUBLAS_STATUS_SUCCESS) return false;
  set_stream(handle, stream);
  const int n = kGemmSize;
  DeviceBuffer a(size_t{2} * n * n), b(size_t{2} * n * n), c(size_t{2} * n * n);
  bool ok = fill_random(a, DType::bf16, 1) && fill_random(b, DType::bf16, 2);
  const float one = 1.f, zero = 0.f;
  Timing t;
  ok = ok && time_graph(
                 stream, 1, 10,
                 [&](int) {
                   return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.ptr, CUDA_R_16BF,
                               n, b.ptr, CUDA_R_16BF, n, &zero, c.ptr, CUDA_R_16BF, n,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
                 },
                 &t);
  destroy(handle);
  if (ok) *tflops = 2.0 * n * n * n / (t.median_us * 1e6);
  return ok;
}

// Ceiling 3: cuBLASLt e4m3 GEMM 8192^3 (A transposed, as fp8 requires), fp32 accumulate, bf16 out.
bool measure_fp8_gemm(cudaStream_t stream, double* tflops) {
  *tflops = 0;
  void* lib = open_library("libcublasLt.so.13", "libcublasLt.so");
#define M3SA_LT(name) auto name##_ = symbol<decltype(name)>(lib, #name)
  M3SA_LT(cublasLtCreate);
  M3SA_LT(cublasLtDestroy);
  M3SA_LT(cublasLtMatmulDescCreate);
  M3SA_LT(cublasLtMatmulDescDestroy);
  M3SA_LT(cublasLtMatmulDescSetAttribute);
  M3SA_LT(cublasLtMatrixLayoutCreate);
  M3SA_LT(cublasLtMatrixLayoutDestroy);
  M3SA_LT(cublasLtMatmulPreferenceCreate);
  M3SA_LT(cublasLtMatmulPreferenceDestroy);
  M3SA_LT(cublasLtMatmulPreferenceSetAttribute);
  M3SA_LT(cublasLtMatmulAlgoGetHeuristic);
  M3SA_LT(cublasLtMatmul);
#undef M3SA_LT
  if (!cublasLtCreate_ || !cublasLtDestroy_ || !cublasLtMatmulDescCreate_ ||
      !cublasLtMatmulDescDestroy_ || !cublasLtMatmulDescSetAttribute_ ||
      !cublasLtMatrixLayoutCreate_ || !cublasLtMatrixLayoutDestroy_ ||
      !cublasLtMatmulPreferenceCreate_ || !cublasLtMatmulPreferenceDestroy_ ||
      !cublasLtMatmulPreferenceSetAttribute_ || !cublasLtMatmulAlgoGetHeuristic_ ||
      !cublasLtMatmul_)
    return false;
  const int n = kGemmSize;
  DeviceBuffer a(size_t{1} * n * n), b(size_t{1} * n * n), c(size_t{2} * n * n),
      workspace(size_t{32} << 20);
  if (!fill_random(a, DType::fp8_e4m3, 1) || !fill_random(b, DType::fp8_e4m3, 2)) return false;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  const size_t workspace_bytes = workspace.bytes;
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  bool ok =
      cublasLtCreate_(&handle) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescCreate_(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute_(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                      sizeof transpose) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute_(desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate_(&a_layout, CUDA_R_8F_E4M3, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate_(&b_layout, CUDA_R_8F_E4M3, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate_(&c_layout, CUDA_R_16BF, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate_(&preference) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute_(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &workspace_bytes,
                                            sizeof workspace_bytes) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic_(handle, desc, a_layout, b_layout, c_layout, c_layout,
                                      preference, 1, &heuristic, &found) == CUBLAS_STATUS_SUCCESS &&
      found > 0;
  const float one = 1.f, zero = 0.f;
  Timing t;
  ok = ok && time_graph(
                 stream, 1, 10,
                 [&](int) {
                   return cublasLtMatmul_(handle, desc, &one, a.ptr, a_layout, b.ptr, b_layout,
                                          &zero, c.ptr, c_layout, c.ptr, c_layout, &heuristic.algo,
                                          workspace.ptr, workspace_bytes,
                                          stream) == CUBLAS_STATUS_SUCCESS;
                 },
                 &t);
  if (preference) cublasLtMatmulPreferenceDestroy_(preference);
  for (cublasLtMatrixLayout_t layout : {a_layout, b_layout, c_layout})
    if (layout) cublasLtMatrixLayoutDestroy_(layout);
  if (desc) cublasLtMatmulDescDestroy_(desc);
  if (handle) cublasLtDestroy_(handle);
  if (ok) *tflops = 2.0 * n * n * n / (t.median_us * 1e6);
  return ok;
}

struct Ceilings {
  double copy_gbps = 0, bf16_gemm_tflops = 0, fp8_gemm_tflops = 0;
};

struct Case {
  std::string name;
  bool decode;
  int batch;   // decode requests (prefill: 1)
  int context; // tokens cached per request, this step's included
  int chunk;   // prefill query tokens (decode: 1)
  int heads;
  DType dtype;
};

std::vector<Case> cases(const std::string& set) {
  std::vector<Case> all;
  const DType dtypes[2] = {DType::bf16, DType::fp8_e4m3};
  for (DType d : dtypes) {
    const char* dn = d == DType::bf16 ? "bf16" : "fp8";
    for (int b : {1, 32, 128})
      for (int s : {8192, 32768, 131072})
        if (set == "full" || (b != 32 && s != 8192))
          all.push_back({std::string("decode ") + dn + " B=" + std::to_string(b) +
                             " S=" + std::to_string(s / 1024) + "K H=1",
                         true, b, s, 1, 1, d});
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

struct Record {
  Record(std::string case_name, std::string op, Timing timing)
      : name(std::move(case_name)), mode(std::move(op)), t(timing) {}
  std::string name, mode;
  Timing t;
  double bytes = 0, flops = 0, fraction = 0;
  const char* ceiling = "";
  std::string note; // derived figures (e.g. projected scaling), free text
};

// One case: build data sets (enough to rotate past 2x L2 for small caches), plan the three ops,
// time each: score_blocks, select_topk_blocks, index_topk.
bool run_case(const Case& c, cudaStream_t stream, const Ceilings& ceilings,
              std::vector<Record>* records) {
  const int blocks = (c.context + 127) / 128;
  const int64_t pages = int64_t{c.batch} * blocks;
  const int64_t tokens = c.decode ? c.batch : c.chunk;
  const size_t elem = dtype_size(c.dtype);
  const size_t cache_bytes = static_cast<size_t>(pages) * 128 * 128 * elem;
  const int sets =
      static_cast<int>(std::clamp<size_t>((size_t{240} << 20) / cache_bytes + 1, 1, 16));
  std::vector<std::unique_ptr<DeviceBuffer>> caches;
  for (int i = 0; i < sets; ++i) {
    caches.push_back(std::make_unique<DeviceBuffer>(cache_bytes));
    if (!caches.back()->ptr || !fill_random(*caches.back(), c.dtype, 10 + i)) return false;
  }
  // Metadata: decode requests each hold `context` tokens; a prefill request is one chunk at its
  // end.
  HostTensor cu(DType::i32, {c.batch + 1}), seq(DType::i32, {c.batch}),
      table(DType::i32, {c.batch, blocks});
  std::vector<int32_t> perm(pages);
  for (int64_t i = 0; i < pages; ++i) perm[i] = static_cast<int32_t>(i);
  Rng rng(5);
  for (int64_t i = pages - 1; i > 0; --i)
    std::swap(perm[i], perm[rng.uniform_int(0, static_cast<int>(i))]);
  for (int r = 0; r <= c.batch; ++r) cu.data<int32_t>()[r] = c.decode ? r : (r == 0 ? 0 : c.chunk);
  for (int r = 0; r < c.batch; ++r) {
    seq.data<int32_t>()[r] = c.context;
    for (int b = 0; b < blocks; ++b) table.data<int32_t>()[r * blocks + b] = perm[r * blocks + b];
  }
  DeviceBuffer d_cu(cu.bytes()), d_seq(seq.bytes()), d_table(table.bytes()),
      d_q(static_cast<size_t>(tokens) * c.heads * 128 * elem);
  BENCH_CHECK(cudaMemcpy(d_cu.ptr, cu.view().data, cu.bytes(), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_seq.ptr, seq.view().data, seq.bytes(), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_table.ptr, table.view().data, table.bytes(), cudaMemcpyHostToDevice));
  if (!fill_random(d_q, c.dtype, 3)) return false;
  const Device gpu{DeviceKind::cuda, 0};
  BatchMetadata batch{TensorView::contiguous(d_cu.ptr, DType::i32, {c.batch + 1}, gpu),
                      TensorView::contiguous(d_seq.ptr, DType::i32, {c.batch}, gpu),
                      TensorView::contiguous(d_table.ptr, DType::i32, {c.batch, blocks}, gpu),
                      c.batch,
                      c.decode ? c.batch : 0,
                      1,
                      static_cast<int>(tokens)};
  const TensorView q = TensorView::contiguous(d_q.ptr, c.dtype, {tokens, c.heads, 128}, gpu);
  MsaConfig config;
  config.num_index_heads = c.heads;
  DeviceBuffer d_scores(static_cast<size_t>(c.heads) * tokens * blocks * 4),
      d_topk(static_cast<size_t>(c.heads) * tokens * 16 * 4);
  const TensorView scores =
      TensorView::contiguous(d_scores.ptr, DType::f32, {c.heads, tokens, blocks}, gpu);
  const TensorView topk =
      TensorView::contiguous(d_topk.ptr, DType::i32, {c.heads, tokens, 16}, gpu);

  // Bytes: every key row once (plus the queries); FLOPs: 2 * 128 per visible (query row, key).
  double visible = 0;
  for (int64_t t = 0; t < tokens; ++t)
    visible += c.decode ? c.context : (c.context - c.chunk + t + 1);
  const double flops = 2.0 * 128 * c.heads * visible * (c.decode ? 1 : 1);
  const double key_bytes = static_cast<double>(c.batch) * c.context * 128 * elem;
  for (OpKind op : {OpKind::score_blocks, OpKind::select_topk_blocks, OpKind::index_topk}) {
    PlanRequest request{op, Backend::cuda, config, Capacities{c.batch, tokens, blocks}, c.dtype};
    OpPlan plan;
    Status s = make_plan(request, &plan);
    if (!s.ok()) {
      std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), s.to_string().c_str());
      return false;
    }
    DeviceBuffer ws(plan.workspace_bytes);
    s = prepare_workspace(plan, {ws.ptr, ws.bytes}, {0, stream});
    if (!s.ok()) {
      std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), s.to_string().c_str());
      return false;
    }
    Timing t;
    const bool ok = time_graph(
        stream, sets, c.decode ? 20 : 5,
        [&](int i) {
          const TensorView cache =
              TensorView::contiguous(caches[i % sets]->ptr, c.dtype, {pages, 128, 128}, gpu);
          const ExecContext ctx{0, stream};
          Status st;
          if (op == OpKind::score_blocks)
            st = score_blocks(plan, {q, cache, batch, scores}, {ws.ptr, ws.bytes}, ctx);
          else if (op == OpKind::select_topk_blocks)
            st = select_topk_blocks(plan, {scores, batch, topk}, {ws.ptr, ws.bytes}, ctx);
          else
            st = index_topk(plan, {q, cache, batch, topk}, {ws.ptr, ws.bytes}, ctx);
          if (!st.ok())
            std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), st.to_string().c_str());
          return st.ok();
        },
        &t);
    if (!ok) return false;
    Record rec{c.name, to_string(op), t};
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
    std::fprintf(stderr, "[m3sa bench] %-34s %-18s %10.2f us\n", c.name.c_str(), rec.mode.c_str(),
                 t.median_us);
  }
  return true;
}

// norm_rope_insert at MiniMax-M3 TP1 shapes (64 q heads, 4 KV heads, 4 index heads) for
// `tokens` tokens: bytes read (q, k, v, index q / k, positions, slots) plus bytes written (q out,
// K and V rows, index-Q, index-K rows), against the copy ceiling.
std::string norm_rope_case_name(int tokens, DType kv_dtype, DType index_dtype) {
  return std::string("norm_rope_insert T=") + std::to_string(tokens / 1024) + "K kv " +
         (kv_dtype == DType::bf16 ? "bf16" : "fp8") + " index " +
         (index_dtype == DType::bf16 ? "bf16" : "fp8");
}

bool run_norm_rope_case(int tokens, DType kv_dtype, DType index_dtype, cudaStream_t stream,
                        const Ceilings& ceilings, std::vector<Record>* records) {
  constexpr int kQHeads = 64, kKvHeads = 4, kIndexHeads = 4;
  const std::string name = norm_rope_case_name(tokens, kv_dtype, index_dtype);
  const int64_t T = tokens, pages = (T + 127) / 128;
  const Device gpu{DeviceKind::cuda, 0};
  DeviceBuffer q(T * kQHeads * 256), k(T * kKvHeads * 256), v(T * kKvHeads * 256),
      iq(T * kIndexHeads * 256), ik(T * 256), weights(4 * 128 * 2), positions(T * 8), slots(T * 8),
      q_out(T * kQHeads * 256), k_cache(pages * 128 * kKvHeads * 128 * dtype_size(kv_dtype)),
      v_cache(pages * 128 * kKvHeads * 128 * dtype_size(kv_dtype)),
      iq_out(T * kIndexHeads * 128 * dtype_size(index_dtype)),
      ik_cache(pages * 128 * 128 * dtype_size(index_dtype));
  for (DeviceBuffer* b : {&q, &k, &v, &iq, &ik, &weights})
    if (!fill_random(*b, DType::bf16, 7)) return false;
  HostTensor host_positions(DType::i64, {T}), host_slots(DType::i64, {T});
  Rng rng(11);
  for (int64_t t = 0; t < T; ++t) {
    host_positions.data<int64_t>()[t] = static_cast<int64_t>(rng.uniform() * (1 << 20));
    host_slots.data<int64_t>()[t] = t; // distinct, every one written
  }
  BENCH_CHECK(cudaMemcpy(positions.ptr, host_positions.view().data, T * 8, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(slots.ptr, host_slots.view().data, T * 8, cudaMemcpyHostToDevice));
  const auto view = [&](const DeviceBuffer& b, DType dtype, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(b.ptr, dtype, shape, gpu);
  };
  NormRopeInsertArgs a;
  a.q = view(q, DType::bf16, {T, kQHeads, 128});
  a.k = view(k, DType::bf16, {T, kKvHeads, 128});
  a.v = view(v, DType::bf16, {T, kKvHeads, 128});
  a.index_q = view(iq, DType::bf16, {T, kIndexHeads, 128});
  a.index_k = view(ik, DType::bf16, {T, 128});
  a.positions = view(positions, DType::i64, {T});
  TensorView* gains[4] = {&a.q_norm_weight, &a.k_norm_weight, &a.index_q_norm_weight,
                          &a.index_k_norm_weight};
  for (int i = 0; i < 4; ++i)
    *gains[i] =
        TensorView::contiguous(static_cast<char*>(weights.ptr) + i * 256, DType::bf16, {128}, gpu);
  a.slot_mapping = a.index_slot_mapping = view(slots, DType::i64, {T});
  a.q_out = view(q_out, DType::bf16, {T, kQHeads, 128});
  a.k_cache = view(k_cache, kv_dtype, {pages, 128, kKvHeads, 128});
  a.v_cache = view(v_cache, kv_dtype, {pages, 128, kKvHeads, 128});
  a.index_q_out = view(iq_out, index_dtype, {T, kIndexHeads, 128});
  a.index_k_cache = view(ik_cache, index_dtype, {pages, 128, 128});
  MsaConfig config;
  config.num_index_heads = kIndexHeads;
  PlanRequest request{OpKind::norm_rope_insert, Backend::cuda, config, Capacities{1, T, 1},
                      index_dtype};
  OpPlan plan;
  Status s = make_plan(request, &plan);
  DeviceBuffer ws(plan.workspace_bytes);
  if (s.ok()) s = prepare_workspace(plan, {ws.ptr, ws.bytes}, {0, stream});
  Timing t;
  const bool ok = s.ok() && time_graph(
                                stream, 1, 20,
                                [&](int) {
                                  s = norm_rope_insert(plan, a, {ws.ptr, ws.bytes}, {0, stream});
                                  return s.ok();
                                },
                                &t);
  if (!ok) {
    std::fprintf(stderr, "m3sa bench: %s: %s\n", name.c_str(), s.to_string().c_str());
    return false;
  }
  Record rec{name, "norm_rope_insert", t};
  const double rows_read = kQHeads + 2 * kKvHeads + kIndexHeads + 1;
  rec.bytes = static_cast<double>(T) *
              (rows_read * 256 + 16 + kQHeads * 256 + 2 * kKvHeads * 128 * dtype_size(kv_dtype) +
               (kIndexHeads + 1) * 128 * dtype_size(index_dtype));
  rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
  rec.ceiling = "copy";
  records->push_back(rec);
  std::fprintf(stderr, "[m3sa bench] %-34s %10.2f us\n", name.c_str(), t.median_us);
  return true;
}

// B single-token decode requests of `context` tokens on the current device: lengths, a
// [B, width] block table and one bf16 query each; args() adds the cache and the output.
struct DecodeRequests {
  int batch;
  int64_t width;
  DeviceBuffer cu, seq, table, q;
  bool ok = false;
  DecodeRequests(int b, int context, const HostTensor& host_table)
      : batch(b), width(host_table.view().shape[1]), cu((b + 1) * 4), seq(b * 4),
        table(host_table.bytes()), q(int64_t{b} * 256) {
    HostTensor host_cu(DType::i32, {b + 1}), host_seq(DType::i32, {b});
    for (int r = 0; r <= b; ++r) host_cu.data<int32_t>()[r] = r;
    for (int r = 0; r < b; ++r) host_seq.data<int32_t>()[r] = context;
    ok = fill_random(q, DType::bf16, 29) &&
         cudaMemcpy(cu.ptr, host_cu.view().data, host_cu.bytes(), cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(seq.ptr, host_seq.view().data, host_seq.bytes(), cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(table.ptr, host_table.view().data, host_table.bytes(),
                    cudaMemcpyHostToDevice) == cudaSuccess;
  }
  IndexTopkArgs args(const DeviceBuffer& cache, int64_t pages, const TensorView& topk) const {
    const Device gpu{DeviceKind::cuda, 0};
    return {TensorView::contiguous(q.ptr, DType::bf16, {batch, 1, 128}, gpu),
            TensorView::contiguous(cache.ptr, DType::bf16, {pages, 128, 128}, gpu),
            {TensorView::contiguous(cu.ptr, DType::i32, {batch + 1}, gpu),
             TensorView::contiguous(seq.ptr, DType::i32, {batch}, gpu),
             TensorView::contiguous(table.ptr, DType::i32, {batch, width}, gpu), batch, batch, 1,
             batch},
            topk};
  }
};

// Context-parallel decode at 1M tokens on ONE GPU: the work of rank 0 of R contiguous shards
// (score its 1/R of every request's blocks, then merge R candidate lists), timed alone. With
// the all-gather left out (it needs R GPUs), t(1) / (R * t(R)) is the scaling efficiency the
// kernels allow; the exchange (R x H x B x 15 keys of 8 bytes) adds NCCL latency on top.
bool run_context_parallel_cases(int batch, cudaStream_t stream, const Ceilings& ceilings,
                                std::vector<Record>* records, double* single_gpu_us) {
  constexpr int kContext = 1 << 20, kBlocks = kContext / 128;
  const int64_t pages = int64_t{batch} * kBlocks;
  const Device gpu{DeviceKind::cuda, 0};
  DeviceBuffer cache(static_cast<size_t>(pages) * 128 * 128 * 2);
  if (!cache.ptr || !fill_random(cache, DType::bf16, 21)) return false;
  MsaConfig config;
  config.num_index_heads = 1;
  const PlanRequest request{OpKind::index_topk, Backend::cuda, config,
                            Capacities{batch, batch, kBlocks}, DType::bf16};
  for (int ranks : {1, 2, 4, 8}) {
    ContextParallelPlan plan;
    Status s = make_context_parallel_plan(request, {0, ranks, ShardMode::contiguous}, &plan);
    if (!s.ok()) {
      std::fprintf(stderr, "m3sa bench: context parallel: %s\n", s.to_string().c_str());
      return false;
    }
    const int64_t span = shard_local_blocks(request.capacities, plan.shard, kBlocks);
    HostTensor host_table(DType::i32, {batch, span});
    for (int r = 0; r < batch; ++r)
      for (int64_t j = 0; j < span; ++j)
        host_table.data<int32_t>()[r * span + j] = static_cast<int32_t>(
            r * kBlocks + shard_global_block(request.capacities, plan.shard, j));
    const DecodeRequests requests(batch, kContext, host_table);
    DeviceBuffer ws(plan.workspace_bytes), topk(int64_t{batch} * 16 * 4),
        gathered(plan.candidate_bytes * ranks);
    if (!requests.ok) return false;
    const IndexTopkArgs args = requests.args(cache, pages, {});
    const BatchMetadata& meta = args.batch;
    const TensorView all =
        TensorView::contiguous(gathered.ptr, DType::i64, {ranks, 1, batch, plan.ranked_slots}, gpu);
    const TensorView mine =
        TensorView::contiguous(gathered.ptr, DType::i64, {1, batch, plan.ranked_slots}, gpu);
    const TensorView out = TensorView::contiguous(topk.ptr, DType::i32, {1, batch, 16}, gpu);
    s = prepare_context_parallel_workspace(plan, {ws.ptr, ws.bytes}, {0, stream});
    Timing t;
    const bool ok =
        s.ok() &&
        time_graph(
            stream, 1, 20,
            [&](int) {
              s = score_shard_candidates(plan, args, mine, {ws.ptr, ws.bytes}, {0, stream});
              if (s.ok()) s = merge_shard_candidates(plan, all, meta, out, {0, stream});
              return s.ok();
            },
            &t);
    if (!ok) {
      std::fprintf(stderr, "m3sa bench: context parallel: %s\n", s.to_string().c_str());
      return false;
    }
    if (ranks == 1) *single_gpu_us = t.median_us;
    Record rec{"context parallel B=" + std::to_string(batch) + " S=1M H=1 bf16, rank 0 of " +
                   std::to_string(ranks),
               "score_shard+merge", t};
    rec.bytes = static_cast<double>(batch) * span * 128 * 128 * 2;
    rec.fraction = rec.bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
    rec.ceiling = "copy";
    char note[96];
    std::snprintf(note, sizeof note, "projected scaling efficiency without the all-gather %.0f%%",
                  100 * *single_gpu_us / (ranks * t.median_us));
    rec.note = note;
    records->push_back(rec);
    std::fprintf(stderr, "[m3sa bench] %-34s %10.2f us\n", rec.name.c_str(), t.median_us);
  }
  return true;
}

#ifdef M3SA_BENCH_NCCL
// Context-parallel decode at 1M tokens across 2, 4 and 8 GPUs (as many as are visible) through
// NCCL: each rank holds only its round-robin shard of each request's index cache and runs
// context_parallel_index_topk (score, all-gather, merge) on its own stream, (a) as eager steps
// timed with events and (b) captured in a CUDA graph per rank (thread-local capture: the ranks
// capture at the same time) and replayed - how a decode step runs in an engine. Rank 0's median
// against one GPU running the whole batch in a graph (score + merge, no exchange).
bool run_context_parallel_nccl(int batch, int ranks, double single_gpu_us, const Ceilings& ceilings,
                               std::vector<Record>* records) {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    std::fprintf(stderr, "m3sa bench: libnccl.so.2 not loadable: multi-GPU cases skipped\n");
    return true;
  }
  const auto get_id = reinterpret_cast<decltype(&ncclGetUniqueId)>(dlsym(lib, "ncclGetUniqueId"));
  const auto init_rank =
      reinterpret_cast<decltype(&ncclCommInitRank)>(dlsym(lib, "ncclCommInitRank"));
  const auto destroy = reinterpret_cast<decltype(&ncclCommDestroy)>(dlsym(lib, "ncclCommDestroy"));
  ncclUniqueId id;
  if (!get_id || !init_rank || !destroy || get_id(&id) != ncclSuccess) return false;
  constexpr int kContext = 1 << 20, kBlocks = kContext / 128;
  MsaConfig config;
  config.num_index_heads = 1;
  const PlanRequest request{OpKind::index_topk, Backend::cuda, config,
                            Capacities{batch, batch, kBlocks}, DType::bf16};
  std::vector<Timing> eager(ranks), graph(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      const auto fail = [&](const std::string& what) { errors[rank] = what; };
      cudaSetDevice(rank);
      ncclComm_t comm;
      if (init_rank(&comm, ranks, id, rank) != ncclSuccess) return fail("ncclCommInitRank");
      ContextParallelPlan plan;
      Status s = make_context_parallel_plan(request, {rank, ranks, ShardMode::round_robin}, &plan);
      const int64_t span = shard_local_blocks(request.capacities, plan.shard, kBlocks);
      const int64_t pages = batch * span;
      const Device gpu{DeviceKind::cuda, 0};
      DeviceBuffer cache(static_cast<size_t>(pages) * 128 * 128 * 2), topk(int64_t{batch} * 64),
          ws(plan.workspace_bytes);
      HostTensor host_table(DType::i32, {batch, span}); // the rank's pages, in order
      for (int64_t i = 0; i < pages; ++i) host_table.data<int32_t>()[i] = static_cast<int32_t>(i);
      const DecodeRequests requests(batch, kContext, host_table);
      if (!requests.ok || !fill_random(cache, DType::bf16, 30 + rank)) return fail("buffers");
      const IndexTopkArgs args = requests.args(
          cache, pages, TensorView::contiguous(topk.ptr, DType::i32, {1, batch, 16}, gpu));
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      cudaEvent_t start, stop;
      cudaEventCreate(&start), cudaEventCreate(&stop);
      const auto step = [&](int) {
        s = context_parallel_index_topk(plan, args, comm, {ws.ptr, ws.bytes}, {0, stream});
        return s.ok();
      };
      if (s.ok()) s = prepare_context_parallel_workspace(plan, {ws.ptr, ws.bytes}, {0, stream});
      std::vector<double> us;
      for (int i = 0; i < 23 && s.ok(); ++i) {
        cudaEventRecord(start, stream);
        step(i);
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        if (i >= 3) us.push_back(1e3 * ms);
      }
      if (s.ok()) {
        std::sort(us.begin(), us.end());
        eager[rank].median_us = us[us.size() / 2];
        if (!time_graph(stream, 1, 20, step, &graph[rank], cudaStreamCaptureModeThreadLocal) &&
            s.ok())
          fail("graph capture or replay");
      }
      if (!s.ok()) fail(s.to_string());
      cudaEventDestroy(start), cudaEventDestroy(stop);
      cudaStreamDestroy(stream);
      destroy(comm);
    });
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < ranks; ++rank)
    if (!errors[rank].empty()) {
      std::fprintf(stderr, "m3sa bench: context parallel NCCL rank %d of %d: %s\n", rank, ranks,
                   errors[rank].c_str());
      return false;
    }
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
    std::fprintf(stderr, "[m3sa bench] %-34s %10.2f us\n", rec.name.c_str(), t.median_us);
  }
  return true;
}
#endif

// Sparse attention at MiniMax-M3 shapes (64/4 at TP1, 16/1 per TP4 rank), with selections made
// by index_topk on random index data, as an engine makes them. Decode: B single-token requests of
// S tokens replayed from a graph, rotating over block tables that draw pages at random from a
// pool larger than L2 (cold L2, like the peer's rotations). Prefill: one 8K chunk at the end of S.
struct AttentionBenchCase {
  std::string name;
  bool decode;
  int batch, context, chunk, q_heads, kv_heads;
  DType kv_dtype;
};

std::vector<AttentionBenchCase> attention_cases(const std::string& set) {
  std::vector<AttentionBenchCase> all;
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
            all.push_back({"attention decode " + dn + " B=" + std::to_string(b) + suffix(s, hq, hkv),
                           true, b, s, 1, hq, hkv, d});
      }
  }
  return all;
}

bool run_attention_case(const AttentionBenchCase& c, cudaStream_t stream, const Ceilings& ceilings,
                        std::vector<Record>* records) {
  const Device gpu{DeviceKind::cuda, 0};
  const int blocks = (c.context + 127) / 128;
  const int64_t tokens = c.decode ? c.batch : c.chunk;
  const size_t elem = dtype_size(c.kv_dtype);
  const int top_k = 16;
  // Keys each token attends to and the bytes of K and V they hold (per KV head).
  double keys = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = c.decode ? c.context - 1 : c.context - c.chunk + t;
    keys += (std::min<int64_t>(top_k, p / 128 + 1) - 1) * 128.0 + p % 128 + 1;
  }
  const double kv_bytes = keys * c.kv_heads * 2 * 128 * elem;
  const double flops = keys * c.q_heads * 4 * 128;
  // Rotation sets for decode (cold L2), one for prefill; pages from one pool per case.
  const double call_bytes = kv_bytes;
  const int sets = c.decode ? static_cast<int>(std::clamp<double>(
                                  (240.0 * (1 << 20)) / call_bytes + 1, 1, 16))
                            : 1;
  const int64_t page_bytes = int64_t{128} * c.kv_heads * 128 * static_cast<int64_t>(elem);
  const int64_t pool = c.decode ? std::min<int64_t>(int64_t{c.batch} * blocks * sets,
                                                    (int64_t{4} << 30) / page_bytes)
                                : blocks;
  DeviceBuffer k_cache(pool * page_bytes), v_cache(pool * page_bytes),
      index_cache(pool * 128 * 128 * 2), q(tokens * c.q_heads * 128 * 2),
      index_q(tokens * c.kv_heads * 128 * 2), out(tokens * c.q_heads * 128 * 2),
      cu((c.batch + 1) * 4), seq(c.batch * 4);
  if (!k_cache.ptr || !v_cache.ptr || !index_cache.ptr ||
      !fill_random(k_cache, c.kv_dtype, 41) || !fill_random(v_cache, c.kv_dtype, 42) ||
      !fill_random(index_cache, DType::bf16, 43) || !fill_random(q, DType::bf16, 44) ||
      !fill_random(index_q, DType::bf16, 45))
    return false;
  HostTensor host_cu(DType::i32, {c.batch + 1}), host_seq(DType::i32, {c.batch});
  for (int r = 0; r <= c.batch; ++r) host_cu.data<int32_t>()[r] = c.decode ? r : (r ? c.chunk : 0);
  for (int r = 0; r < c.batch; ++r) host_seq.data<int32_t>()[r] = c.context;
  BENCH_CHECK(cudaMemcpy(cu.ptr, host_cu.view().data, host_cu.bytes(), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(seq.ptr, host_seq.view().data, host_seq.bytes(), cudaMemcpyHostToDevice));
  MsaConfig config;
  config.num_index_heads = c.kv_heads;
  config.top_k = top_k;
  const Capacities capacities{c.batch, tokens, blocks};
  PlanRequest index_request{OpKind::index_topk, Backend::cuda, config, capacities, DType::bf16};
  PlanRequest attention_request{OpKind::sparse_attention, Backend::cuda, config, capacities,
                                c.kv_dtype};
  OpPlan index_plan, attention_plan;
  Status st = make_plan(index_request, &index_plan);
  if (st.ok()) st = make_plan(attention_request, &attention_plan);
  DeviceBuffer index_ws(index_plan.workspace_bytes), attention_ws(attention_plan.workspace_bytes);
  if (st.ok()) st = prepare_workspace(index_plan, {index_ws.ptr, index_ws.bytes}, {0, stream});
  if (st.ok())
    st = prepare_workspace(attention_plan, {attention_ws.ptr, attention_ws.bytes}, {0, stream});
  // Per set: a block table drawing random pool pages and the selections index_topk makes on it.
  std::vector<std::unique_ptr<DeviceBuffer>> tables, selections;
  Rng rng(17);
  const auto batch_of = [&](int set) {
    return BatchMetadata{TensorView::contiguous(cu.ptr, DType::i32, {c.batch + 1}, gpu),
                         TensorView::contiguous(seq.ptr, DType::i32, {c.batch}, gpu),
                         TensorView::contiguous(tables[set]->ptr, DType::i32, {c.batch, blocks}, gpu),
                         c.batch,
                         c.decode ? c.batch : 0,
                         1,
                         static_cast<int>(tokens)};
  };
  for (int set = 0; set < sets && st.ok(); ++set) {
    HostTensor table(DType::i32, {c.batch, blocks});
    for (int64_t i = 0; i < int64_t{c.batch} * blocks; ++i)
      table.data<int32_t>()[i] = c.decode ? rng.uniform_int(0, static_cast<int>(pool - 1))
                                          : static_cast<int32_t>(i);
    tables.push_back(std::make_unique<DeviceBuffer>(table.bytes()));
    selections.push_back(std::make_unique<DeviceBuffer>(c.kv_heads * tokens * top_k * 4));
    BENCH_CHECK(cudaMemcpy(tables.back()->ptr, table.view().data, table.bytes(),
                           cudaMemcpyHostToDevice));
    st = index_topk(
        index_plan,
        {TensorView::contiguous(index_q.ptr, DType::bf16, {tokens, c.kv_heads, 128}, gpu),
         TensorView::contiguous(index_cache.ptr, DType::bf16, {pool, 128, 128}, gpu), batch_of(set),
         TensorView::contiguous(selections.back()->ptr, DType::i32, {c.kv_heads, tokens, top_k},
                                gpu)},
        {index_ws.ptr, index_ws.bytes}, {0, stream});
  }
  if (!st.ok()) {
    std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), st.to_string().c_str());
    return false;
  }
  Timing t;
  const bool ok = time_graph(
      stream, sets, c.decode ? 20 : 5,
      [&](int i) {
        SparseAttentionArgs a;
        a.q = TensorView::contiguous(q.ptr, DType::bf16, {tokens, c.q_heads, 128}, gpu);
        a.k_cache = TensorView::contiguous(k_cache.ptr, c.kv_dtype, {pool, 128, c.kv_heads, 128}, gpu);
        a.v_cache = TensorView::contiguous(v_cache.ptr, c.kv_dtype, {pool, 128, c.kv_heads, 128}, gpu);
        a.topk = TensorView::contiguous(selections[i % sets]->ptr, DType::i32,
                                        {c.kv_heads, tokens, top_k}, gpu);
        a.batch = batch_of(i % sets);
        a.out = TensorView::contiguous(out.ptr, DType::bf16, {tokens, c.q_heads, 128}, gpu);
        const Status s = sparse_attention(attention_plan, a, {attention_ws.ptr, attention_ws.bytes},
                                          {0, stream});
        if (!s.ok()) std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), s.to_string().c_str());
        return s.ok();
      },
      &t);
  if (!ok) return false;
  int32_t flags = 0;
  st = read_device_errors(attention_plan, {attention_ws.ptr, attention_ws.bytes}, {0, stream},
                          &flags);
  if (!st.ok() || flags != 0) {
    std::fprintf(stderr, "m3sa bench: %s: device error flags %d %s\n", c.name.c_str(), flags,
                 st.to_string().c_str());
    return false;
  }
  Record rec{c.name, to_string(OpKind::sparse_attention), t};
  rec.bytes = kv_bytes, rec.flops = flops;
  if (c.decode) {
    rec.fraction = kv_bytes / (t.median_us * 1e3) / ceilings.copy_gbps;
    rec.ceiling = "copy";
  } else {
    rec.fraction = ceilings.bf16_gemm_tflops > 0
                       ? flops / (t.median_us * 1e6) / ceilings.bf16_gemm_tflops
                       : 0;
    rec.ceiling = "bf16 GEMM";
    rec.note = "bytes: K and V of every token's selected keys (no sharing between tokens)";
  }
  records->push_back(rec);
  std::fprintf(stderr, "[m3sa bench] %-50s %10.2f us\n", c.name.c_str(), t.median_us);
  return true;
}

std::string iso_date() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

} // namespace

int run_bench(const BenchOptions& options) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "m3sa bench: no CUDA device is visible\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  Ceilings ceilings;
  if (!measure_copy(stream, &ceilings.copy_gbps)) return 1;
  const auto describe_gemm = [](bool measured, double tflops) {
    return measured ? std::to_string(static_cast<int>(tflops)) + " TFLOP/s"
                    : std::string("unavailable (library absent or refused)");
  };
  const bool have_bf16_gemm = measure_bf16_gemm(stream, &ceilings.bf16_gemm_tflops);
  const bool have_fp8_gemm = measure_fp8_gemm(stream, &ceilings.fp8_gemm_tflops);
  const std::string bf16_gemm = describe_gemm(have_bf16_gemm, ceilings.bf16_gemm_tflops);
  const std::string fp8_gemm = describe_gemm(have_fp8_gemm, ceilings.fp8_gemm_tflops);
  std::printf("# m3sa bench on %s (%d SMs), commit %s, %s\n\n", prop.name, prop.multiProcessorCount,
              build_commit(), iso_date().c_str());
  std::printf("ceilings measured in this run: device-to-device copy %.0f GB/s (read + write); "
              "cuBLAS bf16 GEMM 8192^3 %s; cuBLASLt e4m3 GEMM 8192^3 %s\n\n",
              ceilings.copy_gbps, bf16_gemm.c_str(), fp8_gemm.c_str());
  std::vector<Record> records;
  int failures = 0;
  for (const Case& c : cases(options.set)) {
    if (!options.filter.empty() && c.name.find(options.filter) == std::string::npos) continue;
    if (!run_case(c, stream, ceilings, &records)) ++failures;
  }
  for (const AttentionBenchCase& c : attention_cases(options.set)) {
    if (!options.filter.empty() && c.name.find(options.filter) == std::string::npos) continue;
    if (!run_attention_case(c, stream, ceilings, &records)) ++failures;
  }
  for (DType kv : {DType::bf16, DType::fp8_e4m3})
    for (DType index : {DType::bf16, DType::fp8_e4m3}) {
      const std::string name = norm_rope_case_name(16384, kv, index);
      if ((options.set != "full" && kv != index) ||
          (!options.filter.empty() && name.find(options.filter) == std::string::npos))
        continue;
      if (!run_norm_rope_case(16384, kv, index, stream, ceilings, &records)) ++failures;
    }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  for (int batch : {1, 4, 16, 64}) {
    if (options.set != "full" && (batch == 4 || batch == 16)) continue;
    if (!options.filter.empty() &&
        std::string("context parallel").find(options.filter) == std::string::npos)
      continue;
    double single_gpu_us = 0;
    if (!run_context_parallel_cases(batch, stream, ceilings, &records, &single_gpu_us)) ++failures;
#ifdef M3SA_BENCH_NCCL
    else
      for (int ranks = 2; ranks <= devices; ranks *= 2)
        if (!run_context_parallel_nccl(batch, ranks, single_gpu_us, ceilings, &records)) ++failures;
#endif
  }
  std::printf("| case | op | median us | CV | GB/s | TFLOP/s | of ceiling | note "
              "|\n|---|---|---|---|---|---|---|---|\n");
  for (const Record& r : records)
    std::printf("| %s | %s | %.2f | %.1f%% | %.0f | %.1f | %.1f%% of %s | %s |\n", r.name.c_str(),
                r.mode.c_str(), r.t.median_us, 100 * r.t.cv, r.bytes / (r.t.median_us * 1e3),
                r.flops / (r.t.median_us * 1e6), 100 * r.fraction, r.ceiling, r.note.c_str());
  if (!options.json_path.empty()) {
    FILE* f = std::fopen(options.json_path.c_str(), "w");
    if (!f) return 1;
    std::fprintf(
        f, "{\n  \"device\": \"%s\", \"sm_count\": %d, \"commit\": \"%s\", \"date\": \"%s\",\n",
        prop.name, prop.multiProcessorCount, build_commit(), iso_date().c_str());
    std::fprintf(f,
                 "  \"ceilings\": {\"copy_gbps\": %.1f, \"bf16_gemm_tflops\": %.1f, "
                 "\"fp8_gemm_tflops\": %.1f},\n  \"records\": [\n",
                 ceilings.copy_gbps, ceilings.bf16_gemm_tflops, ceilings.fp8_gemm_tflops);
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::fprintf(f,
                   "    {\"device\": \"%s\", \"commit\": \"%s\", \"case\": \"%s\", \"op\": \"%s\", "
                   "\"median_us\": %.3f, \"cv\": %.4f, "
                   "\"bytes\": %.0f, \"flops\": %.0f, \"gbps\": %.1f, \"tflops\": %.2f, "
                   "\"fraction_of_ceiling\": %.4f, \"ceiling\": \"%s\", \"note\": \"%s\"}%s\n",
                   prop.name, build_commit(), r.name.c_str(), r.mode.c_str(), r.t.median_us, r.t.cv,
                   r.bytes, r.flops, r.bytes / (r.t.median_us * 1e3),
                   r.flops / (r.t.median_us * 1e6), r.fraction, r.ceiling, r.note.c_str(),
                   i + 1 < records.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  cudaStreamDestroy(stream);
  return failures ? 1 : 0;
}

} // namespace m3sa::cli
#endif
