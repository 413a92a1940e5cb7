// The CPU backend's row kernels (src/cpu/simd.h) against plain scalar code. (That its results do
// not depend on the thread count, which sizes its scoring's block ranges, is CpuThreads' test.)
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/simd.h"
#include "m3sa/numeric.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {
namespace {

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

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
TEST(CpuRowKernels, LoadRowWidensEveryE4m3CodeAsTheScalarConversion) {
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

TEST(CpuRowKernels, LoadRowWidensBf16AsTheScalarConversion) {
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

// Every register tile and remainder path (rows 1..17, keys 1..9) in both output layouts, against
// double-precision dots (fp32 sums over 128 terms: within 2^-17 of the sum of |terms|).
TEST(CpuRowKernels, DotRowsKeysMatchesDoubleDotsInBothLayouts) {
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
TEST(CpuRowKernels, WidenKeysTransposedIsLoadRowTransposed) {
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
TEST(CpuRowKernels, DotRowsTransposedKeysMatchesDoubleDots) {
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
TEST(CpuRowKernels, DotKeysQueriesInLanesMatchesDoubleDots) {
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
TEST(CpuRowKernels, MaxPropagatingNanIsTheLargestOrNan) {
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
TEST(CpuRowKernels, SoftmaxWeightsAreExpWithin2UlpAndSummedInKeyOrder) {
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

} // namespace
} // namespace m3sa::testing
