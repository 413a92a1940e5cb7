// The CPU backend's row kernels (src/cpu/simd.h) against plain scalar code, at every instruction
// set level this machine runs (portable SSE2 too, which an AVX2 or AVX-512 host never picks on its
// own), and AVX-512 against AVX2 bit for bit. (That the results do not depend on the thread count,
// which sizes the scoring's block ranges, is CpuThreads' test; the ops at each level,
// CpuSimdLevels'.)
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "m3sa/numeric.h"
#include "support/simd_levels.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {
namespace {

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// Each CpuRowKernels test runs once per level (named after it); a level above the CPU's skips.
class CpuRowKernels : public ::testing::TestWithParam<cpu::SimdLevel> {
protected:
  void SetUp() override {
    if (GetParam() > cpu::detected_simd_level())
      GTEST_SKIP() << "this CPU has no " << cpu::to_string(GetParam());
    level_.emplace(GetParam());
  }
  void TearDown() override { level_.reset(); }

private:
  std::optional<ScopedSimdLevel> level_;
};
INSTANTIATE_TEST_SUITE_P(Levels, CpuRowKernels,
                         ::testing::Values(cpu::SimdLevel::portable, cpu::SimdLevel::avx2,
                                           cpu::SimdLevel::avx512),
                         [](const auto& level) {
                           return std::string(cpu::to_string(level.param));
                         });

// A dot of 128 terms a[d * a_step] * b[d * b_step] in double, and the bound an fp32 sum of them in
// any order keeps to (2^-17 of the sum of |terms|).
struct DoubleDot {
  double value = 0, bound = 0;
};
DoubleDot double_dot(const float* a, int64_t a_step, const float* b, int64_t b_step) {
  DoubleDot dot;
  for (int d = 0; d < kHeadDim; ++d) {
    const double term = double{a[d * a_step]} * b[d * b_step];
    dot.value += term, dot.bound += std::fabs(term);
  }
  dot.bound *= 0x1p-17;
  return dot;
}

// load_row's widening equals the scalar conversion times the scale, bit for bit, for every e4m3
// code (subnormals, zeros of both signs, 0x7f / 0xff NaN) at each offset of a 128-wide row.
TEST_P(CpuRowKernels, LoadRowWidensEveryE4m3CodeAsTheScalarConversion) {
  for (float scale : {1.f, 0.5f, 3.f, 1e-3f, -2.f}) {
    for (int shift = 0; shift < 256; shift += 128) {
      uint8_t row[kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) row[d] = static_cast<uint8_t>(d + shift);
      float out[kHeadDim];
      cpu::load_row(DType::fp8_e4m3, row, scale, out);
      for (int d = 0; d < kHeadDim; ++d)
        ASSERT_EQ(bits_of(out[d]), bits_of(e4m3_bits_to_float(row[d]) * scale))
            << "code " << int{row[d]} << ", scale " << scale;
    }
  }
}

TEST_P(CpuRowKernels, LoadRowWidensBf16AsTheScalarConversion) {
  Rng rng(11);
  for (float scale : {1.f, 0.25f, 7.f}) {
    uint16_t row[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) row[d] = static_cast<uint16_t>(rng.next());
    row[0] = 0x7fc0, row[1] = 0xff80, row[2] = 0x0001, row[3] = 0x8000; // NaN, -inf, subnormal, -0
    float out[kHeadDim];
    cpu::load_row(DType::bf16, row, scale, out);
    for (int d = 0; d < kHeadDim; ++d)
      ASSERT_EQ(bits_of(out[d]), bits_of(bf16_bits_to_float(row[d]) * scale)) << "bits " << row[d];
  }
}

// load_rows is load_row on each of its strided rows, bit for bit, with or without the next rows
// to prefetch, and writes nothing past its count.
TEST_P(CpuRowKernels, LoadRowsIsLoadRowOnEachStridedRow) {
  Rng rng(20);
  for (DType dtype : {DType::bf16, DType::fp8_e4m3, DType::f32})
    for (int count : {0, 1, 5, 128}) {
      const int64_t stride = kHeadDim * static_cast<int64_t>(dtype_size(dtype)) + 64;
      std::vector<uint8_t> bytes(stride * 2 * kBlockTokens);
      for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng.next());
      for (const void* prefetch : {static_cast<const void*>(nullptr),
                                   static_cast<const void*>(bytes.data() + stride * count)}) {
        std::vector<float> out((count + 1) * kHeadDim, NAN), row(kHeadDim);
        cpu::load_rows(dtype, bytes.data(), stride, count, 0.5f, out.data(), prefetch);
        for (int j = 0; j < count; ++j) {
          cpu::load_row(dtype, bytes.data() + j * stride, 0.5f, row.data());
          for (int d = 0; d < kHeadDim; ++d)
            ASSERT_TRUE(bits_of(out[j * kHeadDim + d]) == bits_of(row[d]) ||
                        (std::isnan(out[j * kHeadDim + d]) && std::isnan(row[d])))
                << to_string(dtype) << ", row " << j << " dim " << d;
        }
        for (int d = 0; d < kHeadDim; ++d) ASSERT_TRUE(std::isnan(out[count * kHeadDim + d]));
      }
    }
}

