#pragma once
// `m3sa bench`: CUDA-event timings of the indexer ops on the visible GPU, each reported against a
// ceiling measured in the same run (device-to-device copy bandwidth, cuBLAS bf16 GEMM rate).
#include <string>

namespace m3sa::cli {

struct BenchOptions {
  std::string set = "full"; // full | quick
  std::string json_path;    // also write JSON records here
  std::string filter;       // run only cases whose name contains this
};

// 0: ran; 1: a case failed to run; 2: no CUDA backend or device.
int run_bench(const BenchOptions& options);

} // namespace m3sa::cli
