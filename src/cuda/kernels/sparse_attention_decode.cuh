#pragma once
// Sparse attention for decode rows (docs/contract.md, "Sparse attention"): one query token per
// work item, so each item reads its own selected blocks once.
//
// Work item = (token, KV head, split): the token's selection is cut into `splits` ranges of
// slots (batch 1 gets one or two selected blocks per CTA, a full batch one range), CTAs
// are persistent (as many as are resident) and stride over the items. A CTA's 4 warps share the
// 16 query rows of the GQA group and take 16 keys each of every 64-key stage; K and V of a stage
// arrive by cp.async, kStages - 1 stages ahead of the MMAs (bf16 3 stages, e4m3 4: its stages
// are half the bytes, and the copy rate needs the bytes in flight). The warps merge their
// (m, l, O) in shared memory. With splits on SM90 (kMergeInCluster), the splits of a (token, KV
// head) are the CTAs of one thread-block cluster: each leaves its merged partial in its own
// shared memory and, after a cluster barrier, every CTA merges a share of the 16 rows from all
// the partials through distributed shared memory (one DSMEM round; no global traffic, fence or
// atomic: the global merge below was ~6 us of batch 1, bench/NOTES.md). Elsewhere each CTA
// writes its merged partial to the workspace and the last CTA to arrive for a (token, KV head)
// merges them (log-sum-exp) and writes the output, then resets the arrival counter.
// Keys past the token's position are zero-filled by the copy, never read. Bad metadata is
// flagged (attention_common.cuh) and contributes no key.
// fp8 KV: each warp widens the e4m3 rows its MMAs read into a bf16 tile in shared memory (exact).
#include <cooperative_groups.h>

#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/decode_stamps.cuh"