// Every register tile and remainder path (rows 1..17, keys 1..9) in both output layouts, against
// double-precision dots (fp32 sums over 128 terms: within 2^-17 of the sum of |terms|).
TEST_P(CpuRowKernels, DotRowsKeysMatchesDoubleDotsInBothLayouts) {
  Rng rng(12);
  for (int num_rows = 1; num_rows <= 17; ++num_rows)
    for (int num_keys = 1; num_keys <= 9; ++num_keys) {
      std::vector<float> rows(num_rows * kHeadDim), keys(num_keys * kHeadDim);
      for (float& v : rows) v = static_cast<float>(rng.uniform() * 4 - 2);
      for (float& v : keys) v = static_cast<float>(rng.uniform() * 4 - 2);
      std::vector<float> key_major(num_rows * num_keys, NAN), row_major(num_rows * num_keys, NAN);
      cpu::dot_rows_keys(rows.data(), num_rows, keys.data(), num_keys,
                         {key_major.data(), 1, num_rows});
      cpu::dot_rows_keys(rows.data(), num_rows, keys.data(), num_keys,
                         {row_major.data(), num_keys, 1});
      for (int i = 0; i < num_rows; ++i)
        for (int j = 0; j < num_keys; ++j) {
          const DoubleDot dot =
              double_dot(rows.data() + i * kHeadDim, 1, keys.data() + j * kHeadDim, 1);
          EXPECT_NEAR(key_major[j * num_rows + i], dot.value, dot.bound) << i << ", " << j;
          EXPECT_EQ(bits_of(row_major[i * num_keys + j]), bits_of(key_major[j * num_rows + i]));
        }
    }
}

// The transposed widening: out[d][j] is load_row's value of key j at dim d, bit for bit, for every
// dtype and key count (every 8-key group, the 16-key padding with zeros), keys strided apart.
TEST_P(CpuRowKernels, WidenKeysTransposedIsLoadRowTransposed) {
  Rng rng(15);
  std::vector<float> out(kBlockTokens * kHeadDim), rows8(8 * kHeadDim), row(kHeadDim);
  for (DType dtype : {DType::bf16, DType::fp8_e4m3, DType::f32})
    for (int num_keys : {1, 7, 8, 9, 15, 16, 17, 63, 100, 127, 128}) {
      const int64_t key_stride = kHeadDim * static_cast<int64_t>(dtype_size(dtype)) + 32;
      std::vector<uint8_t> keys(key_stride * num_keys);
      for (uint8_t& byte : keys) byte = static_cast<uint8_t>(rng.next());
      std::fill(out.begin(), out.end(), NAN);
      cpu::widen_keys_transposed(dtype, keys.data(), key_stride, num_keys, out.data(),
                                 rows8.data());
      const int padded = (num_keys + 15) / 16 * 16;
      for (int j = 0; j < padded; ++j) {
        if (j < num_keys) cpu::load_row(dtype, keys.data() + j * key_stride, 1.f, row.data());
        for (int d = 0; d < kHeadDim; ++d) {
          const float want = j < num_keys ? row[d] : 0.f;
          const float got = out[d * kBlockTokens + j];
          ASSERT_TRUE(bits_of(got) == bits_of(want) || (std::isnan(got) && std::isnan(want)))
              << to_string(dtype) << ", " << num_keys << " keys: key " << j << " dim " << d;
        }
      }
      for (int d = 0; d < kHeadDim; ++d) // nothing past the padding
        for (int j = padded; j < kBlockTokens; ++j)
          ASSERT_TRUE(std::isnan(out[d * kBlockTokens + j])) << d << ", " << j;
    }
}

