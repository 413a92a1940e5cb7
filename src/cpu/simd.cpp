#include "cpu/simd.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
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
// compiles for its caller's level.
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

// W floats in one register (W = 8: AVX2, two SSE registers at the portable level; W = 16:
// AVX-512): GCC and Clang's vector extension, since arrays of accumulators under `omp simd` were
// kept on the stack. Memory goes through an unaligned, aliasing variant of the type (a memcpy into
// an array of them became two 16-byte stack stores that each 32-byte operand then failed to
// forward from). No function takes or returns one by value: the levels' ABIs differ (Clang
// rejects such a call into an AVX-512 function). The types are spelled out per width (a
// vector_size that depends on a template parameter was silently dropped by GCC 12 in a local
// alias) and as typedefs (Clang drops a `using` alias's aligned(4) and emits aligned moves).
template <int W> struct Lanes;
template <> struct Lanes<8> {
  typedef float Float __attribute__((vector_size(32)));
  typedef uint32_t Bits __attribute__((vector_size(32)));
  typedef int32_t Int __attribute__((vector_size(32)));
  typedef float Unaligned __attribute__((vector_size(32), aligned(4), may_alias));
};
template <> struct Lanes<16> {
  typedef float Float __attribute__((vector_size(64)));
  typedef uint32_t Bits __attribute__((vector_size(64)));
  typedef int32_t Int __attribute__((vector_size(64)));
  typedef float Unaligned __attribute__((vector_size(64), aligned(4), may_alias));
};
using Float8 = Lanes<8>::Float;

// W lanes from or to p, through references (no vector passes by value; and Clang loads a returned
// reference to the unaligned type with an aligned move).
template <int W>
[[gnu::always_inline]] inline void load(typename Lanes<W>::Float& out, const float* p) {
  out = *reinterpret_cast<const typename Lanes<W>::Unaligned*>(p);
}
template <int W>
[[gnu::always_inline]] inline void store(float* p, const typename Lanes<W>::Float& v) {
  *reinterpret_cast<typename Lanes<W>::Unaligned*>(p) = v;
}

[[gnu::always_inline]] inline void load_rows_body(DType dtype, const void* first,
                                                  int64_t stride_bytes, int count, float scale,
                                                  float* out, const void* prefetch) {
  const int64_t row_bytes = kHeadDim * static_cast<int64_t>(dtype_size(dtype));
  for (int j = 0; j < count; ++j) {
    load_values<kHeadDim>(dtype, static_cast<const char*>(first) + j * stride_bytes, scale,
                          out + j * kHeadDim);
    if (prefetch != nullptr)
      prefetch_bytes(static_cast<const char*>(prefetch) + j * stride_bytes, row_bytes);
  }
}

} // namespace

void load_rotary_row(DType dtype, const void* row, float* out) {
  load_values<kRotaryDim>(dtype, row, 1.f, out);
}