namespace m3sa::cuda {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeStageKeys = 64;
template <bool kFp8> inline constexpr int kDecodeStages = kFp8 ? 4 : 3;
// clang-format reads the template arguments below as comparisons:
// clang-format off
template <bool kFp8>
inline constexpr int kDecodeRawStageBytes = 2 * kDecodeStageKeys * (kFp8 ? 128 : kRowBytes); // K, V
template <bool kFp8>
inline constexpr int kDecodeSmemBytes =
    kDecodeStages<kFp8> * kDecodeRawStageBytes<kFp8> +
    (kFp8 ? 2 * kDecodeStageKeys * kRowBytes : 0); // + the widened bf16 K|V tile
// clang-format on
// Cluster merge: the CTA's partial (slot 4) after the four warps' partials (slots 0-3).
inline constexpr int kClusterSlot = 4;
inline constexpr int kMaxClusterSplits = 16; // the largest (non-portable) cluster on SM90
static_assert(kDecodeSmemBytes<true> >= (kClusterSlot + 1) * kPartialFloats * 4 &&
                  kDecodeSmemBytes<false> >= (kClusterSlot + 1) * kPartialFloats * 4,
              "the warps' and the cluster's partials reuse the stage buffers");
static_assert(kDecodeThreads == 128, "the cluster merge gives a thread one of a row's 128 dims");
static_assert(kDecodeSmemBytes<true> <= 110 * 1024 && kDecodeSmemBytes<false> <= 110 * 1024,
              "two CTAs per SM (kAttentionCtasPerSm)");

// Issues the copy of keys first_row .. first_row + 63 of `page` (head g) into the stage's K and V
// tiles (bf16: kRowBytes per row; e4m3: 128 B, widened later), rows at or past `visible` zero-
// filled and not read. The thread's rows and chunk are fixed (rows row0 + j * kRowsPerPass, one
// 16-byte chunk), so a row costs one pointer step per cache instead of copy_kv_rows' index math:
// the copies were a third of the kernel's instructions (session 6 SASS, bench/NOTES.md).
template <bool kFp8>
__device__ __forceinline__ void copy_stage_rows(const SparseAttentionParams& p, int64_t page, int g,
                                                int first_row, int visible, unsigned char* k_dst,
                                                unsigned char* v_dst) {
  constexpr int kElementBytes = kFp8 ? 1 : 2;
  constexpr int kChunks = 128 * kElementBytes / 16; // 16-byte chunks per row
  constexpr int kRowsPerPass = kDecodeThreads / kChunks;
  constexpr int kDstRowBytes = kFp8 ? 128 : kRowBytes;
  static_assert(kDecodeStageKeys % kRowsPerPass == 0, "whole passes per stage");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const int64_t k_step = p.k_stride_token * kElementBytes * kRowsPerPass;
  const int64_t v_step = p.v_stride_token * kElementBytes * kRowsPerPass;
  const unsigned char* k_src = cache_row<kFp8>(p.k_cache, p.k_stride_page, p.k_stride_token,
                                               p.k_stride_head, page, first_row + row0, g) +
                               chunk * 16;
  const unsigned char* v_src = cache_row<kFp8>(p.v_cache, p.v_stride_page, p.v_stride_token,
                                               p.v_stride_head, page, first_row + row0, g) +
                               chunk * 16;
  k_dst += row0 * kDstRowBytes + chunk * 16;
  v_dst += row0 * kDstRowBytes + chunk * 16;
#pragma unroll
  for (int j = 0; j < kDecodeStageKeys / kRowsPerPass; ++j) {
    const bool fill = row0 + j * kRowsPerPass < visible; // else: zeros, the first row not read
    cp_async_16(k_dst + j * kRowsPerPass * kDstRowBytes, fill ? k_src + j * k_step : k_src, fill);
    cp_async_16(v_dst + j * kRowsPerPass * kDstRowBytes, fill ? v_src + j * v_step : v_src, fill);
  }
}

// fp8: this warp's 16 K rows and 16 V rows of a stage (the only rows its MMAs read), widened from
// the raw e4m3 stage (K rows, then V rows, 128 B each) into `widened` (same order, bf16 rows):
// no barrier beyond the warp.
__device__ __forceinline__ void widen_warp_rows(const unsigned char* raw, unsigned char* widened,
                                                int warp, int lane) {
  __syncwarp(); // the warp's MMAs of the previous stage have read these rows
#pragma unroll
  for (int i = lane; i < 2 * 16 * 8; i += 32) {
    const int r = i / 8, chunk = i % 8; // r: K rows 0..15, then V rows
    const int row = warp * 16 + r + (r < 16 ? 0 : kDecodeStageKeys - 16);
    const uint4 bits = *reinterpret_cast<const uint4*>(raw + row * 128 + chunk * 16);
    widen_e4m3x16_to_bf16(bits, reinterpret_cast<uint4*>(widened + row * kRowBytes + chunk * 32));
  }
  __syncwarp();
}

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
    const int32_t block = lane < p.top_k
                              ? p.topk[g * p.topk_stride_head + int64_t{t} * p.topk_stride_token +
                                       lane * p.topk_stride_k]
                              : -1;
    int request = min(t / max(1, p.decode_q_len), p.num_requests - 1);
    int q_begin = p.cu_q_lens[request], q_end = p.cu_q_lens[request + 1];
    int seq_len = p.seq_lens[request]; // with the guess's bounds: one round of loads
    if (!(q_begin <= t && t < q_end)) {
      request = request_of_token(p.cu_q_lens, p.num_requests, t);
      q_begin = p.cu_q_lens[request], q_end = p.cu_q_lens[request + 1];
      seq_len = p.seq_lens[request];
    }
    const int position = lane == 0 ? token_position(p, q_begin, q_end, seq_len, t, true) : 0;
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The splits of a (token, KV head) as the p.splits CTAs of this cluster: this CTA's merged
// partial goes to `slot` (its shared memory), and rows rank, rank + splits, ... are merged from
// every CTA's slot and written as token t's output (a thread per dim: one row per CTA and step).
// Same order of terms as the workspace merge (merge_rows): split 0 first.
__device__ __forceinline__ void merge_splits_in_cluster(const SparseAttentionParams& p,
                                                        const MergedRow& mine, float* slot, int t,
                                                        int g) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  store_merged_partial(mine, slot, threadIdx.x);
  cluster.sync(); // every split's partial is in place
  const int d = threadIdx.x, splits = p.splits;
  const float* parts[kMaxClusterSplits];
#pragma unroll
  for (int i = 0; i < kMaxClusterSplits; ++i)
    parts[i] = i < splits ? cluster.map_shared_rank(slot, i) : slot;
  for (int row = static_cast<int>(cluster.block_rank()); row < p.group; row += splits) {
    // Every split's m, l and O element in one round of DSMEM loads.
    float m[kMaxClusterSplits], l[kMaxClusterSplits], o[kMaxClusterSplits];
#pragma unroll
    for (int i = 0; i < kMaxClusterSplits; ++i) {
      m[i] = i < splits ? parts[i][row] : -INFINITY;
      l[i] = i < splits ? parts[i][kAttentionRows + row] : 0.f;
      o[i] = i < splits ? parts[i][2 * kAttentionRows + row * 128 + d] : 0.f;
    }
    float m_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxClusterSplits; ++i) m_max = fmaxf(m_max, m[i]);
    const float m_use = m_max == -INFINITY ? 0.f : m_max;
    float l_sum = 0.f, o_sum = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxClusterSplits; ++i) {
      if (m[i] == -INFINITY) continue; // no key of this row in split i
      const float w = exp2f(m[i] - m_use);
      l_sum += w * l[i];
      o_sum += w * o[i];
    }
    const float inverse = l_sum > 0.f ? p.v_scale / l_sum : 0.f;
    const int64_t head = int64_t{g} * p.group + row;
    static_cast<__nv_bfloat16*>(
        p.out)[int64_t{t} * p.out_stride_token + head * p.out_stride_head + d] =
        __float2bfloat16_rn(o_sum * inverse);
    if (p.lse && d == 0)
      p.lse[int64_t{t} * p.lse_stride_token + head * p.lse_stride_head] =
          l_sum > 0.f ? (m_max + __log2f(l_sum)) * kLn2 : -INFINITY;
  }
  cluster.sync(); // the partials stay until every CTA of the cluster has read them
}
#endif

