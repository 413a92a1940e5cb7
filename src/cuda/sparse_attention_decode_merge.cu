// Contract: merges the split partials of decode items (SplitMerge kMergeByNextKernel). The decode
// kernel launched just before this one in the stream leaves one fp32 partial (m, l, O of the 16
// query rows; attention_params.h kPartialFloats) per (token, KV head, split) in p.partials and
// exits; this kernel merges each (token, KV head)'s splits by log-sum-exp, split 0 first, and
// writes the output rows (times v_scale / l, bf16) and lse as finish_decode_item would: zeros and
// -inf for a row without keys.
//
// Why a kernel rather than the last CTA to arrive: the arrival needs a fence after the partial's
// stores, an atomic, then the merging CTA's loads, three dependent memory round trips after the
// stream; stamps of the TMA kernel at B=32 16/1 put that finish at 3.3 us a CTA and 7.4 us in the
// merging CTA (bench/NOTES.md s10 r2). Launched with programmatic dependent launch, this grid is
// resident before the decode grid ends, and the grid boundary is its only wait.
//
// Mapping: a warp per (token, KV head, query row), 4 rows a CTA. Lane l owns dims 4 l .. 4 l + 3:
// it loads m, l and its float4 of O from 8 splits at once (one round of independent loads), folds
// them into its running (m, l, O), and goes on to the next 8.
#include "cuda/kernels/attention_common.cuh"
#include "cuda/launchers.h"

namespace m3sa::cuda {
namespace {

constexpr int kRowsPerCta = 4;
constexpr int kSplitsPerRound = 8;

__global__ void __launch_bounds__(32 * kRowsPerCta)
    merge_decode_splits_kernel(const SparseAttentionParams p) {
  wait_for_prior_grids(); // every split's partial is written
  allow_next_grid();
  const int row_groups = (p.group + kRowsPerCta - 1) / kRowsPerCta;
  const int64_t pair = blockIdx.x / row_groups; // (token, KV head)
  const int row = static_cast<int>(blockIdx.x % row_groups) * kRowsPerCta + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.group) return;
  const int g = static_cast<int>(pair % p.kv_heads);
  const int t = p.token_begin + static_cast<int>(pair / p.kv_heads);
  const float* first = p.partials + pair * p.splits * kPartialFloats;
  float m_run = -INFINITY, l_run = 0.f;
  float4 o_run = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int base = 0; base < p.splits; base += kSplitsPerRound) {
    float m[kSplitsPerRound], l[kSplitsPerRound];
    float4 o[kSplitsPerRound];
#pragma unroll
    for (int j = 0; j < kSplitsPerRound; ++j) {
      // Past the last split: its partial's loads repeated, its max taken as -inf (no key).
      const float* part = first + int64_t{min(base + j, p.splits - 1)} * kPartialFloats;
      m[j] = base + j < p.splits ? __ldcg(part + row) : -INFINITY;
      l[j] = __ldcg(part + kAttentionRows + row);
      o[j] = __ldcg(reinterpret_cast<const float4*>(part + 2 * kAttentionRows + row * 128) + lane);
    }
    float m_new = m_run;
#pragma unroll
    for (int j = 0; j < kSplitsPerRound; ++j) m_new = fmaxf(m_new, m[j]);
    if (m_new == -INFINITY) continue;         // no key in these splits or before
    const float carry = exp2f(m_run - m_new); // 0 while m_run is -inf
    l_run *= carry;
    o_run.x *= carry, o_run.y *= carry, o_run.z *= carry, o_run.w *= carry;
#pragma unroll
    for (int j = 0; j < kSplitsPerRound; ++j) {
      if (m[j] == -INFINITY) continue; // no key of this row in the split: O holds zeros
      const float w = exp2f(m[j] - m_new);
      l_run += w * l[j];
      o_run.x += w * o[j].x, o_run.y += w * o[j].y, o_run.z += w * o[j].z, o_run.w += w * o[j].w;
    }
    m_run = m_new;
  }
  const float inverse = l_run > 0.f ? p.v_scale / l_run : 0.f;
  const int64_t head = int64_t{g} * p.group + row;
  uint16_t* out = static_cast<uint16_t*>(p.out) + int64_t{t} * p.out_stride_token +
                  head * p.out_stride_head + 4 * lane;
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(o_run.x * inverse, o_run.y * inverse),
                                              pack_bf16x2(o_run.z * inverse, o_run.w * inverse));
  if (p.lse && lane == 0)
    p.lse[int64_t{t} * p.lse_stride_token + head * p.lse_stride_head] = row_lse(m_run, l_run);
}

} // namespace

cudaError_t launch_merge_decode_splits(const SparseAttentionParams& p, bool overlap_prior,
                                       cudaStream_t stream) {
  const int64_t pairs = int64_t{p.token_end - p.token_begin} * p.kv_heads;
  const int64_t grid = pairs * ((p.group + kRowsPerCta - 1) / kRowsPerCta);
  if (grid <= 0) return cudaSuccess;
  return launch_with_shared_memory(merge_decode_splits_kernel, dim3(static_cast<unsigned>(grid)),
                                   32 * kRowsPerCta, 0, stream, p, LaunchOptions{1, overlap_prior});
}

} // namespace m3sa::cuda
