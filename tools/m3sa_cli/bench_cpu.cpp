// `m3sa bench --backend cpu`: the CPU backend's index_topk and sparse_attention on decode and
// prefill batches, wall-clock medians. Decode scoring streams each request's whole index cache,
// so it is judged against the host's read bandwidth measured in the same run (every thread
// summing its slice of a 1 GiB buffer); everything else does ~30 FLOP a byte read (16 query heads
// a K / V row, or a tile's rows a key block) and reports GFLOP/s in the note. The device names the
// row kernels' instruction set (src/cpu/simd.h). CUDA-free: built in every configuration.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "common/check.h"
#include "cpu/simd.h"
#include "m3sa/m3sa.h"
#include "testing/host_tensor.h"
#include "testing/run_ops.h"
#include "testing/synthetic_batch.h"

namespace m3sa::cli {
namespace {

using namespace bench;
using testing::HostTensor;
using testing::SyntheticBatch;
using Clock = std::chrono::steady_clock;

constexpr int kRuns = 7; // timed after one warm-up run

// Median and coefficient of variation of kRuns calls of fn, in microseconds.
template <typename Fn> Timing time_runs(Fn&& fn) {
  fn();
  std::vector<double> us(kRuns);
  for (double& t : us) {
    const auto start = Clock::now();
    fn();
    t = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  return summarize(us);
}

// GB/s of all threads reading their slices of a 1 GiB buffer (the best of 5 passes).
double host_read_gbps() {
  const size_t count = (size_t{1} << 30) / sizeof(float);
  std::vector<float> buffer(count, 1.f);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = Clock::now();
    float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (size_t i = 0; i < count; i += 16) total += buffer[i]; // one load a 64-byte line
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (total != static_cast<float>(count / 16)) return 0; // keeps the reads
    best = std::max(best, static_cast<double>(count * sizeof(float)) / seconds / 1e9);
  }
  return best;
}

std::string tokens(int64_t n) {
  return n % 1024 == 0 ? std::to_string(n / 1024) + "K" : std::to_string(n);
}

struct CpuCase {
  std::string name;
  testing::BatchSpec spec;
  bool decode;
};

std::vector<CpuCase> cpu_cases(const std::string& set) {
  std::vector<CpuCase> cases;
  const auto decode = [&](DType dtype, int batch, int32_t context) {
    testing::BatchSpec s;
    s.q_lens.assign(batch, 1), s.seq_lens.assign(batch, context);
    s.num_decode = batch;
    s.index_heads = 4, s.q_heads = 64, s.kv_heads = 4;
    s.index_dtype = s.kv_dtype = dtype;
    s.seed = 7;
    cases.push_back({std::string("cpu decode ") + to_string(dtype) + " B=" + std::to_string(batch) +
                         " S=" + tokens(context) + " H=4 64/4",
                     s, true});
  };
  const auto prefill = [&](DType dtype, int32_t chunk, int32_t context) {
    testing::BatchSpec s;
    s.q_lens = {chunk}, s.seq_lens = {context};
    s.index_heads = 4, s.q_heads = 64, s.kv_heads = 4;
    s.index_dtype = s.kv_dtype = dtype;
    s.seed = 8;
    cases.push_back({std::string("cpu prefill ") + to_string(dtype) + " C=" + tokens(chunk) +
                         " S=" + tokens(context) + " H=4 64/4",
                     s, false});
  };
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    decode(dtype, 1, 131072);
    decode(dtype, 16, 32768);
    if (set == "full") decode(dtype, 64, 8192);
    prefill(dtype, set == "full" ? 2048 : 512, 32768);
  }
  return cases;
}

Status run_cpu_case(const CpuCase& c, const Ceilings& ceilings, std::vector<Record>* records) {
  SyntheticBatch sb(c.spec);
  M3SA_RETURN_IF_ERROR(sb.status());
  sb.fill_index_random(c.spec.seed + 1);
  sb.fill_attention_random(c.spec.seed + 2);
  MsaConfig config;
  config.num_index_heads = c.spec.index_heads;
  const testing::RunOptions options{Backend::cpu};

  testing::PlannedOp index(testing::plan_request(OpKind::index_topk, config, sb, options));
  M3SA_RETURN_IF_ERROR(index.status);
  HostTensor topk(DType::i32, {c.spec.index_heads, sb.num_tokens(), config.top_k});
  const IndexTopkArgs index_args{sb.index_q.view(), sb.index_k_cache.view(), sb.batch(),
                                 topk.view()};
  Status status;
  Record index_record(c.name, "index_topk", time_runs([&] {
                        if (status.ok())
                          status = index_topk(index.plan, index_args, index.workspace());
                      }));
  M3SA_RETURN_IF_ERROR(status);

  testing::PlannedOp attention(
      testing::plan_request(OpKind::sparse_attention, config, sb, options));
  M3SA_RETURN_IF_ERROR(attention.status);
  HostTensor out(DType::bf16, {sb.num_tokens(), c.spec.q_heads, kHeadDim});
  HostTensor lse(DType::f32, {sb.num_tokens(), c.spec.q_heads});
  const SparseAttentionArgs attention_args = testing::attention_args(sb, topk, out, lse, true);
  Record attention_record(c.name, "sparse_attention", time_runs([&] {
                            if (status.ok())
                              status = sparse_attention(attention.plan, attention_args,
                                                        attention.workspace());
                          }));
  M3SA_RETURN_IF_ERROR(status);

  // Bytes each op reads at least and the FLOPs it does: decode scoring each request's whole index
  // cache, attention the selected keys' K and V rows (once a KV head).
  const double row_bytes = kHeadDim * static_cast<double>(dtype_size(c.spec.kv_dtype));
  double keys = 0, scored = 0; // attended (token, KV head, key) and scored (token, key) pairs
  const int32_t* ids = topk.data<int32_t>();
  for (int64_t t = 0; t < sb.num_tokens(); ++t) {
    const int64_t position = sb.position(t);
    scored += static_cast<double>(position + 1);
    for (int g = 0; g < c.spec.kv_heads; ++g)
      for (int k = 0; k < config.top_k; ++k) {
        const int32_t b = ids[(int64_t{g} * sb.num_tokens() + t) * config.top_k + k];
        if (b >= 0) keys += static_cast<double>(std::min<int64_t>(128, position - b * 128 + 1));
      }
  }
  const double group = static_cast<double>(c.spec.q_heads) / c.spec.kv_heads;
  if (c.decode) {
    double index_bytes = 0;
    for (int32_t len : c.spec.seq_lens)
      index_bytes += static_cast<double>(len) * kHeadDim * dtype_size(c.spec.index_dtype);
    index_record.bytes = index_bytes;
  }
  index_record.flops = 2.0 * scored * kHeadDim * c.spec.index_heads;
  attention_record.bytes = keys * 2 * row_bytes;
  attention_record.flops = 4.0 * keys * group * kHeadDim;
  for (Record* r : {&index_record, &attention_record}) {
    r->implementation = "cpu." + r->mode;
    char note[64];
    std::snprintf(note, sizeof note, "%.1f GFLOP/s", r->flops / (r->t.median_us * 1e3));
    r->note = note;
    if (c.decode && r == &index_record) {
      r->fraction = r->bytes / (r->t.median_us * 1e3) / ceilings.copy_gbps;
      r->ceiling = "host read";
    }
    print_progress(*r, true);
    records->push_back(*r);
  }
  return {};
}

} // namespace