// The end of a decode item (token t, KV head g, `split` of the pair's selection), once each of the
// CTA's four warps has stored its partial (`warp_stride` bytes apart from `warp_partials`): the
// warps' partials merged, then the output written (one split), or the splits merged in the
// cluster (`cluster_slot`: shared memory free for the CTA's merged partial), or through the
// workspace by the last CTA to arrive (`last_arrival`: a shared flag), or left in the workspace
// for merge_decode_splits_kernel.
__device__ __forceinline__ void finish_decode_item(const SparseAttentionParams& p,
                                                   const float* warp_partials, int64_t warp_stride,
                                                   float* cluster_slot, int64_t pair, int split,
                                                   int t, int g, int32_t* last_arrival) {
  __syncthreads();
  const MergedRow warps = merge_rows<false, false>(warp_partials, warp_stride, 4, threadIdx.x);
  if (p.splits == 1) {
    store_output_row(p, warps, t, g, threadIdx.x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  } else if (p.split_merge == kMergeInCluster) {
    merge_splits_in_cluster(p, warps, cluster_slot, t, g);
#endif
  } else {
    store_merged_partial(warps, p.partials + (pair * p.splits + split) * kPartialFloats,
                         threadIdx.x);
    if (p.split_merge == kMergeByNextKernel) return; // the merge kernel waits for this grid
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int arrived = atomicAdd(p.arrivals + pair, 1);
      *last_arrival = arrived == p.splits - 1;
      if (*last_arrival) atomicExch(p.arrivals + pair, 0); // ready for the next launch
    }
    __syncthreads();
    if (*last_arrival) {
      __threadfence();
      store_output_row(p,
                       merge_rows<false, true>(p.partials + pair * p.splits * kPartialFloats,
                                               kPartialFloats * sizeof(float), p.splits,
                                               threadIdx.x),
                       t, g, threadIdx.x);
    }
  }
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

  M3SA_DECODE_STAMPS_BEGIN();
  M3SA_DECODE_STAMP(0);
  // Launched to overlap the previous kernel (PDL) by SM90 plans.
  wait_for_prior_grids();
  allow_next_grid();
  M3SA_DECODE_STAMP(1);
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
    M3SA_DECODE_STAMP(2);
    const int position = sel.position;
    RowState st;
    st.reset();

    const int b_begin = sel.count * split / p.splits;
    const int stages = 2 * (sel.count * (split + 1) / p.splits - b_begin);
    const auto issue = [&](int s) {
      if (s < stages) {
        const int b = b_begin + s / 2, first_key = sel.block[b] * 128 + (s % 2) * kDecodeStageKeys;
        unsigned char* dst = smem + (s % kStages) * kRawStageBytes;
        copy_stage_rows<kFp8>(p, sel.page[b], g, (s % 2) * kDecodeStageKeys,
                              position - first_key + 1, dst, dst + kRawTileBytes);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int s = 0; s < stages; ++s) {
      cp_async_wait<kStages - 2>();
      __syncthreads(); // stage s landed for all; stage s - 1 is free for the next copy
      if (s == 0) M3SA_DECODE_STAMP(3);
      issue(s + kStages - 1);
      const unsigned char* k_tile = smem + (s % kStages) * kRawStageBytes;
      if constexpr (kFp8) {
        widen_warp_rows(k_tile, widened, warp, threadIdx.x & 31);
        k_tile = widened;
      }
      const int first_key = sel.block[b_begin + s / 2] * 128 + (s % 2) * kDecodeStageKeys;
      attend_keys(st, q, k_tile, k_tile + kDecodeStageKeys * kRowBytes, warp * 16,
                  position - first_key, logit_scale);
    }
    cp_async_wait<0>();
    __syncthreads(); // the stage buffers are free for the partials
    M3SA_DECODE_STAMP(4);

    float* partials = reinterpret_cast<float*>(smem);
    store_partial(st, partials + warp * kPartialFloats);
    finish_decode_item(p, partials, kPartialFloats * sizeof(float),
                       partials + kClusterSlot * kPartialFloats, pair, split, t, g,
                       &sel.last_arrival);
    M3SA_DECODE_STAMP(5);
    __syncthreads(); // the selection and the buffers are reused by the next item
  }
  M3SA_DECODE_STAMPS_END(p.splits, 0);
}

