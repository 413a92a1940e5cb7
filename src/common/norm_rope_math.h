#pragma once
// The fp32 arithmetic of norm_rope_insert, shared by the CPU and CUDA backends so that the two
// agree bit for bit (docs/contract.md §7): every operation is spelled
// out with its rounding (no compiler contraction into FMAs), the sum of squares has one fixed order
// (four quarters of a row, the four CUDA lanes that hold it), and computed cos/sin come from one
// double-precision routine made of correctly rounded operations only (no libm, whose last bits
// differ by platform). The reference backend does not use this file: it computes in double on its
// own.
#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace m3sa::detail::norm_rope {

// A 128-element row as 4 quarters of 32, each quarter four 8-dim chunks: quarter q holds chunks
// q, q + 4, q + 8 and q + 12 (dims [8q, 8q + 8), [32 + 8q, ...), [64 + 8q, ...), [96 + 8q, ...)).
// The four CUDA lanes of a row then touch 64 contiguous bytes per access, and each lane holds both
// halves of 8 RoPE pairs (i, i + 32), i in [8q, 8q + 8): elements e and 8 + e. Element k of quarter
// q is dim quarter_dim(q, k).
inline constexpr int kQuarters = 4;
inline constexpr int kQuarterElems = 32;
inline constexpr int kRotaryPairs = 32;
inline constexpr int kChunkElems = 8;
M3SA_HOST_DEVICE int quarter_dim(int q, int k) {
  return 32 * (k / kChunkElems) + kChunkElems * q + k % kChunkElems;
}

M3SA_HOST_DEVICE float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
M3SA_HOST_DEVICE float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
M3SA_HOST_DEVICE float fused(float a, float b, float c) { // a * b + c, one rounding
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
M3SA_HOST_DEVICE float divide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
M3SA_HOST_DEVICE float square_root(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
M3SA_HOST_DEVICE double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
M3SA_HOST_DEVICE double dfused(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// One quarter's share of the sum of squares: its 32 squares accumulated in element order.
M3SA_HOST_DEVICE float quarter_sum_of_squares(const float (&x)[kQuarterElems]) {
  float sum = 0.f;
  for (int k = 0; k < kQuarterElems; ++k) sum = fused(x[k], x[k], sum);
  return sum;
}

// The row's sum from its quarters: (q0 + q1) + (q2 + q3), which is also what every lane of a
// two-step shuffle butterfly (partners 1 then 2 apart) ends with, since fp32 addition commutes.
M3SA_HOST_DEVICE float combine_quarters(float q0, float q1, float q2, float q3) {
  return add(add(q0, q1), add(q2, q3));
}

// 1 / sqrt(mean(x^2) + eps) from the full sum of squares (the mean's 1/128 is exact).
M3SA_HOST_DEVICE float inverse_rms(float sum_of_squares, float eps) {
  return divide(1.f, square_root(add(mul(sum_of_squares, 1.f / 128.f), eps)));
}

// x * inv_rms * gain, gain = offset + w (computed once per weight element with add()).
M3SA_HOST_DEVICE float normalize(float x, float inv_rms, float gain) {
  return mul(mul(x, inv_rms), gain);
}

// NeoX rotation of the pair (x1, x2) = (x[i], x[i + 32]).
M3SA_HOST_DEVICE float rotate_first(float x1, float x2, float c, float s) {
  return fused(x1, c, -mul(x2, s)); // x1 cos - x2 sin
}
M3SA_HOST_DEVICE float rotate_second(float x1, float x2, float c, float s) {
  return fused(x2, c, mul(x1, s)); // x2 cos + x1 sin
}

// theta^(-i/32) rounded to fp32, the frequency of pair i. Host only: the backends compute the 32
// values on the host with this one call, so they all see the same bits.
inline float inverse_frequency(double theta, int i) {
  return static_cast<float>(std::pow(theta, -i / 32.0));
}

// cos and sin of position * inv_freq, rounded to fp32. The angle is exact in double (24-bit
// position times 24-bit frequency); it is reduced by pi/2 in three parts (fdlibm's split; the
// first part has 33 bits, so k * part1 is exact for k < 2^20 and the FMA keeps the remainder
// exact up to 2^24), then evaluated by Taylor polynomials of degree 19 / 18 on |r| <= pi/4
// (truncation below 1e-19).
M3SA_HOST_DEVICE void rope_cos_sin(int64_t position, float inv_freq, float* cos_out,
                                   float* sin_out) {
  const double angle = dmul(static_cast<double>(position), static_cast<double>(inv_freq));
  const double k = rint(dmul(angle, 6.36619772367581382433e-01)); // 2 / pi
  double r = dfused(-k, 1.57079632673412561417e+00, angle);
  r = dfused(-k, 6.07710050630396597660e-11, r);
  r = dfused(-k, 2.02226624871116645580e-21, r);
  const double z = dmul(r, r);
  // Taylor coefficients, highest power first: sin = r + r z P(z), cos = 1 + z Q(z).
  constexpr double kSin[] = {-1.0 / 121645100408832000.0,
                             1.0 / 355687428096000.0,
                             -1.0 / 1307674368000.0,
                             1.0 / 6227020800.0,
                             -1.0 / 39916800.0,
                             1.0 / 362880.0,
                             -1.0 / 5040.0,
                             1.0 / 120.0,
                             -1.0 / 6.0};
  constexpr double kCos[] = {-1.0 / 6402373705728000.0,
                             1.0 / 20922789888000.0,
                             -1.0 / 87178291200.0,
                             1.0 / 479001600.0,
                             -1.0 / 3628800.0,
                             1.0 / 40320.0,
                             -1.0 / 720.0,
                             1.0 / 24.0,
                             -0.5};
  double sp = kSin[0], cp = kCos[0];
  for (int i = 1; i < 9; ++i) {
    sp = dfused(sp, z, kSin[i]);
    cp = dfused(cp, z, kCos[i]);
  }
  const double sin_r = dfused(dmul(sp, z), r, r);
  const double cos_r = dfused(cp, z, 1.0);
  const int quadrant = static_cast<int>(static_cast<int64_t>(k) & 3);
  const double s = quadrant == 0 ? sin_r : quadrant == 1 ? cos_r : quadrant == 2 ? -sin_r : -cos_r;
  const double c = quadrant == 0 ? cos_r : quadrant == 1 ? -sin_r : quadrant == 2 ? -cos_r : sin_r;
  *cos_out = static_cast<float>(c);
  *sin_out = static_cast<float>(s);
}

} // namespace m3sa::detail::norm_rope