// The keys-in-lanes dots for every row tile and remainder (rows 1..9, and 64) and key count (16 ..
// 128), against double-precision dots (one fp32 sum of 128 products: within 2^-17 of the sum of
// |terms|); nothing written past num_keys.
TEST_P(CpuRowKernels, DotRowsTransposedKeysMatchesDoubleDots) {
  Rng rng(16);
  std::vector<float> keys_t(kBlockTokens * kHeadDim);
  for (float& v : keys_t) v = static_cast<float>(rng.uniform() * 4 - 2);
  for (int num_rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 64})
    for (int num_keys = 16; num_keys <= kBlockTokens; num_keys += 16) {
      std::vector<float> rows(num_rows * kHeadDim);
      for (float& v : rows) v = static_cast<float>(rng.uniform() * 4 - 2);
      const int64_t out_stride = kBlockTokens;
      std::vector<float> out(num_rows * out_stride, NAN);
      cpu::dot_rows_transposed_keys(rows.data(), num_rows, keys_t.data(), num_keys, out.data(),
                                    out_stride);
      for (int i = 0; i < num_rows; ++i) {
        for (int j = 0; j < num_keys; ++j) {
          const DoubleDot dot =
              double_dot(rows.data() + i * kHeadDim, 1, keys_t.data() + j, kBlockTokens);
          ASSERT_NEAR(out[i * out_stride + j], dot.value, dot.bound)
              << num_rows << " rows, " << num_keys << " keys: " << i << ", " << j;
        }
        for (int j = num_keys; j < out_stride; ++j)
          ASSERT_TRUE(std::isnan(out[i * out_stride + j])) << i << ", " << j;
      }
    }
}

// The attention's logits with the queries in lanes, for groups of 8 and 16 and every key tile and
// remainder (1..17 keys), against double-precision dots; each key's group of logits side by side.
TEST_P(CpuRowKernels, DotKeysQueriesInLanesMatchesDoubleDots) {
  Rng rng(17);
  for (int group : {8, 16})
    for (int num_keys = 1; num_keys <= 17; ++num_keys) {
      std::vector<float> queries(group * kHeadDim), queries_t(group * kHeadDim),
          keys(num_keys * kHeadDim), out(num_keys * group + 8, NAN);
      for (float& v : queries) v = static_cast<float>(rng.uniform() * 4 - 2);
      for (float& v : keys) v = static_cast<float>(rng.uniform() * 4 - 2);
      for (int i = 0; i < group; ++i)
        for (int d = 0; d < kHeadDim; ++d) queries_t[d * group + i] = queries[i * kHeadDim + d];
      cpu::dot_keys_queries_in_lanes(queries_t.data(), group, keys.data(), num_keys, out.data());
      for (int j = 0; j < num_keys; ++j)
        for (int i = 0; i < group; ++i) {
          const DoubleDot dot =
              double_dot(queries.data() + i * kHeadDim, 1, keys.data() + j * kHeadDim, 1);
          ASSERT_NEAR(out[j * group + i], dot.value, dot.bound)
              << "group " << group << ", " << num_keys << " keys: key " << j << " row " << i;
        }
      for (int k = num_keys * group; k < num_keys * group + 8; ++k)
        ASSERT_TRUE(std::isnan(out[k])) << "written past the keys: " << k;
    }
}

