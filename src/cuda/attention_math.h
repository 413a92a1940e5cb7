#pragma once
// The attention kernels' arithmetic that the CPU tests check (attention_math_test.cpp), host- and
// device-includable, no CUDA headers: where a partial's O element (row, dim) sits after its m and
// l, the power of two that scales e4m3 attention's queries into fp16, and the prefill's compact
// partials' 16-bit fixed point.
//
// The fp32 form (global memory, and the prefill's shared partials): rows of 128 floats. A decode
// CTA's warp partials in shared memory: rows padded to 136 floats and their 16-byte chunks
// swizzled (chunk c at c ^ ((c >> 3) & 3)), so that the warps' fragment stores (half-warps of 4
// rows x 4 lanes, float2 each) and the merge's loads (quarter-warps of one row's 8 threads, float4
// each, a thread's 4 chunks 4k .. 4k + 3) meet no bank conflict: in the fp32 form both were 4-way
// (batch 1's merge of its warps: 2,250 -> 960 cycles, bench/NOTES.md s12 r4 / r5 stamps).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "cuda/attention_params.h"

namespace m3sa::cuda {

// offset(row, dim): the float offset of O element (row, dim), dim in [0, 128), from the start of
// the partial's O.
struct PlainPartialLayout {
  static constexpr int kRowFloats = 128;
  M3SA_HOST_DEVICE static int offset(int row, int dim) { return row * kRowFloats + dim; }
};
struct SharedPartialLayout {
  static constexpr int kRowFloats = 136;
  M3SA_HOST_DEVICE static int chunk(int c) { return c ^ ((c >> 3) & 3); }
  M3SA_HOST_DEVICE static int offset(int row, int dim) {
    return row * kRowFloats + chunk(dim >> 2) * 4 + (dim & 3);
  }
};
inline constexpr int kSharedPartialFloats =
    2 * kAttentionRows + kAttentionRows * SharedPartialLayout::kRowFloats;

// e4m3 decode attention's queries as fp16 (queries_to_scaled_half,
// sparse_attention_decode_sm90.cuh): the power of two 2^e they are scaled by, from the bf16
// exponent field (0..255) of the group's largest |q|, brings that value into [2^14, 2^15) - as
// far as 2^e and 2^-e stay normal floats (e in [-114, 126]: a largest |q| below 2^-112 stays
// smaller, and inf / NaN, field 255, is scaled down and stays what it is).
M3SA_HOST_DEVICE int fp16_query_scale_exponent(int bf16_exponent_field) {
  const int e = 141 - bf16_exponent_field;
  return e < 126 ? e : 126;
}

M3SA_HOST_DEVICE uint32_t float_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits;
}
M3SA_HOST_DEVICE float float_from_bits(uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

// The smallest power of two at or above x (x > 0, finite), else 1: the compact partials' row
// scale a, exact to divide by. From the bits (the exponent, one up unless the mantissa is zero):
// log2f's rounding could land a hair below x, and O / a past 1 would saturate.
M3SA_HOST_DEVICE float power_of_two_at_least(float x) {
  if (!(x > 0.f && x <= 3.4e38f)) return 1.f;
  const uint32_t bits = float_bits(x);
  return float_from_bits((bits & 0x7f800000u) + ((bits & 0x007fffffu) != 0 ? 0x00800000u : 0u));
}

// The compact partials' fixed-point levels: a row's values O / a in [-1, 1] become integers in
// [-32767, 32767]. 32767, not 2^15, so that a value at the row's scale (|O| = a, or a hair below
// it, which rounds up to 2^15) still fits in 16 bits without a clamp: the clamp's two FMNMX a
// value were ~15 % of the prefill consumers' epilogue (bench/NOTES.md s48). The scale 32767 / a
// is exact in fp32 (a is a power of two).
inline constexpr float kFixedLevels = 32767.f;
// A fixed-point value's weight in the merge: a / kFixedLevels as a x kFixedStep, to 2^-24
// relative.
inline constexpr float kFixedStep = 1.f / kFixedLevels;

// Two values times `scale` (= kFixedLevels / a, |value| <= a, so |value x scale| <= 32767) as
// packed 16-bit fixed point (x in the low half), rounded to nearest even. Adding 1.5 x 2^23 rounds
// once and leaves the integer in the float's low mantissa bits, so the conversion runs on the FMA
// pipe (F2I is quarter rate, and two a word were a visible share of the prefill's epilogue,
// bench/NOTES.md s13). Values past the scale are the caller's error: the row's scale is its
// largest |value| rounded up to a power of two, which bounds every finite value; a NaN or an
// infinity (the row's scale ignores both) leaves the float's low bits (a canonical NaN's 0xffff,
// infinity's 0): neither propagates it.
M3SA_HOST_DEVICE uint32_t pack_fixed2(float x, float y, float scale) {
  constexpr float kBias = 12582912.f; // 1.5 x 2^23
  return (float_bits(fmaf(x, scale, kBias)) & 0xffffu) | (float_bits(fmaf(y, scale, kBias)) << 16);
}

} // namespace m3sa::cuda
