#pragma once
// Host conversions between fp32 and the storage types m3sa reads and writes. They reproduce the
// CUDA toolkit's conversions bit for bit (tests/unit/numeric_test.cpp checks every code against
// cuda_bf16.h / cuda_fp8.h) so that a CUDA-free build computes exactly what the GPU stores.
// C++17, as every public header: engines built as C++17 (llama.cpp, TensorRT-LLM) include them.
#include <cstdint>
#include <cstring>

namespace m3sa {

namespace detail {
// std::bit_cast is C++20; a memcpy between same-sized objects compiles to the same move.
template <typename To, typename From> inline To bits_as(From value) {
  static_assert(sizeof(To) == sizeof(From), "bits_as reinterprets objects of one size");
  To out;
  std::memcpy(&out, &value, sizeof(To));
  return out;
}
} // namespace detail

inline float bf16_bits_to_float(uint16_t bits) {
  return detail::bits_as<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even; every NaN becomes the canonical 0x7FFF (as __float2bfloat16_rn does).
inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t x = detail::bits_as<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  const uint32_t upper = x >> 16;
  const uint32_t remainder = x & 0xffffu;
  const bool round_up = remainder > 0x8000u || (remainder == 0x8000u && (upper & 1u));
  return static_cast<uint16_t>(upper + (round_up ? 1u : 0u));
}

// e4m3fn: bias 7, no infinities, 0x7F / 0xFF are NaN, largest finite 448 (0x7E).
inline float e4m3_bits_to_float(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.f : 1.f;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u)
    return detail::bits_as<float>(0x7fffffffu); // NaN, as CUDA decodes it
  if (exponent == 0) return sign * static_cast<float>(mantissa) * 0x1p-9f; // subnormal: m * 2^-9
  // Normal: build the fp32 bit pattern directly (exponent rebias 7 -> 127), exact.
  const uint32_t f32 = ((bits & 0x80u) << 24) | ((exponent + 120u) << 23) | (mantissa << 20);
  return detail::bits_as<float>(f32);
}

// Contract §3: round to nearest even once from fp32, saturate to +-448, every NaN becomes 0x7F,
// i.e. CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3).
inline uint8_t float_to_e4m3_bits(float value) {
  const uint32_t x = detail::bits_as<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((x >> 31) << 7);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7fu; // NaN
  if (magnitude > 0x43e80000u)
    return static_cast<uint8_t>(0x7eu | sign); // > 464 (or inf): saturate
  if (magnitude <= 0x3a800000u) return sign;   // <= 2^-10: rounds to zero
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u; // 24 bits with the hidden one
  uint32_t code;
  uint32_t dropped;
  uint32_t half;
  if (exponent >= -6) { // normal e4m3: keep 3 mantissa bits
    code = (static_cast<uint32_t>(exponent + 7) << 3) | ((significand >> 20) & 0x7u);
    dropped = significand & 0xfffffu;
    half = 0x80000u;
  } else {                           // subnormal e4m3: count units of 2^-9
    const int shift = 14 - exponent; // 21..24
    code = significand >> shift;
    dropped = significand & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
  }
  if (dropped > half || (dropped == half && (code & 1u))) ++code; // a carry rolls into the exponent
  if (code > 0x7eu) code = 0x7eu;
  return static_cast<uint8_t>(code | sign);
}

} // namespace m3sa