// The block maximum: the largest value, NaN wherever one is (in the vector part or the tail),
// -inf for none.
TEST_P(CpuRowKernels, MaxPropagatingNanIsTheLargestOrNan) {
  Rng rng(13);
  EXPECT_EQ(cpu::max_propagating_nan(nullptr, 0), -std::numeric_limits<float>::infinity());
  for (int count = 1; count <= 40; ++count) {
    std::vector<float> values(count);
    for (float& v : values) v = static_cast<float>(rng.uniform() * 8 - 6);
    float want = values[0];
    for (float v : values) want = std::max(want, v);
    EXPECT_EQ(cpu::max_propagating_nan(values.data(), count), want) << count;
    std::vector<float> all_low(count, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(cpu::max_propagating_nan(all_low.data(), count),
              -std::numeric_limits<float>::infinity());
    for (int at = 0; at < count; ++at) {
      std::vector<float> with_nan = values;
      with_nan[at] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(cpu::max_propagating_nan(with_nan.data(), count)))
          << count << ", NaN at " << at;
    }
  }
}

// Softmax weights for every GQA group size (the vector path where 8 and the group divide, std::exp
// otherwise): each within 2 ulp of std::exp of (logit - max) where that is a normal float, 0 or
// below 2^-126 where it is not, NaN for NaN; the denominators the weights' sums in key order.
TEST_P(CpuRowKernels, SoftmaxWeightsAreExpWithin2UlpAndSummedInKeyOrder) {
  Rng rng(14);
  for (int group = 1; group <= kMaxGqaGroup; ++group)
    for (int64_t num_keys : {1, 7, 64, 333}) {
      std::vector<float> logits(num_keys * group), max_logit(group, -INFINITY);
      for (float& v : logits) v = static_cast<float>(rng.uniform() * 120 - 110);
      logits[0] = std::numeric_limits<float>::quiet_NaN(); // head 0's first key
      for (int64_t n = 0; n < num_keys; ++n)
        for (int h = 0; h < group; ++h)
          max_logit[h] = std::max(max_logit[h], logits[n * group + h]);
      std::vector<float> weights = logits, denominator(group, NAN);
      cpu::softmax_weights(weights.data(), num_keys, group, max_logit.data(), denominator.data());
      for (int64_t i = 0; i < num_keys * group; ++i) {
        const float want = std::exp(logits[i] - max_logit[i % group]);
        SCOPED_TRACE("group " + std::to_string(group) + ", value " + std::to_string(i));
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(weights[i]));
        } else if (want < std::numeric_limits<float>::min()) {
          EXPECT_LT(weights[i], std::numeric_limits<float>::min());
          EXPECT_GE(weights[i], 0.f);
        } else {
          EXPECT_LE(std::abs(static_cast<int64_t>(bits_of(weights[i])) - bits_of(want)), 2);
        }
      }
      for (int h = 0; h < group; ++h) {
        float sum = 0.f;
        for (int64_t n = 0; n < num_keys; ++n) sum += weights[n * group + h];
        EXPECT_EQ(bits_of(denominator[h]), bits_of(sum)) << "head " << h;
      }
    }
}