int run_cpu_bench(const BenchOptions& options) {
  // The row kernels' instruction set is part of what was timed (M3SA_CPU_MAX_ISA may cap it).
  const RunInfo run{"CPU, " + std::to_string(omp_get_max_threads()) + " threads, " +
                        cpu::to_string(cpu::simd_level()),
                    0, build_commit(), iso_date()};
  Ceilings ceilings;
  ceilings.copy_gbps = host_read_gbps();
  std::printf("# m3sa bench --backend cpu on %s, commit %s, %s\n\nceiling measured in this run: "
              "host read %.1f GB/s (every thread summing its slice of 1 GiB)\n\n",
              run.device.c_str(), run.commit.c_str(), run.date.c_str(), ceilings.copy_gbps);
  std::vector<Record> records;
  int failures = 0;
  for (const CpuCase& c : cpu_cases(options.set)) {
    if (!name_selected(options.filter, c.name)) continue;
    const Status s = run_cpu_case(c, ceilings, &records);
    if (!s.ok()) {
      std::fprintf(stderr, "m3sa bench: %s: %s\n", c.name.c_str(), s.to_string().c_str());
      ++failures;
    }
    if (!options.json_path.empty()) write_json(options.json_path, run, ceilings, records, false);
  }
  print_table(records);
  const bool written =
      options.json_path.empty() || write_json(options.json_path, run, ceilings, records, true);
  return failures || !written ? 1 : 0;
}

} // namespace m3sa::cli
