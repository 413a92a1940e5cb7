#pragma once
// Row kernels shared by the CPU ops. No -march flags: hot functions carry target clones so one
// binary uses AVX2+FMA where the machine has it and plain SSE2 elsewhere. The clone is chosen by
// ISA level (x86-64-v3: AVX2, FMA, BMI2, ...), not "arch=haswell", which GCC's resolver takes on a
// Haswell-model CPU only, so that every other AVX2 machine (Zen, Skylake, Sapphire Rapids) ran the
// SSE2 clone.
#include <cstdint>

#include "m3sa/config.h"
#include "m3sa/types.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define M3SA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Before GCC 12 (whose resolver dispatches on ISA levels): the AVX2 feature bit, without FMA.
#define M3SA_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define M3SA_CPU_CLONES
#endif

namespace m3sa::cpu {

// One 128-wide row of bf16 / e4m3 / f32 storage to fp32, times `scale`.
void load_row(DType dtype, const void* row, float scale, float* out);
// One 64-wide rotary row (a cos_sin_cache row: 32 cos, then 32 sin) to fp32.
void load_rotary_row(DType dtype, const void* row, float* out);

// Where dot_rows_keys writes the dot of row i and key j: data[i * row_stride + j * key_stride].
struct DotLayout {
  float* data;
  int64_t row_stride, key_stride;
};
// The dots of rows [num_rows][128] and keys [num_keys][128] (both contiguous) into `out`, each a
// sum in fp32 over eight lanes of dims.
void dot_rows_keys(const float* rows, int num_rows, const float* keys, int num_keys, DotLayout out);

// The block scorer's form of the dots, keys in lanes: each dot sums its 128 products in dim order
// in one lane, with no sums across lanes (dot_rows_keys's tiles spend about a quarter of their
// instructions on those), so the tiles run near the FMA rate.
//
// widen_keys_transposed: keys [num_keys][128] of `dtype` (key j at keys + j * key_stride bytes)
// into out[d * 128 + j], fp32, for d < 128 and j < round_up(num_keys, 16) <= 128 (zeros past
// num_keys). `rows8`: scratch of 8 x 128 floats.
void widen_keys_transposed(DType dtype, const void* keys, int64_t key_stride, int num_keys,
                           float* out, float* rows8);
// out[i * out_stride + j] = the sum over d in order of rows[i][d] * keys_t[d * 128 + j], for
// i < num_rows and j < num_keys (a multiple of 16, <= 128).
void dot_rows_transposed_keys(const float* rows, int num_rows, const float* keys_t, int num_keys,
                              float* out, int64_t out_stride);

// The attention's form, queries in lanes: out[j * group + i] = the sum over d in order of
// queries_t[d * group + i] * keys[j][d], for i < group (8 or 16) and j < num_keys (keys [num_keys]
// [128], fp32): a GQA group's logits of a key side by side, each summed in one lane, with no sums
// across lanes and no transpose of the keys (the group's queries are transposed once).
void dot_keys_queries_in_lanes(const float* queries_t, int group, const float* keys, int num_keys,
                               float* out);

// Asks for the cache lines of [p, p + bytes) ahead of their use.
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t offset = 0; offset < bytes; offset += 64)
    __builtin_prefetch(static_cast<const char*>(p) + offset);
}

// Softmax weights in place: values[n * group + h] = exp(values[n * group + h] - max_logit[h]) for
// n < num_keys, h < group, then denominator[h] = the sum of head h's weights in key order. The
// exponential is a vector polynomial (within 2 ulp of std::exp; below e^-87 it gives 0, and NaN
// stays NaN) where the group divides or is a multiple of 8, std::exp otherwise.
void softmax_weights(float* values, int64_t num_keys, int group, const float* max_logit,
                     float* denominator);

// The largest of values[0, count), NaN if any is NaN (a block score's maximum, contract §4), -inf
// for none.
float max_propagating_nan(const float* values, int count);

// acc[i][:] += sum over n < num_values of weights[n * weight_stride + i] * values[n][:], for
// i < num_rows. acc is [num_rows][128], values [num_values][128]: each acc row is loaded and stored
// once per call, not once per value row.
void accumulate_weighted_rows(float* acc, int num_rows, const float* weights, int64_t weight_stride,
                              const float* values, int num_values);

} // namespace m3sa::cpu
