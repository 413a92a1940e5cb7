#pragma once
// e4m3 index data built against inexact accumulation, for the GPU scorers' exactness tests (and
// their premises, checked on the host in exact_values_test.cpp): every sum is exact in fp32 (in
// any order), so every scorer that sums exact products in fp32 must select - and score - exactly
// as the host backends.
#include <cstdint>

#include "testing/synthetic_batch.h"

namespace m3sa::testing {

// A well-mixed 64-bit hash of (a, b).
inline uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

// Queries (16, v, v, ...) with v = 0.171875 (v^2 = 0.94 x 2^-5). Even blocks' keys are the same,
// scoring 256 + 127 v^2 = 259.75; odd blocks' keys are (16, 16, 0, ...), scoring 256 + 16 v =
// 258.75. A sum that aligns a k-step's products to the largest (256) and drops what falls 13
// bits below it - Hopper's e4m3 wgmma - loses every v^2 and ranks the odd blocks first.
inline void fill_dropped_products(SyntheticBatch& sb) {
  constexpr float kSmall = 0.171875f;
  sb.fill_index(
      [&](int, int64_t j, int d) {
        if (d == 0) return 16.f;
        if ((j / 128) % 2 == 0) return kSmall;
        return d == 1 ? 16.f : 0.f;
      },
      [&](int64_t, int, int d) { return d == 0 ? 16.f : kSmall; });
}

// e4m3's extremes: each query row and each block's keys are all large (+-256 .. 448: products up
// to 200,704, past fp16's 65,504, so a 16-bit intermediate would overflow) or all subnormal
// (+-2^-9 .. 3 x 2^-9: products down to 2^-18), a ninth of them 0. A dot product's terms are then
// multiples of one power of two (2^12, 2^-3 or 2^-18) and no sum needs more than 24 bits.
inline void fill_e4m3_extremes(SyntheticBatch& sb, uint64_t seed) {
  static constexpr float kLarge[4] = {448.f, 384.f, 320.f, 256.f};
  static constexpr float kSubnormal[3] = {0x1p-9f, 0x1p-8f, 0x3p-9f};
  const auto value = [](bool large, uint64_t a, int d) {
    const uint64_t x = mix(a, static_cast<uint64_t>(d));
    if (x % 9 == 0) return 0.f;
    const float v = large ? kLarge[(x >> 4) % 4] : kSubnormal[(x >> 4) % 3];
    return (x >> 8) % 2 ? -v : v;
  };
  const int heads = sb.spec().index_heads;
  sb.fill_index(
      [&](int r, int64_t j, int d) {
        const uint64_t block = static_cast<uint64_t>(r) << 32 | static_cast<uint64_t>(j / 128);
        return value(mix(seed, block) % 2 == 0, seed * 131 + block * 128 + j % 128, d);
      },
      [&](int64_t t, int h, int d) {
        const uint64_t row = static_cast<uint64_t>(t * heads + h);
        return value(mix(~seed, row) % 2 == 0, ~seed + row, d);
      });
}

} // namespace m3sa::testing