namespace {

// The dots of R rows with J keys: lane l of each accumulator sums the dims d = l (mod 8) in order,
// then the lanes add up. R x J accumulators stay in registers, so each loaded chunk of a row or
// key feeds J or R FMAs instead of one; 2 x 4 fit AVX2's 16 registers (4 x 4 in AVX-512's 32
// measured slower). Eight lanes at every level: the lanes' order of the sum is the result's.
template <int R, int J>
[[gnu::always_inline]] inline void dot_tile(const float* rows, const float* keys, DotLayout out) {
  Float8 acc[R][J] = {};
  for (int d0 = 0; d0 < kHeadDim; d0 += 8) {
    for (int i = 0; i < R; ++i) {
      Float8 row, key;
      load<8>(row, rows + i * kHeadDim + d0);
      for (int j = 0; j < J; ++j) {
        load<8>(key, keys + j * kHeadDim + d0);
        acc[i][j] += row * key;
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j) {
      const Float8 a = acc[i][j];
      out.data[i * out.row_stride + j * out.key_stride] =
          ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
}

[[gnu::always_inline]] inline void dot_rows_keys_body(const float* rows, int num_rows,
                                                      const float* keys, int num_keys,
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

[[gnu::always_inline]] inline void widen_keys_transposed_body(DType dtype, const void* keys,
                                                              int64_t key_stride, int num_keys,
                                                              float* out, float* rows8) {
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
      for (int k = 0; k < 8; ++k) load<8>(chunk[k], rows8 + k * kHeadDim + d0);
      transpose8(chunk);
      for (int d = 0; d < 8; ++d) store<8>(out + (d0 + d) * kBlockTokens + k0, chunk[d]);
    }
  }
}

// The one tile of both lane forms: out[i * out_stride + l] = the sum over d in order of
// scalars[i][d] * lanes[d * lane_stride + l], for i < R and l < W V. R x V accumulators of W lanes;
// each scalar (a row's or a key's value at dim d) is broadcast against the W V lanes at d (keys of
// the block scorer, queries of a GQA group). Every lane's sum is the same chain of FMAs whatever W
// is, so AVX-512's 16 lanes give AVX2's bits.
template <int W, int R, int V>
[[gnu::always_inline]] inline void lanes_tile(const float* scalars, const float* lanes,
                                              int64_t lane_stride, float* out, int64_t out_stride) {
  using Float = typename Lanes<W>::Float;
  Float acc[R][V] = {};
  for (int d = 0; d < kHeadDim; ++d) {
    Float lane[V];
    for (int v = 0; v < V; ++v) load<W>(lane[v], lanes + d * lane_stride + W * v);
    for (int i = 0; i < R; ++i) {
      const float x = scalars[i * kHeadDim + d];
      for (int v = 0; v < V; ++v) acc[i][v] += x * lane[v];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) store<W>(out + i * out_stride + W * v, acc[i][v]);
}

// Rows [i0, i0 + R) by keys in steps of W V of the transposed block, then of 16 (num_keys is a
// multiple of 16).
template <int W, int R, int V>
[[gnu::always_inline]] inline void transposed_rows(const float* rows, const float* keys_t,
                                                   int num_keys, float* out, int64_t out_stride) {
  int j = 0;
  for (; j + W * V <= num_keys; j += W * V)
    lanes_tile<W, R, V>(rows, keys_t + j, kBlockTokens, out + j, out_stride);
  for (; j < num_keys; j += 16)
    lanes_tile<W, R, 16 / W>(rows, keys_t + j, kBlockTokens, out + j, out_stride);
}

// Tiles as the registers allow, each row's keys in steps of W V: AVX2 4 rows x 16 keys (8 of its
// 16 registers accumulate), 2 x 32, 1 x 64; AVX-512 8 x 32 (16 of its 32), 4 x 64, 2 x 128,
// 1 x 128. A tile's shape only groups outputs: each is summed alone, in dim order.
// Rows from i on in tiles of R while R remain (i: the first row left).
template <int W, int R, int V>
[[gnu::always_inline]] inline void transposed_tiles(const float* rows, int num_rows,
                                                    const float* keys_t, int num_keys, float* out,
                                                    int64_t out_stride, int& i) {
  for (; i + R <= num_rows; i += R)
    transposed_rows<W, R, V>(rows + i * kHeadDim, keys_t, num_keys, out + i * out_stride,
                             out_stride);
}

template <int W>
[[gnu::always_inline]] inline void dot_rows_transposed_keys_body(const float* rows, int num_rows,
                                                                 const float* keys_t, int num_keys,
                                                                 float* out, int64_t out_stride) {
  int i = 0;
  if constexpr (W == 16) {
    transposed_tiles<16, 8, 2>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
    transposed_tiles<16, 4, 4>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
    transposed_tiles<16, 2, 8>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
    transposed_tiles<16, 1, 8>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
  } else {
    transposed_tiles<8, 4, 2>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
    transposed_tiles<8, 2, 4>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
    transposed_tiles<8, 1, 8>(rows, num_rows, keys_t, num_keys, out, out_stride, i);
  }
}

// Keys [j0, j0 + J) by the group's lanes (W V queries, transposed: W V lanes a dim), J keys a tile
// so that J V accumulators (8) hide the FMA latency.
template <int W, int V>
[[gnu::always_inline]] inline void queries_in_lanes(const float* queries_t, const float* keys,
                                                    int num_keys, float* out) {
  constexpr int kLanes = W * V, J = 8 / V;
  int j = 0;
  for (; j + J <= num_keys; j += J)
    lanes_tile<W, J, V>(keys + j * kHeadDim, queries_t, kLanes, out + j * kLanes, kLanes);
  for (; j < num_keys; ++j)
    lanes_tile<W, 1, V>(keys + j * kHeadDim, queries_t, kLanes, out + j * kLanes, kLanes);
}

template <int W>
[[gnu::always_inline]] inline void dot_keys_queries_in_lanes_body(const float* queries_t, int group,
                                                                  const float* keys, int num_keys,
                                                                  float* out) {
  if (group == 16)
    queries_in_lanes<W, 16 / W>(queries_t, keys, num_keys, out);
  else
    queries_in_lanes<8, 1>(queries_t, keys, num_keys, out);
}

template <int W>
[[gnu::always_inline]] inline float max_propagating_nan_body(const float* values, int count) {
  using Float = typename Lanes<W>::Float;
  using Bits = typename Lanes<W>::Bits;
  Float largest = -std::numeric_limits<float>::infinity() + Float{};
  Bits any_nan = {};
  int i = 0;
  for (; i + W <= count; i += W) {
    Float v;
    load<W>(v, values + i);
    any_nan |= std::bit_cast<Bits>(v != v);
    largest = v > largest ? v : largest;
  }
  float result = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int l = 0; l < W; ++l) {
    nan |= any_nan[l] != 0;
    result = std::max(result, largest[l]);
  }
  for (; i < count; ++i) {
    nan |= std::isnan(values[i]);
    result = std::max(result, values[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : result;
}

// exp(x - shift) lane by lane: Cephes' expf, x = n ln2 + r (ln2 in two parts), e^r by a degree-6
// polynomial, 2^n into the exponent field; x within [-87.3, 88] keeps 2^n a normal float. The same
// operations at any width, so both widths give each lane the same bits.
template <int W>
[[gnu::always_inline]] inline void exp_lanes(float* values, const typename Lanes<W>::Float& shift) {
  using Float = typename Lanes<W>::Float;
  using Int = typename Lanes<W>::Int;
  constexpr float kLow = -87.33654f, kHigh = 88.f;
  Float x;
  load<W>(x, values);
  x -= shift;
  Float clamped = x < kLow ? kLow + Float{} : x;
  clamped = clamped > kHigh ? kHigh + Float{} : clamped;
  const Float t = clamped * 1.44269504088896341f + 0.5f;
  Float n = __builtin_convertvector(__builtin_convertvector(t, Int), Float); // truncated
  n = n > t ? n - 1.f : n;                                                   // floor
  const Float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  Float p = 1.9875691500e-4f + Float{};
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const Int two_to_n = (__builtin_convertvector(n, Int) + 127) << 23;
  const Float e = p * std::bit_cast<Float>(two_to_n);
  store<W>(values, x != x ? x : (x < kLow ? 0.f + Float{} : e));
}

template <int W>
[[gnu::always_inline]] inline void fill_pattern(typename Lanes<W>::Float& pattern,
                                                const float* max_logit, int group, int64_t at) {
  for (int l = 0; l < W; ++l) pattern[l] = max_logit[(at + l) % group];
}

// The vector exponential covers the same elements at both widths (all but count % 8, which take
// std::exp), so that the widths agree bit for bit: after W = 16's steps, one of 8.
template <int W>
[[gnu::always_inline]] inline void softmax_weights_body(float* values, int64_t num_keys, int group,
                                                        const float* max_logit,
                                                        float* denominator) {
  const int64_t count = num_keys * group;
  int64_t i = 0;
  if (8 % group == 0 || group % 8 == 0) {
    // Lane l of the vector at i subtracts max_logit[(i + l) % group]: the group divides 8 or 16,
    // or is 16, so a vector's pattern depends on i / W % patterns only.
    const int patterns = std::max(1, group / W);
    typename Lanes<W>::Float pattern[kMaxGqaGroup / 8];
    for (int k = 0; k < patterns; ++k) fill_pattern<W>(pattern[k], max_logit, group, W * k);
    for (; i + W <= count; i += W) exp_lanes<W>(values + i, pattern[(i / W) % patterns]);
    if constexpr (W > 8)
      for (; i + 8 <= count; i += 8) {
        Float8 tail;
        fill_pattern<8>(tail, max_logit, group, i);
        exp_lanes<8>(values + i, tail);
      }
  }
  for (; i < count; ++i) values[i] = std::exp(values[i] - max_logit[i % group]);
  std::fill_n(denominator, group, 0.f);
  for (int64_t n = 0; n < num_keys; ++n)
    for (int h = 0; h < group; ++h) denominator[h] += values[n * group + h];
}

// Rows [i0, i0 + R) and dims [d0, d0 + 4 W) of acc: R x 4 accumulators, each summing its values
// in order, so each loaded chunk of a value row feeds R FMAs.
template <int W, int R>
[[gnu::always_inline]] inline void accumulate_tile(float* acc, const float* weights,
                                                   int64_t weight_stride, const float* values,
                                                   int num_values, int i0, int d0) {
  constexpr int kSlices = 4;
  typename Lanes<W>::Float sum[R][kSlices];
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < kSlices; ++k) load<W>(sum[i][k], acc + (i0 + i) * kHeadDim + d0 + W * k);
  for (int n = 0; n < num_values; ++n) {
    const float* v = values + n * kHeadDim + d0;
    for (int i = 0; i < R; ++i) {
      const float w = weights[n * weight_stride + i0 + i];
      for (int k = 0; k < kSlices; ++k) {
        typename Lanes<W>::Float value;
        load<W>(value, v + W * k);
        sum[i][k] += w * value;
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < kSlices; ++k) store<W>(acc + (i0 + i) * kHeadDim + d0 + W * k, sum[i][k]);
}

template <int W>
[[gnu::always_inline]] inline void accumulate_weighted_rows_body(float* acc, int num_rows,
                                                                 const float* weights,
                                                                 int64_t weight_stride,
                                                                 const float* values,
                                                                 int num_values) {
  for (int d0 = 0; d0 < kHeadDim; d0 += 4 * W) {
    int i = 0;
    for (; i + 2 <= num_rows; i += 2)
      accumulate_tile<W, 2>(acc, weights, weight_stride, values, num_values, i, d0);
    if (i < num_rows)
      accumulate_tile<W, 1>(acc, weights, weight_stride, values, num_values, i, d0);
  }
}

} // namespace

// Each kernel at each level: the same body, built for AVX-512 (16 lanes where only the grouping of
// lanes into registers changes), AVX2 + FMA (8 lanes) and the baseline (SSE2: 8 lanes in two
// registers, no FMA). The body is inlined into each, so it compiles for that level's instructions.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define M3SA_SIMD_DISPATCH 1
#define M3SA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define M3SA_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define M3SA_SIMD_DISPATCH 0
#define M3SA_TARGET_AVX512
#define M3SA_TARGET_AVX2
#endif

#define M3SA_AT_EACH_LEVEL(ret, name, params, wide, narrow)                                       \
  M3SA_TARGET_AVX512 ret name##_avx512 params { return wide; }                                    \
  M3SA_TARGET_AVX2 ret name##_avx2 params { return narrow; }                                      \
  ret name##_portable params { return narrow; }

namespace {

M3SA_AT_EACH_LEVEL(void, load_row, (DType dtype, const void* row, float scale, float* out),
                   load_values<kHeadDim>(dtype, row, scale, out),
                   load_values<kHeadDim>(dtype, row, scale, out))
M3SA_AT_EACH_LEVEL(void, load_rows,
                   (DType dtype, const void* first, int64_t stride_bytes, int count, float scale,
                    float* out, const void* prefetch),
                   load_rows_body(dtype, first, stride_bytes, count, scale, out, prefetch),
                   load_rows_body(dtype, first, stride_bytes, count, scale, out, prefetch))
M3SA_AT_EACH_LEVEL(void, dot_rows_keys,
                   (const float* rows, int num_rows, const float* keys, int num_keys,
                    DotLayout out),
                   dot_rows_keys_body(rows, num_rows, keys, num_keys, out),
                   dot_rows_keys_body(rows, num_rows, keys, num_keys, out))
M3SA_AT_EACH_LEVEL(void, widen_keys_transposed,
                   (DType dtype, const void* keys, int64_t key_stride, int num_keys, float* out,
                    float* rows8),
                   widen_keys_transposed_body(dtype, keys, key_stride, num_keys, out, rows8),
                   widen_keys_transposed_body(dtype, keys, key_stride, num_keys, out, rows8))
M3SA_AT_EACH_LEVEL(void, dot_rows_transposed_keys,
                   (const float* rows, int num_rows, const float* keys_t, int num_keys, float* out,
                    int64_t out_stride),
                   dot_rows_transposed_keys_body<16>(rows, num_rows, keys_t, num_keys, out,
                                                     out_stride),
                   dot_rows_transposed_keys_body<8>(rows, num_rows, keys_t, num_keys, out,
                                                    out_stride))
M3SA_AT_EACH_LEVEL(void, dot_keys_queries_in_lanes,
                   (const float* queries_t, int group, const float* keys, int num_keys,
                    float* out),
                   dot_keys_queries_in_lanes_body<16>(queries_t, group, keys, num_keys, out),
                   dot_keys_queries_in_lanes_body<8>(queries_t, group, keys, num_keys, out))
M3SA_AT_EACH_LEVEL(float, max_propagating_nan, (const float* values, int count),
                   max_propagating_nan_body<16>(values, count),
                   max_propagating_nan_body<8>(values, count))
M3SA_AT_EACH_LEVEL(void, softmax_weights,
                   (float* values, int64_t num_keys, int group, const float* max_logit,
                    float* denominator),
                   softmax_weights_body<16>(values, num_keys, group, max_logit, denominator),
                   softmax_weights_body<8>(values, num_keys, group, max_logit, denominator))
M3SA_AT_EACH_LEVEL(void, accumulate_weighted_rows,
                   (float* acc, int num_rows, const float* weights, int64_t weight_stride,
                    const float* values, int num_values),
                   accumulate_weighted_rows_body<16>(acc, num_rows, weights, weight_stride, values,
                                                     num_values),
                   accumulate_weighted_rows_body<8>(acc, num_rows, weights, weight_stride, values,
                                                    num_values))

// -1 until the first kernel call reads the environment's cap.
std::atomic<int> active_level{-1};

SimdLevel capped(SimdLevel cap) { return std::min(detected_simd_level(), cap); }

// The kernel of the active level among a kernel's three builds.
template <typename Kernel> Kernel* at_level(Kernel* avx512, Kernel* avx2, Kernel* portable) {
  switch (simd_level()) {
  case SimdLevel::avx512:
    return avx512;
  case SimdLevel::avx2:
    return avx2;
  case SimdLevel::portable:
    break;
  }
  return portable;
}

} // namespace

const char* to_string(SimdLevel level) {
  switch (level) {
  case SimdLevel::avx512:
    return "avx512";
  case SimdLevel::avx2:
    return "avx2";
  case SimdLevel::portable:
    break;
  }
  return "portable";
}

SimdLevel detected_simd_level() {
#if M3SA_SIMD_DISPATCH
  // The builtins check the OS's saved register state too (XCR0), not only CPUID.
  static const SimdLevel detected = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return avx512 ? SimdLevel::avx512 : avx2 ? SimdLevel::avx2 : SimdLevel::portable;
  }();
  return detected;
#else
  return SimdLevel::portable;
#endif
}

SimdLevel simd_level() {
  int level = active_level.load(std::memory_order_relaxed);
  if (level < 0) { // every thread computes the same; a cap set meanwhile wins
    int unset = -1;
    const int initial =
        static_cast<int>(capped(simd_level_cap_named(std::getenv("M3SA_CPU_MAX_ISA"))));
    level = active_level.compare_exchange_strong(unset, initial, std::memory_order_relaxed)
                ? initial
                : unset;
  }
  return static_cast<SimdLevel>(level);
}

void set_simd_level_cap(SimdLevel cap) {
  active_level.store(static_cast<int>(capped(cap)), std::memory_order_relaxed);
}

SimdLevel simd_level_cap_named(const char* name) {
  if (name != nullptr)
    for (SimdLevel level : {SimdLevel::portable, SimdLevel::avx2})
      if (std::strcmp(name, to_string(level)) == 0) return level;
  return SimdLevel::avx512;
}

void load_row(DType dtype, const void* row, float scale, float* out) {
  at_level(load_row_avx512, load_row_avx2, load_row_portable)(dtype, row, scale, out);
}

void load_rows(DType dtype, const void* first, int64_t stride_bytes, int count, float scale,
               float* out, const void* prefetch) {
  at_level(load_rows_avx512, load_rows_avx2, load_rows_portable)(dtype, first, stride_bytes, count,
                                                                 scale, out, prefetch);
}

void dot_rows_keys(const float* rows, int num_rows, const float* keys, int num_keys,
                   DotLayout out) {
  at_level(dot_rows_keys_avx512, dot_rows_keys_avx2, dot_rows_keys_portable)(rows, num_rows, keys,
                                                                             num_keys, out);
}

void widen_keys_transposed(DType dtype, const void* keys, int64_t key_stride, int num_keys,
                           float* out, float* rows8) {
  at_level(widen_keys_transposed_avx512, widen_keys_transposed_avx2,
           widen_keys_transposed_portable)(dtype, keys, key_stride, num_keys, out, rows8);
}

void dot_rows_transposed_keys(const float* rows, int num_rows, const float* keys_t, int num_keys,
                              float* out, int64_t out_stride) {
  at_level(dot_rows_transposed_keys_avx512, dot_rows_transposed_keys_avx2,
           dot_rows_transposed_keys_portable)(rows, num_rows, keys_t, num_keys, out, out_stride);
}

void dot_keys_queries_in_lanes(const float* queries_t, int group, const float* keys, int num_keys,
                               float* out) {
  at_level(dot_keys_queries_in_lanes_avx512, dot_keys_queries_in_lanes_avx2,
           dot_keys_queries_in_lanes_portable)(queries_t, group, keys, num_keys, out);
}

float max_propagating_nan(const float* values, int count) {
  return at_level(max_propagating_nan_avx512, max_propagating_nan_avx2,
                  max_propagating_nan_portable)(values, count);
}

void softmax_weights(float* values, int64_t num_keys, int group, const float* max_logit,
                     float* denominator) {
  at_level(softmax_weights_avx512, softmax_weights_avx2, softmax_weights_portable)(
      values, num_keys, group, max_logit, denominator);
}

void accumulate_weighted_rows(float* acc, int num_rows, const float* weights,
                              int64_t weight_stride, const float* values, int num_values) {
  at_level(accumulate_weighted_rows_avx512, accumulate_weighted_rows_avx2,
           accumulate_weighted_rows_portable)(acc, num_rows, weights, weight_stride, values,
                                              num_values);
}

} // namespace m3sa::cpu
