// The ceilings each `m3sa bench` record is measured against, measured in the same run.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include "bench_timing.h"

namespace m3sa::cli::bench {
namespace {

// Symbols of a library opened at run time, typed by the toolkit's own declarations, so the binary
// needs no cuBLAS to start and the ceilings are simply absent where the library is.
template <typename Fn> Fn* symbol(void* lib, const char* name) {
  return lib ? reinterpret_cast<Fn*>(dlsym(lib, name)) : nullptr;
}
void* open_library(const char* versioned, const char* plain) {
  void* lib = dlopen(versioned, RTLD_NOW);
  return lib ? lib : dlopen(plain, RTLD_NOW);
}

Status cublas_absent(const char* library) {
  return Status::unsupported(library, "not loadable, or an entry point is missing");
}

constexpr int kGemmSize = 8192;

// One kGemmSize^3 GEMM launch (`gemm()`, a cuBLAS status) timed in a graph: TFLOP/s.
template <typename Gemm> Status time_gemm(cudaStream_t stream, Gemm&& gemm, double* tflops) {
  Timing t;
  M3SA_RETURN_IF_ERROR(time_graph(
      stream, 1, 10,
      [&](int) {
        return gemm() == CUBLAS_STATUS_SUCCESS ? Status{}
                                               : Status::unsupported("GEMM", "cuBLAS refused it");
      },
      &t));
  const double n = kGemmSize;
  *tflops = 2.0 * n * n * n / (t.median_us * 1e6);
  return {};
}

} // namespace

// Ceiling 1: device-to-device copy of 2 GiB, bytes read + written, timed with events on the stream
// (a memcpy node inside a graph runs on the copy engines and reads about a third lower).
Status measure_copy(cudaStream_t stream, double* gbps) {
  const size_t bytes = size_t{1} << 31;
  const DeviceBuffer a(bytes), b(bytes);
  M3SA_RETURN_IF_ERROR(a.status());
  M3SA_RETURN_IF_ERROR(b.status());
  M3SA_RETURN_IF_ERROR(a.fill(1));
  double median_us = 0;
  M3SA_RETURN_IF_ERROR(time_eager(
      stream,
      [&] {
        return cuda::cuda_status(
            cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
      },
      &median_us));
  *gbps = 2.0 * bytes / (median_us * 1e3);
  return {};
}

// Ceiling 2: cuBLAS bf16 GEMM 8192^3, fp32 accumulate.
Status measure_bf16_gemm(cudaStream_t stream, double* tflops) {
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
  if (!create || !destroy || !set_stream || !gemm) return cublas_absent("cuBLAS");
  cublasHandle_t handle = nullptr;
  if (create(&handle) != CUBLAS_STATUS_SUCCESS)
    return Status::unsupported("cuBLAS", "cublasCreate refused");
  set_stream(handle, stream);
  const int n = kGemmSize;
  const DeviceBuffer a(size_t{2} * n * n), b(size_t{2} * n * n), c(size_t{2} * n * n);
  Status s = a.fill_random(DType::bf16, 1);
  if (s.ok()) s = b.fill_random(DType::bf16, 2);
  const float one = 1.f, zero = 0.f;
  if (s.ok())
    s = time_gemm(
        stream,
        [&] {
          return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(), CUDA_R_16BF, n,
                      b.data(), CUDA_R_16BF, n, &zero, c.data(), CUDA_R_16BF, n,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        },
        tflops);
  destroy(handle);
  return s;
}

// Ceiling 3: cuBLASLt e4m3 GEMM 8192^3 (A transposed, as fp8 requires), fp32 accumulate, bf16 out.
Status measure_fp8_gemm(cudaStream_t stream, double* tflops) {
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
    return cublas_absent("cuBLASLt");
  const int n = kGemmSize;
  const DeviceBuffer a(size_t{1} * n * n), b(size_t{1} * n * n), c(size_t{2} * n * n),
      workspace(size_t{32} << 20);
  M3SA_RETURN_IF_ERROR(a.fill_random(DType::fp8_e4m3, 1));
  M3SA_RETURN_IF_ERROR(b.fill_random(DType::fp8_e4m3, 2));
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  const size_t workspace_bytes = workspace.bytes();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const bool ready =
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
  Status s = ready ? Status{} : Status::unsupported("cuBLASLt", "no e4m3 GEMM for 8192^3");
  const float one = 1.f, zero = 0.f;
  if (s.ok())
    s = time_gemm(
        stream,
        [&] {
          return cublasLtMatmul_(handle, desc, &one, a.data(), a_layout, b.data(), b_layout, &zero,
                                 c.data(), c_layout, c.data(), c_layout, &heuristic.algo,
                                 workspace.data(), workspace_bytes, stream);
        },
        tflops);
  if (preference) cublasLtMatmulPreferenceDestroy_(preference);
  for (cublasLtMatrixLayout_t layout : {a_layout, b_layout, c_layout})
    if (layout) cublasLtMatrixLayoutDestroy_(layout);
  if (desc) cublasLtMatmulDescDestroy_(desc);
  if (handle) cublasLtDestroy_(handle);
  return s;
}

} // namespace m3sa::cli::bench
