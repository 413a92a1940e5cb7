#include "cpu/simd.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "m3sa/numeric.h"

namespace m3sa::cpu {
namespace {

// fp32 from its bits, in a form GCC vectorises inside a loop (a 4-byte memcpy is a plain load).
[[gnu::always_inline]] inline float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// e4m3_bits_to_float without branches or a table, so that a row's conversions vectorise
// (tests/unit/cpu_simd_test.cpp checks every code): a normal code's exponent and mantissa move into
// fp32's fields (bias 7 -> 127: + 120 << 3 on the 7-bit magnitude); a subnormal one (magnitude <
// 8) is m 2^-9 from an integer conversion, so no fp32 subnormal arises that a caller's
// flush-to-zero mode could change; 0x7f / 0xff are the one NaN e4m3_bits_to_float gives.
[[gnu::always_inline]] inline float e4m3_to_float(uint8_t code) {
  const uint32_t magnitude = code & 0x7fu, sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t normal = ((magnitude + (120u << 3)) << 20) | sign;
  const float small = static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-9f;
  uint32_t subnormal;
  std::memcpy(&subnormal, &small, sizeof subnormal);
  subnormal |= sign;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < 8u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude == 0x7fu);
  const uint32_t bits = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  return float_from_bits((bits & ~is_nan) | (0x7fffffffu & is_nan));
}

// `count` is a compile-time width so that each caller's loop vectorises; inlined, so that it
// compiles for its caller's clone.
template <int count>
[[gnu::always_inline]] inline void load_values(DType dtype, const void* row, float scale,
                                               float* out) {
  if (dtype == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(row);
#pragma omp simd
    for (int d = 0; d < count; ++d)
      out[d] = float_from_bits(static_cast<uint32_t>(src[d]) << 16) * scale;
  } else if (dtype == DType::fp8_e4m3) {
    const uint8_t* src = static_cast<const uint8_t*>(row);
#pragma omp simd
    for (int d = 0; d < count; ++d) out[d] = e4m3_to_float(src[d]) * scale;
  } else {
    const float* src = static_cast<const float*>(row);
#pragma omp simd
    for (int d = 0; d < count; ++d) out[d] = src[d] * scale;
  }
}

// Eight floats in one register (AVX2; two SSE registers in the default clone): GCC and Clang's
// vector extension, since arrays of accumulators under `omp simd` were kept on the stack. Memory
// goes through an unaligned, aliasing variant of the type (a memcpy into an array of them became
// two 16-byte stack stores that each 32-byte operand then failed to forward from). No function
// takes or returns one: the default clone's ABI differs.
using Float8 = float __attribute__((vector_size(32)));
using Bits8 = uint32_t __attribute__((vector_size(32)));
using Int8 = int32_t __attribute__((vector_size(32)));
using UnalignedFloat8 = float __attribute__((vector_size(32), aligned(4), may_alias));

} // namespace

M3SA_CPU_CLONES void load_row(DType dtype, const void* row, float scale, float* out) {
  load_values<kHeadDim>(dtype, row, scale, out);
}

void load_rotary_row(DType dtype, const void* row, float* out) {
  load_values<kRotaryDim>(dtype, row, 1.f, out);
}

