// `m3sa bench`: the driver. Measures the ceilings, runs every case of the set (or those whose name
// contains the filter), then prints the table; the JSON records are rewritten after every case.
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
#include <string>
#include <vector>

#include "bench_timing.h"

namespace m3sa::cli {
namespace {

// False, with the reason on stderr, where `s` failed.
bool succeeded(const std::string& what, const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "m3sa bench: %s: %s\n", what.c_str(), s.to_string().c_str());
  return s.ok();
}

} // namespace

int run_bench(const BenchOptions& options) {
  using namespace bench;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "m3sa bench: no CUDA device is visible\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  Ceilings ceilings;
  if (!succeeded("copy ceiling", measure_copy(stream, &ceilings.copy_gbps))) return 1;
  const bool have_bf16_gemm = measure_bf16_gemm(stream, &ceilings.bf16_gemm_tflops).ok();
  const bool have_fp8_gemm = measure_fp8_gemm(stream, &ceilings.fp8_gemm_tflops).ok();
  const RunInfo run{prop.name, prop.multiProcessorCount, build_commit(), iso_date()};
  print_header(run, ceilings, have_bf16_gemm, have_fp8_gemm);
  std::vector<Record> records;
  int failures = 0;
  // A case's status counted, and the records so far saved (marked complete after the last case;
  // only that final write's failure fails the run).
  const auto finish_case = [&](const std::string& what, const Status& s) {
    if (!succeeded(what, s)) ++failures;
    if (!options.json_path.empty()) write_json(options.json_path, run, ceilings, records, false);
    return s.ok();
  };
  // "^decode " is the decode indexer, not attention decode.
  const auto selected = [&](const std::string& name) {
    return name_selected(options.filter, name);
  };
  for (Case c : cases(options.set)) {
    c.pages_in_order = options.index_pages_in_order;
    c.plan_requests = options.plan_requests;
    if (selected(c.name)) finish_case(c.name, run_case(c, stream, ceilings, &records));
  }
  for (AttentionCase c : attention_cases(options.set)) {
    c.kv_pool_bytes = static_cast<int64_t>(options.kv_pool_gib * double{1 << 30});
    if (selected(c.name)) finish_case(c.name, run_attention_case(c, stream, ceilings, &records));
  }
  for (DType kv : {DType::bf16, DType::fp8_e4m3})
    for (DType index : {DType::bf16, DType::fp8_e4m3}) {
      const std::string name = norm_rope_case_name(16384, kv, index);
      if ((options.set != "full" && kv != index) || !selected(name)) continue;
      finish_case(name, run_norm_rope_case(16384, kv, index, stream, ceilings, &records));
    }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  for (int batch : {1, 4, 16, 64}) {
    if (options.set != "full" && (batch == 4 || batch == 16)) continue;
    // By the batch's name, as its records start, so that "^context parallel B=1" selects batch 1
    // (a bare "context parallel" check dropped every filter longer than that).
    if (!selected("context parallel B=" + std::to_string(batch) + " S=1M")) continue;
    double single_gpu_us = 0;
    const bool single_gpu_ran = finish_case(
        "context parallel", run_context_parallel_cases(batch, options.index_pages_in_order, stream,
                                                       ceilings, &records, &single_gpu_us));
#ifdef M3SA_HAVE_NCCL
    if (single_gpu_ran)
      for (int ranks = 2; ranks <= devices; ranks *= 2)
        finish_case("context parallel NCCL",
                    run_context_parallel_nccl(batch, ranks, single_gpu_us, ceilings, &records));
#else
    (void)single_gpu_ran;
#endif
  }
  print_table(records);
  bool json_written = true;
  if (!options.json_path.empty())
    json_written = write_json(options.json_path, run, ceilings, records, true);
  cudaStreamDestroy(stream);
  if (!json_written)
    std::fprintf(stderr, "m3sa bench: could not write %s\n", options.json_path.c_str());
  return failures || !json_written ? 1 : 0;
}

} // namespace m3sa::cli
#endif
