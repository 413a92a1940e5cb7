#pragma once
// The decode attention's arithmetic that the CPU tests check (attention_math_test.cpp), host- and
// device-includable, no CUDA headers: where a partial's O element (row, dim) sits after its m and
// l, and the power of two that scales e4m3 attention's queries into fp16.
//
// The fp32 form (global memory, and the prefill's shared partials): rows of 128 floats. A decode
// CTA's warp partials in shared memory: rows padded to 136 floats and their 16-byte chunks
// swizzled (chunk c at c ^ ((c >> 3) & 3)), so that the warps' fragment stores (half-warps of 4
// rows x 4 lanes, float2 each) and the merge's loads (quarter-warps of one row's 8 threads, float4
// each, a thread's 4 chunks 4k .. 4k + 3) meet no bank conflict: in the fp32 form both were 4-way
// (batch 1's merge of its warps: 2,250 -> 960 cycles, bench/NOTES.md s12 r4 / r5 stamps).
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

} // namespace m3sa::cuda