namespace {

// The dots of R rows with J keys: lane l of each accumulator sums the dims d = l (mod 8) in order,
// then the lanes add up. R x J accumulators (2 x 4 or 1 x 4: at most 8 AVX2 registers) stay in
// registers, so each loaded chunk of a row or key feeds J or R FMAs instead of one.
template <int R, int J>
[[gnu::always_inline]] inline void dot_tile(const float* rows, const float* keys, DotLayout out) {
  Float8 acc[R][J] = {};
  for (int d0 = 0; d0 < kHeadDim; d0 += 8) {
    for (int i = 0; i < R; ++i) {
      const Float8 row = *reinterpret_cast<const UnalignedFloat8*>(rows + i * kHeadDim + d0);
      for (int j = 0; j < J; ++j)
        acc[i][j] += row * *reinterpret_cast<const UnalignedFloat8*>(keys + j * kHeadDim + d0);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j) {
      const Float8 a = acc[i][j];
      out.data[i * out.row_stride + j * out.key_stride] =
          ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
}

} // namespace

M3SA_CPU_CLONES void dot_rows_keys(const float* rows, int num_rows, const float* keys, int num_keys,
                                   DotLayout out) {
  const auto at = [&](int i, int j) {
    return DotLayout{out.data + i * out.row_stride + j * out.key_stride, out.row_stride,
                     out.key_stride};
  };
  int j = 0;
  for (; j + 4 <= num_keys; j += 4) {
    const float* k = keys + j * kHeadDim;
    int i = 0;
    for (; i + 2 <= num_rows; i += 2) dot_tile<2, 4>(rows + i * kHeadDim, k, at(i, j));
    if (i < num_rows) dot_tile<1, 4>(rows + i * kHeadDim, k, at(i, j));
  }
  for (; j < num_keys; ++j)
    for (int i = 0; i < num_rows; ++i)
      dot_tile<1, 1>(rows + i * kHeadDim, keys + j * kHeadDim, at(i, j));
}

namespace {

// The 8 x 8 transpose of eight key chunks (key k, dims d0..d0+7) into eight dim chunks (dim d,
// keys k0..k0+7): unpack pairs, then quads, then the 128-bit halves.
[[gnu::always_inline]] inline void transpose8(Float8 (&r)[8]) {
  Float8 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4)
    for (int h = 0; h < 2; ++h) {
      u[k + 2 * h] = __builtin_shufflevector(t[k + h], t[k + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
      u[k + 2 * h + 1] =
          __builtin_shufflevector(t[k + h], t[k + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  // u[0..3]: dims (0, 4), (1, 5), (2, 6), (3, 7) of keys 0-3; u[4..7] the same of keys 4-7.
  for (int d = 0; d < 4; ++d) {
    r[d] = __builtin_shufflevector(u[d], u[4 + d], 0, 1, 2, 3, 8, 9, 10, 11);
    r[4 + d] = __builtin_shufflevector(u[d], u[4 + d], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// The one tile of both lane forms: out[i * out_stride + l] = the sum over d in order of
// scalars[i][d] * lanes[d * lane_stride + l], for i < R and l < 8 V. R x V accumulators; each
// scalar (a row's or a key's value at dim d) is broadcast against the 8 V lanes at d (keys of the
// block scorer, queries of a GQA group).
template <int R, int V>
[[gnu::always_inline]] inline void lanes_tile(const float* scalars, const float* lanes,
                                              int64_t lane_stride, float* out, int64_t out_stride) {
  Float8 acc[R][V] = {};
  for (int d = 0; d < kHeadDim; ++d) {
    Float8 lane[V];
    for (int v = 0; v < V; ++v)
      lane[v] = *reinterpret_cast<const UnalignedFloat8*>(lanes + d * lane_stride + 8 * v);
    for (int i = 0; i < R; ++i) {
      const float x = scalars[i * kHeadDim + d];
      for (int v = 0; v < V; ++v) acc[i][v] += x * lane[v];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v)
      *reinterpret_cast<UnalignedFloat8*>(out + i * out_stride + 8 * v) = acc[i][v];
}

// Rows [i0, i0 + R) by keys [j0, j0 + 8 V) of the transposed block.
template <int R, int V>
[[gnu::always_inline]] inline void transposed_tile(const float* rows, const float* keys_t,
                                                   float* out, int64_t out_stride) {
  lanes_tile<R, V>(rows, keys_t, kBlockTokens, out, out_stride);
}

// Rows in tiles of R, keys in steps of 8 V, then of 16.
template <int R, int V>
[[gnu::always_inline]] inline void transposed_rows(const float* rows, const float* keys_t,
                                                   int num_keys, float* out, int64_t out_stride) {
  int j = 0;
  for (; j + 8 * V <= num_keys; j += 8 * V)
    transposed_tile<R, V>(rows, keys_t + j, out + j, out_stride);
  for (; j < num_keys; j += 16) transposed_tile<R, 2>(rows, keys_t + j, out + j, out_stride);
}

} // namespace

M3SA_CPU_CLONES void widen_keys_transposed(DType dtype, const void* keys, int64_t key_stride,
                                           int num_keys, float* out, float* rows8) {
  const char* base = static_cast<const char*>(keys);
  const int padded = (num_keys + 15) / 16 * 16;
  for (int k0 = 0; k0 < padded; k0 += 8) {
    for (int k = 0; k < 8; ++k) {
      if (k0 + k < num_keys)
        load_values<kHeadDim>(dtype, base + (k0 + k) * key_stride, 1.f, rows8 + k * kHeadDim);
      else
        std::fill_n(rows8 + k * kHeadDim, kHeadDim, 0.f);
    }
    for (int d0 = 0; d0 < kHeadDim; d0 += 8) {
      Float8 chunk[8];
      for (int k = 0; k < 8; ++k)
        chunk[k] = *reinterpret_cast<const UnalignedFloat8*>(rows8 + k * kHeadDim + d0);
      transpose8(chunk);
      for (int d = 0; d < 8; ++d)
        *reinterpret_cast<UnalignedFloat8*>(out + (d0 + d) * kBlockTokens + k0) = chunk[d];
    }
  }
}

M3SA_CPU_CLONES void dot_rows_transposed_keys(const float* rows, int num_rows, const float* keys_t,
                                              int num_keys, float* out, int64_t out_stride) {
  int i = 0;
  for (; i + 4 <= num_rows; i += 4)
    transposed_rows<4, 2>(rows + i * kHeadDim, keys_t, num_keys, out + i * out_stride, out_stride);
  for (; i + 2 <= num_rows; i += 2)
    transposed_rows<2, 4>(rows + i * kHeadDim, keys_t, num_keys, out + i * out_stride, out_stride);
  for (; i < num_rows; ++i)
    transposed_rows<1, 8>(rows + i * kHeadDim, keys_t, num_keys, out + i * out_stride, out_stride);
}

namespace {

// Keys [j0, j0 + J) by the group's V x 8 queries (transposed: 8 V lanes a dim).
template <int J, int V>
[[gnu::always_inline]] inline void queries_in_lanes_tile(const float* queries_t, const float* keys,
                                                         float* out) {
  lanes_tile<J, V>(keys, queries_t, 8 * V, out, 8 * V);
}

template <int V>
[[gnu::always_inline]] inline void queries_in_lanes(const float* queries_t, const float* keys,
                                                    int num_keys, float* out) {
  constexpr int J = 8 / V;
  int j = 0;
  for (; j + J <= num_keys; j += J)
    queries_in_lanes_tile<J, V>(queries_t, keys + j * kHeadDim, out + j * 8 * V);
  for (; j < num_keys; ++j)
    queries_in_lanes_tile<1, V>(queries_t, keys + j * kHeadDim, out + j * 8 * V);
}

} // namespace

M3SA_CPU_CLONES void dot_keys_queries_in_lanes(const float* queries_t, int group, const float* keys,
                                               int num_keys, float* out) {
  if (group == 16)
    queries_in_lanes<2>(queries_t, keys, num_keys, out);
  else
    queries_in_lanes<1>(queries_t, keys, num_keys, out);
}

M3SA_CPU_CLONES float max_propagating_nan(const float* values, int count) {
  Float8 largest = -std::numeric_limits<float>::infinity() + Float8{};
  Bits8 any_nan = {};
  int i = 0;
  for (; i + 8 <= count; i += 8) {
    const Float8 v = *reinterpret_cast<const UnalignedFloat8*>(values + i);
    any_nan |= std::bit_cast<Bits8>(v != v);
    largest = v > largest ? v : largest;
  }
  float result = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int l = 0; l < 8; ++l) {
    nan |= any_nan[l] != 0;
    result = std::max(result, largest[l]);
  }
  for (; i < count; ++i) {
    nan |= std::isnan(values[i]);
    result = std::max(result, values[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : result;
}

M3SA_CPU_CLONES void softmax_weights(float* values, int64_t num_keys, int group,
                                     const float* max_logit, float* denominator) {
  const int64_t count = num_keys * group;
  int64_t i = 0;
  if (8 % group == 0 || group % 8 == 0) {
    // Lane l of the k-th vector of a group's run subtracts max_logit[(8 k + l) % group].
    const int patterns = std::max(1, group / 8);
    Float8 pattern[kMaxGqaGroup / 8];
    for (int k = 0; k < patterns; ++k)
      for (int l = 0; l < 8; ++l) pattern[k][l] = max_logit[(8 * k + l) % group];
    // Cephes' expf: x = n ln2 + r (ln2 in two parts), e^r by a degree-6 polynomial, 2^n into the
    // exponent field; x within [-87.3, 88] keeps 2^n a normal float.
    constexpr float kLow = -87.33654f, kHigh = 88.f;
    for (; i + 8 <= count; i += 8) {
      const Float8 x =
          *reinterpret_cast<const UnalignedFloat8*>(values + i) - pattern[(i / 8) % patterns];
      Float8 clamped = x < kLow ? kLow + Float8{} : x;
      clamped = clamped > kHigh ? kHigh + Float8{} : clamped;
      const Float8 t = clamped * 1.44269504088896341f + 0.5f;
      Float8 n = __builtin_convertvector(__builtin_convertvector(t, Int8), Float8); // truncated
      n = n > t ? n - 1.f : n;                                                      // floor
      const Float8 r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
      Float8 p = 1.9875691500e-4f + Float8{};
      p = p * r + 1.3981999507e-3f;
      p = p * r + 8.3334519073e-3f;
      p = p * r + 4.1665795894e-2f;
      p = p * r + 1.6666665459e-1f;
      p = p * r + 5.0000001201e-1f;
      p = p * r * r + r + 1.f;
      const Int8 two_to_n = (__builtin_convertvector(n, Int8) + 127) << 23;
      const Float8 e = p * std::bit_cast<Float8>(two_to_n);
      *reinterpret_cast<UnalignedFloat8*>(values + i) =
          x != x ? x : (x < kLow ? 0.f + Float8{} : e);
    }
  }
  for (; i < count; ++i) values[i] = std::exp(values[i] - max_logit[i % group]);
  std::fill_n(denominator, group, 0.f);
  for (int64_t n = 0; n < num_keys; ++n)
    for (int h = 0; h < group; ++h) denominator[h] += values[n * group + h];
}

namespace {

// Rows [i0, i0 + R) and dims [d0, d0 + 32) of acc: R x 4 accumulators (8 AVX2 registers), each
// summing its values in order, so each loaded chunk of a value row feeds R FMAs.
template <int R>
[[gnu::always_inline]] inline void accumulate_tile(float* acc, const float* weights,
                                                   int64_t weight_stride, const float* values,
                                                   int num_values, int i0, int d0) {
  constexpr int kSlices = 4;
  Float8 sum[R][kSlices];
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < kSlices; ++k)
      sum[i][k] = *reinterpret_cast<const UnalignedFloat8*>(acc + (i0 + i) * kHeadDim + d0 + 8 * k);
  for (int n = 0; n < num_values; ++n) {
    const float* v = values + n * kHeadDim + d0;
    for (int i = 0; i < R; ++i) {
      const float w = weights[n * weight_stride + i0 + i];
      for (int k = 0; k < kSlices; ++k)
        sum[i][k] += w * *reinterpret_cast<const UnalignedFloat8*>(v + 8 * k);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < kSlices; ++k)
      *reinterpret_cast<UnalignedFloat8*>(acc + (i0 + i) * kHeadDim + d0 + 8 * k) = sum[i][k];
}

} // namespace

M3SA_CPU_CLONES void accumulate_weighted_rows(float* acc, int num_rows, const float* weights,
                                              int64_t weight_stride, const float* values,
                                              int num_values) {
  for (int d0 = 0; d0 < kHeadDim; d0 += 32) {
    int i = 0;
    for (; i + 2 <= num_rows; i += 2)
      accumulate_tile<2>(acc, weights, weight_stride, values, num_values, i, d0);
    if (i < num_rows) accumulate_tile<1>(acc, weights, weight_stride, values, num_values, i, d0);
  }
}

} // namespace m3sa::cpu
