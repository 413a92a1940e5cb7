#pragma once
// Row kernels shared by the CPU ops. No -march flags: hot functions carry target clones so one
// binary uses AVX2+FMA where the machine has it and plain SSE2 elsewhere.
#include <cstdint>

#include "m3sa/config.h"
#include "m3sa/types.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define M3SA_CPU_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define M3SA_CPU_CLONES
#endif

namespace m3sa::cpu {

// One 128-wide row of bf16 / e4m3 / f32 storage to fp32, times `scale`.
void load_row(DType dtype, const void* row, float scale, float* out);
// One 64-wide rotary row (a cos_sin_cache row: 32 cos, then 32 sin) to fp32.
void load_rotary_row(DType dtype, const void* row, float* out);

// out[i] = dot(rows[i], key) for i < num_rows; rows are [num_rows][128] contiguous.
void dot_rows(const float* rows, int num_rows, const float* key, float* out);

// acc[i][:] += sum over n < num_values of weights[n * weight_stride + i] * values[n][:], for
// i < num_rows. acc is [num_rows][128], values [num_values][128]: each acc row is loaded and stored
// once per call, not once per value row.
void accumulate_weighted_rows(float* acc, int num_rows, const float* weights, int64_t weight_stride,
                              const float* values, int num_values);

} // namespace m3sa::cpu