// The weighted value sums for every row tile and remainder (rows 1..5, 16) and value count
// (0..9, 130), weights strided apart: each output the fp32 sum of the accumulator's start and the
// value rows' products in order (within 2^-17 of the sum of |terms|), nothing past the rows.
TEST_P(CpuRowKernels, AccumulateWeightedRowsMatchesDoubleSums) {
  Rng rng(18);
  for (int num_rows : {1, 2, 3, 4, 5, 16})
    for (int num_values : {0, 1, 2, 3, 8, 9, 130}) {
      const int64_t weight_stride = num_rows + 3;
      std::vector<float> values(num_values * kHeadDim), weights(num_values * weight_stride),
          acc((num_rows + 1) * kHeadDim, NAN);
      for (float& v : values) v = static_cast<float>(rng.uniform() * 4 - 2);
      for (float& w : weights) w = static_cast<float>(rng.uniform());
      for (int k = 0; k < num_rows * kHeadDim; ++k)
        acc[k] = static_cast<float>(rng.uniform() - 0.5);
      const std::vector<float> start = acc;
      cpu::accumulate_weighted_rows(acc.data(), num_rows, weights.data(), weight_stride,
                                    values.data(), num_values);
      for (int i = 0; i < num_rows; ++i)
        for (int d = 0; d < kHeadDim; ++d) {
          double want = start[i * kHeadDim + d], bound = std::fabs(want);
          for (int n = 0; n < num_values; ++n) {
            const double term = double{weights[n * weight_stride + i]} * values[n * kHeadDim + d];
            want += term, bound += std::fabs(term);
          }
          ASSERT_NEAR(acc[i * kHeadDim + d], want, bound * 0x1p-17)
              << num_rows << " rows, " << num_values << " values: " << i << ", " << d;
        }
      for (int d = 0; d < kHeadDim; ++d) // the row after the last untouched
        ASSERT_TRUE(std::isnan(acc[num_rows * kHeadDim + d])) << d;
    }
}

TEST(CpuSimdLevels, TheCapChoosesTheLevelUpToTheDetectedOne) {
  EXPECT_STREQ(cpu::to_string(cpu::SimdLevel::portable), "portable");
  EXPECT_STREQ(cpu::to_string(cpu::SimdLevel::avx2), "avx2");
  EXPECT_STREQ(cpu::to_string(cpu::SimdLevel::avx512), "avx512");
  const cpu::SimdLevel detected = cpu::detected_simd_level();
  for (cpu::SimdLevel cap :
       {cpu::SimdLevel::portable, cpu::SimdLevel::avx2, cpu::SimdLevel::avx512}) {
    ScopedSimdLevel scope(cap);
    EXPECT_EQ(cpu::simd_level(), std::min(cap, detected)) << cpu::to_string(cap);
  }
  EXPECT_EQ(cpu::simd_level_cap_named("portable"), cpu::SimdLevel::portable);
  EXPECT_EQ(cpu::simd_level_cap_named("avx2"), cpu::SimdLevel::avx2);
  EXPECT_EQ(cpu::simd_level_cap_named("avx512"), cpu::SimdLevel::avx512);
  EXPECT_EQ(cpu::simd_level_cap_named(nullptr), cpu::SimdLevel::avx512);
  EXPECT_EQ(cpu::simd_level_cap_named("AVX2"), cpu::SimdLevel::avx512); // unknown: no cap
  EXPECT_EQ(cpu::simd_level_cap_named(""), cpu::SimdLevel::avx512);
}

// The detected level against the flags Linux lists for the CPU (which it clears where the OS
// does not save the registers' state): a detection that missed AVX-512 or AVX2 would leave the
// backend on narrower kernels without any other test noticing.
TEST(CpuSimdLevels, DetectionFindsTheInstructionSetsLinuxLists) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && line.rfind("flags", 0) != 0) {
  }
  if (line.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  std::istringstream words(line);
  std::set<std::string> flags{std::istream_iterator<std::string>(words), {}};
  const auto has = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return flags.count(n); });
  };
  const bool avx2 = has({"avx2", "fma"});
  const cpu::SimdLevel want =
      avx2 && has({"avx512f", "avx512bw", "avx512dq", "avx512vl"}) ? cpu::SimdLevel::avx512
      : avx2                                                        ? cpu::SimdLevel::avx2
                                                                    : cpu::SimdLevel::portable;
  EXPECT_EQ(cpu::to_string(cpu::detected_simd_level()), std::string(cpu::to_string(want)));
}

