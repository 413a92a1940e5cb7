#pragma once
// Row kernels shared by the CPU ops. No -march flags: each kernel is built for three instruction
// sets and the widest the CPU has runs (SimdLevel below), so one binary uses AVX-512 on a server
// (Sapphire Rapids, Zen 4), AVX2 + FMA on other x86-64 machines and plain SSE2 elsewhere.
#include <cstdint>

#include "m3sa/config.h"
#include "m3sa/types.h"

namespace m3sa::cpu {

// The instruction set the row kernels run with. avx2 (AVX2 + FMA) and avx512 (F, BW, DQ, VL) give
// bit-identical results: every output is the same chain of FMAs in the same order, AVX-512 only
// carries 16 of those lanes a register instead of 8 (tests/unit/cpu_simd_test.cpp checks each
// kernel and whole ops). portable (on x86-64 SSE2, without FMA) rounds each product on its own, so
// its sums may differ in the last bits, within the contract's fp32 tolerance.
enum class SimdLevel : int { portable = 0, avx2 = 1, avx512 = 2 };
const char* to_string(SimdLevel level);
// The widest level this CPU (and its OS's saved register state) supports.
SimdLevel detected_simd_level();
// The level the kernels run at: the detected one, capped by M3SA_CPU_MAX_ISA=portable|avx2|avx512
// in the environment (read at the first kernel call; other values are ignored) - to reproduce
// another machine's results or time one level against another.
SimdLevel simd_level();
// Caps the level from now on (tests; replaces the environment's cap). A cap above the detected
// level leaves the detected one.
void set_simd_level_cap(SimdLevel cap);
// The cap a value of M3SA_CPU_MAX_ISA names: avx512 (no cap) for null or an unknown name.
SimdLevel simd_level_cap_named(const char* name);

// One 128-wide row of bf16 / e4m3 / f32 storage to fp32, times `scale`.
void load_row(DType dtype, const void* row, float scale, float* out);
// Rows j < count of `dtype` at first + j * stride_bytes to fp32 out[j][128], times `scale` (as
// load_row, with one dispatch for the whole block: a decode step widens a block's 128 keys this
// way); while at it, asks for the cache lines of the rows at prefetch + j * stride_bytes (the next
// block's, whose page the hardware prefetchers do not follow) unless `prefetch` is null.
void load_rows(DType dtype, const void* first, int64_t stride_bytes, int count, float scale,
               float* out, const void* prefetch);
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