// `grid` CTAs in clusters of `cluster` (1: no cluster attribute); `attribute` outlives the config.
// (Occupancy queries only: launches go through launch_with_shared_memory.)
inline cudaLaunchConfig_t decode_launch_config(int grid, int cluster, int smem, cudaStream_t stream,
                                               cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kDecodeThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  *attribute = cudaLaunchAttribute{};
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute->val.clusterDim.y = attribute->val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

// How many clusters of `cluster` CTAs (2..16) of a decode kernel the current device holds at
// once: 0 where the kernel has no SM90 code (the cluster merge is compiled for SM90 only) or the
// device cannot run such a cluster. Plan time only.
template <typename Params>
int decode_active_clusters(void (*kernel)(Params), int smem, int cluster) {
  cudaFuncAttributes attributes{};
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      decode_launch_config(cluster, cluster, smem, nullptr, &attribute);
  int clusters = 0;
  if (cluster < 2 || cluster > kMaxClusterSplits ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess || attributes.ptxVersion < 90 ||
      set_launch_attributes(kernel, smem, cluster) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError(); // a refusal here only means: no cluster merge
    return 0;
  }
  return clusters;
}

// Host side of the cp.async kernel, one instantiation per translation unit
// (sparse_attention_decode_{bf16,fp8}.cu).
template <bool kFp8>
cudaError_t launch_decode_kernel(const SparseAttentionParams& p, int grid, int cluster,
                                 bool overlap_prior, cudaStream_t stream) {
  return launch_with_shared_memory(sparse_attention_decode_kernel<kFp8>, dim3(grid), kDecodeThreads,
                                   kDecodeSmemBytes<kFp8>, stream, p,
                                   LaunchOptions{cluster, overlap_prior});
}
template <bool kFp8> int decode_kernel_active_clusters(int cluster) {
  return decode_active_clusters(sparse_attention_decode_kernel<kFp8>, kDecodeSmemBytes<kFp8>,
                                cluster);
}

} // namespace m3sa::cuda
