#pragma once
// Sparse attention for decode rows (docs/contract.md, "Sparse attention"): one query token per
// work item, so each item reads its own selected blocks once.
//
// Work item = (token, KV head, split): the token's selection is cut into `splits` ranges of
// slots (batch 1 gets two selected blocks per CTA, a full batch one range), CTAs
// are persistent (as many as are resident) and stride over the items. A CTA's 4 warps share the
// 16 query rows of the GQA group and take 16 keys each of every 64-key stage; K and V of a stage
// arrive by cp.async, kStages - 1 stages ahead of the MMAs (bf16 3 stages, e4m3 4: its stages
// are half the bytes, and the copy rate needs the bytes in flight). The warps merge their
// (m, l, O) in shared memory; with splits, each CTA writes its merged partial to the workspace
// and the last CTA to arrive for a (token, KV head) merges them (log-sum-exp) and writes the
// output, then resets the arrival counter for the next launch.
// Keys past the token's position are zero-filled by the copy, never read. Bad metadata is
// flagged (attention_common.cuh) and contributes no key.
// fp8 KV: e4m3 stages are widened to one bf16 tile in shared memory (exact).
#include "cuda/kernels/attention_common.cuh"

namespace m3sa::cuda {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeStageKeys = 64;
template <bool kFp8> inline constexpr int kDecodeStages = kFp8 ? 4 : 3;
template <bool kFp8>
inline constexpr int kDecodeRawStageBytes = 2 * kDecodeStageKeys * (kFp8 ? 128 : kRowBytes); // K, V
template <bool kFp8>
inline constexpr int kDecodeSmemBytes =
    kDecodeStages<kFp8> * kDecodeRawStageBytes<kFp8> +
    (kFp8 ? 2 * kDecodeStageKeys * kRowBytes : 0); // + the widened bf16 K|V tile
static_assert(kDecodeSmemBytes<true> >= 4 * kPartialFloats * 4 &&
                  kDecodeSmemBytes<false> >= 4 * kPartialFloats * 4,
              "the warps' partials reuse the stage buffers");
static_assert(kDecodeSmemBytes<true> <= 110 * 1024 && kDecodeSmemBytes<false> <= 110 * 1024,
              "two CTAs per SM (kAttentionCtasPerSm)");

// The token's valid selected blocks in ascending order, with their pages.
struct DecodeSelection {
  int32_t position;
  int32_t count;
  int32_t block[kMaxSelection];
  int64_t page[kMaxSelection];
  int32_t last_arrival;
};

__device__ __forceinline__ void select_blocks(const SparseAttentionParams& p, int t, int g,
                                              DecodeSelection& sel) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) { // one warp: ballot-compact the slots that hold a visible block
    // Every load that does not depend on another is issued at once: the selection slot, and the
    // request's bounds and length under the decode layout's guess (request t / decode_q_len),
    // which a binary search replaces only where the metadata does not follow that layout.
    const int32_t block =
        lane < p.top_k ? p.topk[g * p.topk_stride_head + int64_t{t} * p.topk_stride_token +
                                lane * p.topk_stride_k]
                       : -1;
    int request = min(t / max(1, p.decode_q_len), p.num_requests - 1);
    if (!(p.cu_q_lens[request] <= t && t < p.cu_q_lens[request + 1]))
      request = request_of_token(p.cu_q_lens, p.num_requests, t);
    const int position = lane == 0 ? token_position(p, request, t) : 0;
    const int pos = __shfl_sync(0xffffffffu, position, 0);
    const int64_t page = lane < p.top_k ? selected_page(p, request, pos, block) : -1;
    const unsigned valid = __ballot_sync(0xffffffffu, page >= 0);
    if (page >= 0) {
      const int slot = __popc(valid & ((1u << lane) - 1));
      sel.block[slot] = block;
      sel.page[slot] = page;
    }
    if (lane == 0) sel.position = pos, sel.count = __popc(valid);
  }
  __syncthreads();
}

