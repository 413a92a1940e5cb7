#pragma once
// `m3sa bench`: CUDA-event timings of the indexer ops on the visible GPU, each reported against a
// ceiling measured in the same run (device-to-device copy bandwidth, cuBLAS bf16 GEMM rate).
//   bench.cpp                    the driver: ceilings, then every case, then the output
//   bench_ceilings.cpp           copy bandwidth and the cuBLAS / cuBLASLt GEMM ceilings
//   bench_cases.cpp              the case table and the per-op runners
//   bench_context_parallel.cpp   the context-parallel decode cases (one GPU, and NCCL over many)
//   bench_timing.h               graph-capture and eager event timing, cold-L2 rotation (CUDA)
//   bench_output.cpp             the text table and the JSON records (nlohmann-json)
// This header is CUDA-free: the options, the records and the output.
#include <string>
#include <utility>
#include <vector>

namespace m3sa::cli {

struct BenchOptions {
  std::string set = "full"; // full | quick
  std::string json_path;    // also write JSON records here
  std::string filter;       // run only cases whose name contains this
  double kv_pool_gib = 8;   // cap of a decode attention case's K|V page pool (the peer's default)
  // Index-cache pages of the indexer and context-parallel cases: shuffled over the pool (the
  // peer's randperm) or in order (a fresh request's pages from an empty allocator).
  bool index_pages_in_order = false;
  // > 0: the indexer cases' plans sized for this many requests (at least the case's batch), as an
  // engine that plans once for its largest batch; 0: for the case's batch.
  int plan_requests = 0;
  std::string backend = "cuda"; // cuda | cpu (bench_cpu.cpp)
};

// 0: ran; 1: a case failed to run; 2: no CUDA backend or device.
int run_bench(const BenchOptions& options);
// The CPU backend's cases (bench_cpu.cpp): 0 ran, 1 a case failed.
int run_cpu_bench(const BenchOptions& options);
// Whether a case runs under --filter: names that contain it, or with "^text" names that start with
// "text".
bool name_selected(const std::string& filter, const std::string& name);

namespace bench {

struct Timing {
  double median_us = 0, cv = 0;
};
// Median and coefficient of variation of `us` (sorted in place; not empty).
Timing summarize(std::vector<double>& us);
// Today's date (UTC) as YYYY-MM-DD, for a run's records.
std::string iso_date();

struct Ceilings {
  double copy_gbps = 0, bf16_gemm_tflops = 0, fp8_gemm_tflops = 0;
};

// One timed (case, op).
struct Record {
  Record(std::string case_name, std::string op, Timing timing)
      : name(std::move(case_name)), mode(std::move(op)), t(timing) {}
  std::string name, mode;
  Timing t;
  double bytes = 0, flops = 0, fraction = 0;
  const char* ceiling = "";
  std::string note;           // derived figures (e.g. projected scaling), free text
  std::string implementation; // what make_plan picked ("cuda.sparse_attention.sm90"), or ""
};

// What the run measured on.
struct RunInfo {
  std::string device;
  int sm_count = 0;
  std::string commit, date;
};

// bench_output.cpp. Text to stdout: the header (device, commit, date, ceilings; a GEMM ceiling
// that could not be measured says so) and, after the cases, the markdown table.
void print_header(const RunInfo& run, const Ceilings& ceilings, bool have_bf16_gemm,
                  bool have_fp8_gemm);
void print_table(const std::vector<Record>& records);
// A progress line on stderr as each record is measured (`with_op`: the op column too).
void print_progress(const Record& record, bool with_op);
// The JSON document (schema of bench/results/h200/*.json: top-level device, sm_count, commit,
// date, complete, ceilings, records[] with device, commit, case, op, median_us, cv, bytes, flops,
// gbps, tflops, fraction_of_ceiling, ceiling, implementation, note), numbers rounded as the tables
// print them. `complete`: false while the run still has cases to measure.
std::string json_report(const RunInfo& run, const Ceilings& ceilings,
                        const std::vector<Record>& records, bool complete);
// json_report into `path`, written beside it and renamed over it, so that `path` always holds a
// whole document: the bench rewrites it after every case, and a run cut short (a device call's
// time limit) leaves the cases measured so far. False where the file cannot be written.
bool write_json(const std::string& path, const RunInfo& run, const Ceilings& ceilings,
                const std::vector<Record>& records, bool complete);

} // namespace bench
} // namespace m3sa::cli
