// PreparedDivisor (cuda/prepared_divisor.h), the multiply-high quotient the SM90 decode indexer
// prepares before its PDL wait, against `/` on the host: every divisor up to 2^12 with numerators
// around each of its multiples, the edges of the 31-bit range, and random pairs of every
// magnitude. The device form differs only in __umulhi / __clz for the host's 64-bit product and
// __builtin_clz; the GPU decode indexer tests run it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/prepared_divisor.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {
namespace {

using cuda::PreparedDivisor;

constexpr int kMaxInt = 0x7fffffff;

// Numerators where a quotient changes or the product is largest: around 0, around multiples of
// d (k d - 1, k d, k d + 1 for small k and for k near the top), and the largest n.
std::vector<int> numerators_near_multiples(int d) {
  std::vector<int> n;
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{kMaxInt} / d - 1,
                    int64_t{kMaxInt} / d})
    for (int64_t delta = -1; delta <= 1; ++delta) {
      const int64_t v = k * d + delta;
      if (v >= 0 && v <= kMaxInt) n.push_back(static_cast<int>(v));
    }
  n.push_back(kMaxInt);
  n.push_back(kMaxInt - 1);
  return n;
}

TEST(PreparedDivisor, EqualsDivisionForEveryDivisorUpTo4096NearItsMultiples) {
  for (int d = 1; d <= 4096; ++d) {
    const PreparedDivisor prepared(d);
    for (int n = 0; n < 3 * d + 2; ++n) ASSERT_EQ(prepared.quotient(n), n / d) << n << " / " << d;
    for (int n : numerators_near_multiples(d))
      ASSERT_EQ(prepared.quotient(n), n / d) << n << " / " << d;
  }
}

TEST(PreparedDivisor, EqualsDivisionAtTheEdgesOfTheRange) {
  std::vector<int> divisors = {kMaxInt, kMaxInt - 1, (1 << 30) + 1, 1 << 30, (1 << 30) - 1};
  for (int e = 12; e < 31; ++e)
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << e) + delta);
  for (int d : divisors) {
    const PreparedDivisor prepared(d);
    for (int n : numerators_near_multiples(d))
      ASSERT_EQ(prepared.quotient(n), n / d) << n << " / " << d;
  }
}

TEST(PreparedDivisor, EqualsDivisionOnRandomPairsOfEveryMagnitude) {
  std::mt19937_64 rng(test_seed());
  for (int i = 0; i < 2'000'000; ++i) {
    // Magnitudes drawn uniformly in bits, so that small divisors (the kernels' splits, shard
    // counts and index heads) are as common as large ones.
    const int d_bits = 1 + static_cast<int>(rng() % 31), n_bits = 1 + static_cast<int>(rng() % 31);
    const int d = std::max(1, static_cast<int>(rng() & ((uint64_t{1} << d_bits) - 1)));
    const int n = static_cast<int>(rng() & ((uint64_t{1} << n_bits) - 1));
    ASSERT_EQ(PreparedDivisor(d).quotient(n), n / d) << n << " / " << d;
  }
}

TEST(PreparedDivisor, TakesADivisorBelowOneAsOne) {
  for (int d : {0, -1, -7, -kMaxInt}) {
    const PreparedDivisor prepared(d);
    EXPECT_EQ(prepared.divisor, 1);
    EXPECT_EQ(prepared.quotient(12345), 12345);
    EXPECT_EQ(prepared.quotient(kMaxInt), kMaxInt);
  }
}

} // namespace
} // namespace m3sa::testing