template <bool kFp8>
__global__ void __launch_bounds__(kDecodeThreads, kAttentionCtasPerSm)
    sparse_attention_decode_kernel(const SparseAttentionParams p) {
  constexpr int kStages = kDecodeStages<kFp8>;
  constexpr int kRawStageBytes = kDecodeRawStageBytes<kFp8>;
  constexpr int kRawTileBytes = kRawStageBytes / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ DecodeSelection sel;
  unsigned char* widened = smem + kStages * kRawStageBytes; // fp8 only
  const int warp = threadIdx.x >> 5;
  const float logit_scale = logit_scale_log2(p.k_scale);

  const int tokens = p.token_end - p.token_begin;
  const int64_t items = int64_t{tokens} * p.kv_heads * p.splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int split = static_cast<int>(item % p.splits);
    const int64_t pair = item / p.splits; // (token, KV head)
    const int g = static_cast<int>(pair % p.kv_heads);
    const int t = p.token_begin + static_cast<int>(pair / p.kv_heads);
    uint32_t q[8][4];
    load_query(p, t, g, true, q); // in flight during the selection's loads (unused without keys)
    select_blocks(p, t, g, sel);
    const int position = sel.position;
    RowState st;
    st.reset();

    const int b_begin = sel.count * split / p.splits;
    const int stages = 2 * (sel.count * (split + 1) / p.splits - b_begin);
    const auto issue = [&](int s) {
      if (s < stages) {
        const int b = b_begin + s / 2, first_key = sel.block[b] * 128 + (s % 2) * kDecodeStageKeys;
        unsigned char* dst = smem + (s % kStages) * kRawStageBytes;
        copy_kv_rows<kFp8>(p, sel.page[b], g, (s % 2) * kDecodeStageKeys, kDecodeStageKeys,
                           position - first_key + 1, dst, dst + kRawTileBytes, threadIdx.x,
                           kDecodeThreads);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int s = 0; s < stages; ++s) {
      cp_async_wait<kStages - 2>();
      __syncthreads(); // stage s landed for all; stage s - 1 is free for the next copy
      issue(s + kStages - 1);
      const unsigned char* k_tile = smem + (s % kStages) * kRawStageBytes;
      if constexpr (kFp8) {
        widen_rows(k_tile, widened, 2 * kDecodeStageKeys, threadIdx.x, kDecodeThreads);
        __syncthreads();
        k_tile = widened;
      }
      const int first_key = sel.block[b_begin + s / 2] * 128 + (s % 2) * kDecodeStageKeys;
      attend_keys(st, q, k_tile, k_tile + kDecodeStageKeys * kRowBytes, warp * 16,
                  position - first_key, logit_scale);
    }
    cp_async_wait<0>();
    __syncthreads(); // the stage buffers are free for the partials

    float* partials = reinterpret_cast<float*>(smem);
    store_partial(st, partials + warp * kPartialFloats);
    __syncthreads();
    constexpr int64_t kStride = kPartialFloats * sizeof(float);
    const MergedRow warps = merge_rows<false, false>(partials, kStride, 4, threadIdx.x);
    if (p.splits == 1) {
      store_output_row(p, warps, t, g, threadIdx.x);
    } else {
      store_merged_partial(warps, p.partials + (pair * p.splits + split) * kPartialFloats,
                           threadIdx.x);
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        const int arrived = atomicAdd(p.arrivals + pair, 1);
        sel.last_arrival = arrived == p.splits - 1;
        if (sel.last_arrival) atomicExch(p.arrivals + pair, 0); // ready for the next launch
      }
      __syncthreads();
      if (sel.last_arrival) {
        __threadfence();
        store_output_row(p,
                         merge_rows<false, true>(p.partials + pair * p.splits * kPartialFloats,
                                                 kStride, p.splits, threadIdx.x),
                         t, g, threadIdx.x);
      }
    }
    __syncthreads(); // the selection and the buffers are reused by the next item
  }
}

} // namespace m3sa::cuda
