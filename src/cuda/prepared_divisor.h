#pragma once
// A divisor prepared ahead - before a PDL wait, while the previous grid runs - so that a later
// quotient is a multiply-high and a shift instead of a 32-bit reciprocal sequence (I2F, MUFU.RCP,
// F2I and corrections: ~15 dependent instructions, ~100-150 cycles, s41 SASS of the decode
// indexer's batch-1 path; s42 r1 measured 0.1-0.3 us less at batch 1 with its divisions
// prepared). Plain host code as well, so that the CPU tests check it against `/`
// (tests/unit/prepared_divisor_test.cpp).
//
// The round-up multiplier of CUTLASS's FastDivmod: with l = ceil(log2 d) and
// m = ceil(2^(31 + l) / d), n / d == umulhi(n, m) >> (l - 1) for 0 <= n < 2^31 and
// 2 <= d < 2^31 (m < 2^32 since d > 2^(l - 1)); d == 1 is the identity. A divisor below 1 is
// taken as 1 (the callers' counts are at least 1; a 0 would otherwise be a division by zero).
#include <cstdint>

#include "common/host_device.h"

namespace m3sa::cuda {

struct PreparedDivisor {
  int divisor;
  uint32_t multiplier; // m, for divisor >= 2
  int shift;           // l - 1

  M3SA_HOST_DEVICE explicit PreparedDivisor(int d) : divisor(d > 1 ? d : 1) {
    const int ceil_log2 = divisor == 1 ? 0 : 32 - count_leading_zeros(uint32_t(divisor - 1));
    shift = ceil_log2 > 0 ? ceil_log2 - 1 : 0;
    multiplier =
        divisor == 1
            ? 0u
            : static_cast<uint32_t>(((uint64_t{1} << (31 + ceil_log2)) + uint64_t(divisor) - 1) /
                                    uint64_t(divisor));
  }
  // n / divisor, for 0 <= n < 2^31.
  M3SA_HOST_DEVICE int quotient(int n) const {
    return divisor == 1 ? n : static_cast<int>(multiply_high(uint32_t(n), multiplier) >> shift);
  }

private:
  M3SA_HOST_DEVICE static int count_leading_zeros(uint32_t x) { // x != 0
#if defined(__CUDA_ARCH__)
    return __clz(x);
#else
    return __builtin_clz(x);
#endif
  }
  M3SA_HOST_DEVICE static uint32_t multiply_high(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
  }
};

} // namespace m3sa::cuda
