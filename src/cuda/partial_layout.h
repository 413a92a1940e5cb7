#pragma once
// Where an attention partial's O element (row, dim) sits after its m and l (host- and device-
// includable, no CUDA headers; the CPU tests check the layouts: partial_layout_test.cpp).
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

} // namespace m3sa::cuda
