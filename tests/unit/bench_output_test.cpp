// m3sa bench's JSON records (tools/m3sa_cli/bench_output.cpp): the schema the committed
// bench/results files follow, numbers rounded as the table prints them, and the rewrite after every
// case - a whole document at the path at all times, marked complete only by the last write - so
// that a run cut short by a device call's time limit keeps what it measured.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"

namespace m3sa::cli::bench {
namespace {

nlohmann::ordered_json read_document(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::ordered_json::parse(in);
}

Record record(const std::string& name, double median_us, double bytes, double fraction) {
  Record r(name, "index_topk", Timing{median_us, 0.00456});
  r.bytes = bytes, r.fraction = fraction, r.ceiling = "copy";
  r.implementation = "cuda.index_topk.sm90";
  return r;
}

TEST(BenchOutput, RecordsAreRewrittenWholeAfterEveryCase) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("m3sa_bench_output_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "decode.json").string();
  const RunInfo run{"NVIDIA H200", 132, "4a7dbfd492ab", "2026-12-03"};
  const Ceilings ceilings{4262.31, 806.24, 1493.0};
  std::vector<Record> records{record("decode bf16 B=1 S=8K H=1", 8.12345, 2097152, 0.061234)};

  ASSERT_TRUE(write_json(path, run, ceilings, records, false));
  auto doc = read_document(path);
  std::vector<std::string> keys;
  for (const auto& item : doc.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"device", "sm_count", "commit", "date", "complete",
                                            "ceilings", "records"}));
  EXPECT_FALSE(doc["complete"].get<bool>());
  EXPECT_EQ(doc["sm_count"].get<int>(), 132);
  EXPECT_DOUBLE_EQ(doc["ceilings"]["copy_gbps"].get<double>(), 4262.3);
  ASSERT_EQ(doc["records"].size(), 1u);
  const auto& first = doc["records"][0];
  EXPECT_EQ(first["case"], "decode bf16 B=1 S=8K H=1");
  EXPECT_EQ(first["op"], "index_topk");
  EXPECT_EQ(first["commit"], "4a7dbfd492ab");
  EXPECT_DOUBLE_EQ(first["median_us"].get<double>(), 8.123); // 3 decimals, as printed
  EXPECT_DOUBLE_EQ(first["cv"].get<double>(), 0.0046);
  EXPECT_EQ(first["bytes"].get<int64_t>(), 2097152);
  EXPECT_DOUBLE_EQ(first["gbps"].get<double>(), 258.2); // 2097152 B / 8.12345 us
  EXPECT_DOUBLE_EQ(first["fraction_of_ceiling"].get<double>(), 0.0612);
  EXPECT_EQ(first["ceiling"], "copy");
  EXPECT_EQ(first["implementation"], "cuda.index_topk.sm90");

  // The next case: the same path now holds both records, complete, and no scratch file is left.
  records.push_back(record("decode fp8 B=1 S=8K H=1", 7.5, 1048576, 0.0333));
  ASSERT_TRUE(write_json(path, run, ceilings, records, true));
  doc = read_document(path);
  EXPECT_TRUE(doc["complete"].get<bool>());
  ASSERT_EQ(doc["records"].size(), 2u);
  EXPECT_EQ(doc["records"][1]["case"], "decode fp8 B=1 S=8K H=1");
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  // A directory that does not exist: false, and nothing written.
  const std::string missing = (dir / "absent" / "decode.json").string();
  EXPECT_FALSE(write_json(missing, run, ceilings, records, true));
  EXPECT_FALSE(std::filesystem::exists(missing));
  std::filesystem::remove_all(dir);
}

} // namespace
} // namespace m3sa::cli::bench
