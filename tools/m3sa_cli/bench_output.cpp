#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "bench.h"

namespace m3sa::cli::bench {
namespace {

// `value` printed with `decimals` decimals and read back: the number the text shows, so the
// JSON holds the same values as the table (and as the files written before it).
double fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return std::strtod(text, nullptr);
}
// Byte and FLOP counts: whole numbers.
int64_t whole(double value) { return static_cast<int64_t>(fixed(value, 0)); }

double gbps(const Record& r) { return r.bytes / (r.t.median_us * 1e3); }
double tflops(const Record& r) { return r.flops / (r.t.median_us * 1e6); }

} // namespace

Timing summarize(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  double mean = 0, var = 0;
  for (double v : us) mean += v / us.size();
  for (double v : us) var += (v - mean) * (v - mean) / us.size();
  return {us[us.size() / 2], mean > 0 ? std::sqrt(var) / mean : 0};
}

std::string iso_date() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

void print_header(const RunInfo& run, const Ceilings& ceilings, bool have_bf16_gemm,
                  bool have_fp8_gemm) {
  const auto describe_gemm = [](bool measured, double tflops) {
    return measured ? std::to_string(static_cast<int>(tflops)) + " TFLOP/s"
                    : std::string("unavailable (library absent or refused)");
  };
  const std::string bf16_gemm = describe_gemm(have_bf16_gemm, ceilings.bf16_gemm_tflops);
  const std::string fp8_gemm = describe_gemm(have_fp8_gemm, ceilings.fp8_gemm_tflops);
  std::printf("# m3sa bench on %s (%d SMs), commit %s, %s\n\n", run.device.c_str(), run.sm_count,
              run.commit.c_str(), run.date.c_str());
  std::printf("ceilings measured in this run: device-to-device copy %.0f GB/s (read + write); "
              "cuBLAS bf16 GEMM 8192^3 %s; cuBLASLt e4m3 GEMM 8192^3 %s\n\n",
              ceilings.copy_gbps, bf16_gemm.c_str(), fp8_gemm.c_str());
}

void print_table(const std::vector<Record>& records) {
  std::printf("| case | op | median us | CV | GB/s | TFLOP/s | of ceiling | note "
              "|\n|---|---|---|---|---|---|---|---|\n");
  for (const Record& r : records) {
    char of_ceiling[64] = "-"; // a record judged against no ceiling (the CPU bench's compute cases)
    if (*r.ceiling)
      std::snprintf(of_ceiling, sizeof of_ceiling, "%.1f%% of %s", 100 * r.fraction, r.ceiling);
    std::printf("| %s | %s | %.2f | %.1f%% | %.0f | %.1f | %s | %s |\n", r.name.c_str(),
                r.mode.c_str(), r.t.median_us, 100 * r.t.cv, gbps(r), tflops(r), of_ceiling,
                r.note.c_str());
  }
}

void print_progress(const Record& r, bool with_op) {
  if (with_op)
    std::fprintf(stderr, "[m3sa bench] %-34s %-18s %10.2f us\n", r.name.c_str(), r.mode.c_str(),
                 r.t.median_us);
  else
    std::fprintf(stderr, "[m3sa bench] %-34s %10.2f us\n", r.name.c_str(), r.t.median_us);
}

std::string json_report(const RunInfo& run, const Ceilings& ceilings,
                        const std::vector<Record>& records, bool complete) {
  using Json = nlohmann::ordered_json; // keys in the order the schema lists them
  Json doc;
  doc["device"] = run.device;
  doc["sm_count"] = run.sm_count;
  doc["commit"] = run.commit;
  doc["date"] = run.date;
  doc["complete"] = complete;
  doc["ceilings"] = {{"copy_gbps", fixed(ceilings.copy_gbps, 1)},
                     {"bf16_gemm_tflops", fixed(ceilings.bf16_gemm_tflops, 1)},
                     {"fp8_gemm_tflops", fixed(ceilings.fp8_gemm_tflops, 1)}};
  Json rows = Json::array();
  for (const Record& r : records)
    rows.push_back({{"device", run.device},
                    {"commit", run.commit},
                    {"case", r.name},
                    {"op", r.mode},
                    {"median_us", fixed(r.t.median_us, 3)},
                    {"cv", fixed(r.t.cv, 4)},
                    {"bytes", whole(r.bytes)},
                    {"flops", whole(r.flops)},
                    {"gbps", fixed(gbps(r), 1)},
                    {"tflops", fixed(tflops(r), 2)},
                    {"fraction_of_ceiling", fixed(r.fraction, 4)},
                    {"ceiling", r.ceiling},
                    {"implementation", r.implementation},
                    {"note", r.note}});
  doc["records"] = std::move(rows);
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

bool write_json(const std::string& path, const RunInfo& run, const Ceilings& ceilings,
                const std::vector<Record>& records, bool complete) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    if (!out) return false;
    out << json_report(run, ceilings, records, complete);
    if (!out.flush()) return false;
  }
  return std::rename(partial.c_str(), path.c_str()) == 0;
}

} // namespace m3sa::cli::bench

namespace m3sa::cli {

bool name_selected(const std::string& filter, const std::string& name) {
  if (!filter.empty() && filter[0] == '^')
    return name.compare(0, filter.size() - 1, filter, 1) == 0;
  return name.find(filter) != std::string::npos;
}

} // namespace m3sa::cli
