#include "cpu/simd.h"

#include "m3sa/numeric.h"

namespace m3sa::cpu {
namespace {

struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) value[i] = e4m3_bits_to_float(static_cast<uint8_t>(i));
  }
};
const E4m3Table kE4m3;

// `count` is a compile-time width so that each caller's loop vectorises.
template <int count> void load_values(DType dtype, const void* row, float scale, float* out) {
  if (dtype == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(row);
#pragma omp simd
    for (int d = 0; d < count; ++d) out[d] = bf16_bits_to_float(src[d]) * scale;
  } else if (dtype == DType::fp8_e4m3) {
    const uint8_t* src = static_cast<const uint8_t*>(row);
    for (int d = 0; d < count; ++d) out[d] = kE4m3.value[src[d]] * scale;
  } else {
    const float* src = static_cast<const float*>(row);
#pragma omp simd
    for (int d = 0; d < count; ++d) out[d] = src[d] * scale;
  }
}

} // namespace

M3SA_CPU_CLONES void load_row(DType dtype, const void* row, float scale, float* out) {
  load_values<kHeadDim>(dtype, row, scale, out);
}

void load_rotary_row(DType dtype, const void* row, float* out) {
  load_values<kRotaryDim>(dtype, row, 1.f, out);
}

M3SA_CPU_CLONES void dot_rows(const float* rows, int num_rows, const float* key, float* out) {
  int i = 0;
  // Four rows per pass: four independent accumulation chains share each load of `key`.
  for (; i + 4 <= num_rows; i += 4) {
    const float* r0 = rows + (i + 0) * kHeadDim;
    const float* r1 = rows + (i + 1) * kHeadDim;
    const float* r2 = rows + (i + 2) * kHeadDim;
    const float* r3 = rows + (i + 3) * kHeadDim;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int d = 0; d < kHeadDim; ++d) {
      s0 += r0[d] * key[d];
      s1 += r1[d] * key[d];
      s2 += r2[d] * key[d];
      s3 += r3[d] * key[d];
    }
    out[i] = s0, out[i + 1] = s1, out[i + 2] = s2, out[i + 3] = s3;
  }
  for (; i < num_rows; ++i) {
    const float* r = rows + i * kHeadDim;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < kHeadDim; ++d) s += r[d] * key[d];
    out[i] = s;
  }
}

M3SA_CPU_CLONES void accumulate_weighted_rows(float* acc, int num_rows, const float* weights,
                                              int64_t weight_stride, const float* values,
                                              int num_values) {
  constexpr int kSlice = 32; // four AVX2 registers of accumulators per pass over the values
  for (int i = 0; i < num_rows; ++i) {
    for (int d0 = 0; d0 < kHeadDim; d0 += kSlice) {
      float sum[kSlice];
      float* a = acc + i * kHeadDim + d0;
#pragma omp simd
      for (int d = 0; d < kSlice; ++d) sum[d] = a[d];
      for (int n = 0; n < num_values; ++n) {
        const float w = weights[n * weight_stride + i];
        const float* v = values + n * kHeadDim + d0;
#pragma omp simd
        for (int d = 0; d < kSlice; ++d) sum[d] += w * v[d];
      }
#pragma omp simd
      for (int d = 0; d < kSlice; ++d) a[d] = sum[d];
    }
  }
}

} // namespace m3sa::cpu