// AVX-512 carries 16 lanes of the same FMA chains that AVX2 carries 8 of: every kernel gives the
// same bits at both levels, on random data through every tile and remainder path.
TEST(CpuSimdLevels, Avx512KernelsGiveAvx2sBits) {
  if (cpu::detected_simd_level() < cpu::SimdLevel::avx512) GTEST_SKIP() << "no AVX-512 here";
  Rng rng(19);
  const auto random = [&](size_t count, double low, double high) {
    std::vector<float> v(count);
    for (float& x : v) x = static_cast<float>(low + rng.uniform() * (high - low));
    return v;
  };
  // Runs `kernel(out)` at both levels on copies of `initial` and compares the bytes.
  const auto same_at_both = [](const std::vector<float>& initial, const auto& kernel) {
    std::vector<float> at[2] = {initial, initial};
    for (int k = 0; k < 2; ++k) {
      ScopedSimdLevel scope(k == 0 ? cpu::SimdLevel::avx2 : cpu::SimdLevel::avx512);
      kernel(at[k].data());
    }
    return std::memcmp(at[0].data(), at[1].data(), at[0].size() * sizeof(float)) == 0;
  };
  const std::vector<float> keys_t = random(kBlockTokens * kHeadDim, -2, 2);
  for (int num_rows : {1, 2, 3, 4, 7, 8, 9, 15, 64}) {
    const std::vector<float> rows = random(num_rows * kHeadDim, -2, 2);
    for (int num_keys = 16; num_keys <= kBlockTokens; num_keys += 16)
      EXPECT_TRUE(same_at_both(std::vector<float>(num_rows * kBlockTokens, NAN), [&](float* out) {
        cpu::dot_rows_transposed_keys(rows.data(), num_rows, keys_t.data(), num_keys, out,
                                      kBlockTokens);
      })) << "dot_rows_transposed_keys, " << num_rows << " rows, " << num_keys << " keys";
    for (int num_keys : {1, 3, 4, 5, 128})
      EXPECT_TRUE(same_at_both(std::vector<float>(num_rows * num_keys, NAN), [&](float* out) {
        cpu::dot_rows_keys(rows.data(), num_rows, keys_t.data(), num_keys, {out, num_keys, 1});
      })) << "dot_rows_keys, " << num_rows << " rows, " << num_keys << " keys";
  }
  for (int group : {8, 16}) {
    const std::vector<float> queries_t = random(group * kHeadDim, -2, 2);
    for (int num_keys : {1, 4, 7, 8, 9, 17, 128})
      EXPECT_TRUE(same_at_both(std::vector<float>(num_keys * group, NAN), [&](float* out) {
        cpu::dot_keys_queries_in_lanes(queries_t.data(), group, keys_t.data(), num_keys, out);
      })) << "dot_keys_queries_in_lanes, group " << group << ", " << num_keys << " keys";
  }
  for (int group = 1; group <= kMaxGqaGroup; ++group)
    for (int64_t num_keys : {1, 3, 7, 64, 333}) {
      // The weights, then the group's denominators after them.
      const std::vector<float> logits = random(num_keys * group + group, -110, 10);
      const std::vector<float> max_logit = random(group, 0, 10);
      EXPECT_TRUE(same_at_both(logits, [&](float* values) {
        cpu::softmax_weights(values, num_keys, group, max_logit.data(), values + num_keys * group);
      })) << "softmax_weights, group " << group << ", " << num_keys << " keys";
    }
  for (int num_rows : {1, 2, 3, 16})
    for (int num_values : {1, 5, 130}) {
      const std::vector<float> weights = random(num_values * num_rows, 0, 1);
      const std::vector<float> values = random(num_values * kHeadDim, -2, 2);
      EXPECT_TRUE(same_at_both(random(num_rows * kHeadDim, -1, 1), [&](float* acc) {
        cpu::accumulate_weighted_rows(acc, num_rows, weights.data(), num_rows, values.data(),
                                      num_values);
      })) << "accumulate_weighted_rows, " << num_rows << " rows, " << num_values << " values";
    }
  for (int count : {1, 15, 16, 17, 33, 128}) {
    const std::vector<float> values = random(count, -5, 5);
    EXPECT_TRUE(same_at_both({0.f}, [&](float* out) {
      *out = cpu::max_propagating_nan(values.data(), count);
    })) << "max_propagating_nan, " << count;
  }
}

} // namespace
} // namespace m3sa::testing
