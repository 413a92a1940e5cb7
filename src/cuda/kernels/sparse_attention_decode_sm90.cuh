#pragma once
// Decode rows of sparse_attention on Hopper: the selected K/V streamed by TMA into a ring per
// warp (cuda.sparse_attention.sm90, decode rows whose K and V views TMA can address).
//
// Contract: as sparse_attention_decode_kernel (sparse_attention_decode.cuh), whose selection,
// split and merge code it shares: for each decode token and KV head, the GQA group's 16 query
// rows attend exactly over the keys of the token's selected blocks at positions <= its own
// (docs/contract.md "Sparse attention"); bad metadata is flagged and contributes no key.
//
// Why: at batch >= 32 the cp.async kernel is bound by its copy pipeline, not by its MMAs (copies
// alone took 141 of its 147 us at B=128 S=128K 64/4, ~3.8 TB/s; bench/NOTES.md s6), with a CTA
// barrier per stage and per-thread copies. The decode indexer's TMA ring (decode_topk_sm90.cuh)
// reached 95-104 % of the copy rate with four independent warps, each streaming its own ring of
// boxes with no CTA barrier and no producer warp; this kernel does the same for K and V.
//
// Mapping: one CTA of 4 warps a work item (token t, KV head g, split of the selection), two
// CTAs per SM, so that one CTA's set-up overlaps the other's stream. Warp 0 resolves the
// selection (its pages, in ascending block order); each warp then takes a contiguous quarter of
// the item's stages (kStageKeys keys of one selected block; the token's own block is cut after
// its position, so no box past it is read) and streams them through its own kSlots slots, each
// with one mbarrier: lane 0 issues a stage's K and V boxes (bf16: 16 tokens x 64 dims, two per
// tensor; e4m3: 32 tokens x 128 dims) and refills the slot kSlots stages on once the warp has
// read it. A warp keeps its (m, l, O) of the 16 query rows in registers (mma.sync m16n8k16, the
// cp.async kernel's numerics: fp32 logits, P split into bf16 high and low parts), then the four
// partials merge in shared memory and the splits through the workspace (finish_decode_item).
// Never launched in clusters: the plan leaves cluster merges (the smallest batches) to the
// cp.async kernel, since a cluster launch of this one drew synccheck "missing wait" reports on
// its mbarriers (bench/NOTES.md s9 r5) that no run without clusters showed.
// Launched with programmatic dependent launch: the barrier set-up overlaps the previous kernel.
// Keys past the position inside a box are masked in the logits and zeroed in the V fragments:
// TMA reads whole boxes, and the rows past seq_len may hold anything, NaN included.
// e4m3 K/V: K fragments are widened to fp16 in registers straight from the raw box (the queries'
// dims permuted to match, load_query<true>, and the queries scaled into fp16 for fp16 MMAs:
// queries_to_scaled_half); V is widened 16 keys at a time into the slot's K tile,
// whose keys are consumed by then, and read back by ldmatrix.trans - as fp16 (exact, one
// conversion per two values where bf16 takes four instructions), with P·V as fp16 MMAs on P split
// into fp16 high and low parts. (s10's attend_rate suggested the widening bounds e4m3; s12 r6,
// with K's conversions gone too, gained ~2 % at B=128 64/4, so it does not: bench/NOTES.md.)
#include "cuda/kernels/decode_stamps.cuh"
#include "cuda/kernels/sm90/hopper.cuh"
#include "cuda/kernels/sparse_attention_decode.cuh"

namespace m3sa::cuda {

template <bool kFp8> struct DecodeAttentionSm90Traits {
  static constexpr int kWarps = kDecodeThreads / 32;
  static constexpr int kStageKeys = kFp8 ? kDecodeSm90StageKeysFp8 : kDecodeSm90StageKeysBf16;
  static constexpr int kStagesPerBlock = 128 / kStageKeys;
  static constexpr int kSlots = 3;                             // ring slots a warp
  static constexpr int kBoxBytes = kStageKeys * 128;           // one TMA box: kStageKeys x 128 B
  static constexpr int kBoxesPerTile = kFp8 ? 1 : 2;           // bf16: dims 0-63, then 64-127
  static constexpr int kTileBytes = kBoxesPerTile * kBoxBytes; // K (or V) of a stage
  static constexpr int kSlotBytes = 2 * kTileBytes;            // K, then V
  // bf16 boxes carry the evict_first L2 policy: the selected K / V are read once, and dropping
  // them first keeps the rest of the L2 (s62 r1-r2: -0.7 % at B=128 64/4 on the H200; s64 r1 on
  // the H100: -1.5 to -1.9 % at 64/4, -1.6 to -2.6 % at 16/1). e4m3 keeps the normal policy:
  // the combined cache puts a token's K and V rows in one 256-B promoted fetch, and tagging
  // them cost the H200 1.4-2.7 % at 64/4 (the H100 gained).
  static constexpr bool kEvictFirst = !kFp8;
  static constexpr int kWarpBytes = kSlots * kSlotBytes;
  // The ring at a 1024-byte boundary (the swizzle atom).
  static constexpr int kSmemBytes = 1024 + kWarps * kWarpBytes;
  // After the stream, each warp's partial sits at the start of its ring.
  static_assert(kSharedPartialFloats * 4 <= kWarpBytes, "partials fit a warp's ring");
  static_assert(kSmemBytes <= 110 * 1024, "two CTAs per SM (kAttentionCtasPerSm)");
  // e4m3: the widened V of 16 keys ([2 halves][16 rows][128 B]) fits the slot's K tile.
  static_assert(!kFp8 || kTileBytes == 2 * 16 * 128, "widened V fills the K tile");
};

// e4m3 slots take K as fp16 MMA operands (one conversion per two values, where bf16 takes three
// more instructions a pair: ~190 fewer a slot and lane), so the queries go to fp16 as well, scaled
// by 2^e, which brings the group's largest |q| into [2^14, 2^15): fp16 keeps 11 bits where bf16
// has 8, so every query at or above 2^-28 of the largest converts exactly (smaller ones become
// fp16 subnormals, within 2^-25 of their value at that scale), the products stay exact in the
// fp32 accumulators, and the logits' scale takes 2^-e back - the logits of the bf16 MMAs. Every
// warp holds the whole group (load_query), so the scale needs no CTA barrier. Returns 2^-e.
__device__ __forceinline__ float queries_to_scaled_half(uint32_t (&q)[8][4]) {
  uint32_t largest = 0; // |q| as bf16 bits, two a word: their unsigned order is magnitude order
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) largest = __vmaxu2(largest, q[ks][r] & 0x7fff7fffu);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) largest = __vmaxu2(largest, __shfl_xor_sync(~0u, largest, o));
  const int e = fp16_query_scale_exponent(
      static_cast<int>(max(largest & 0xffffu, largest >> 16) >> 7)); // exponent field 0..255
  const float up = __int_as_float((127 + e) << 23), down = __int_as_float((127 - e) << 23);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) q[ks][r] = bf16x2_to_half2(q[ks][r], up);
  return down;
}

// Logits, online softmax and P·V of one e4m3 slot (32 keys; keys past `last_key` masked), the
// queries as queries_to_scaled_half left them (`logit_scale` times its 2^-e). K fragments come
// from the raw swizzled box: lane (gid, tid) reads chunks 2 tid and 2 tid + 1 of key rows 8 nt +
// gid, which hold its dims of k-steps 0-3 and 4-7 (load_query<true>'s order; the two rows of an
// 8-lane phase read 8 distinct chunks). V is widened to fp16 16 keys at a time into the K tile
// ([2 halves][16 rows][128 B], swizzled) for ldmatrix.trans.
__device__ __forceinline__ void attend_e4m3_slot(RowState& st, const uint32_t (&q)[8][4],
                                                 unsigned char* k_tile, const unsigned char* v_tile,
                                                 int last_key, float logit_scale) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  float chains[2][4][4] = {}; // [chunk j]
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 raw = *reinterpret_cast<const uint4*>(
          k_tile + sm90::swizzled_offset(nt * 8 + gid, 2 * tid + j));
      uint32_t w[8];
      widen_e4m3x16_to_half(raw, w);
#pragma unroll
      for (int sub = 0; sub < 4; ++sub)
        mma_f16_16816(chains[j][nt], q[4 * j + sub], w[2 * sub], w[2 * sub + 1]);
    }
  uint32_t p_hi[2][4], p_lo[2][4];
  softmax_weights<4, true>(st, chains, 0, last_key, logit_scale, p_hi, p_lo);
  const SwizzledHalves widened{k_tile, 16 * 128};
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    __syncwarp(); // every lane's reads of the K tile (kk = 1: of the widened V) are done
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      // An 8-lane phase: rows 0-7 of one chunk, so reads and writes hit 8 distinct chunks.
      const int r = (lane & 7) + 8 * (it & 1), c = (lane >> 3) + 4 * (it >> 1);
      const uint4 raw =
          *reinterpret_cast<const uint4*>(v_tile + sm90::swizzled_offset(16 * kk + r, c));
      uint32_t w[8];
      widen_e4m3x16_to_half(raw, w);
      // dims 16 c .. 16 c + 15: fp16 chunks 2 c and 2 c + 1 of half c / 4
      *reinterpret_cast<uint4*>(k_tile + widened.offset(r, 2 * c)) =
          make_uint4(w[0], w[1], w[2], w[3]);
      *reinterpret_cast<uint4*>(k_tile + widened.offset(r, 2 * c + 1)) =
          make_uint4(w[4], w[5], w[6], w[7]);
    }
    __syncwarp();
    accumulate_values<true, true>(st, p_hi[kk], p_lo[kk], widened, 0, last_key - 16 * kk);
  }
}

// Diagnostic builds only (never in the library): 1 = the stream without the attention (slots are
// waited for and refilled, nothing computed), 2 = the attention without the stream (no box is
// issued or waited for; the slots' stale bytes are attended).
#ifndef M3SA_ATTENTION_DECODE_SM90_VARIANT
#define M3SA_ATTENTION_DECODE_SM90_VARIANT 0
#endif

template <bool kFp8>
__global__ void __launch_bounds__(kDecodeThreads, kAttentionCtasPerSm)
    sparse_attention_decode_sm90_kernel(const __grid_constant__ SparseAttentionSm90Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = DecodeAttentionSm90Traits<kFp8>;
  constexpr int kSlots = Traits::kSlots, kStageKeys = Traits::kStageKeys;
  const SparseAttentionParams& p = params.attention;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = sm90::align_to_swizzle_atom(smem_raw);
  __shared__ DecodeSelection sel;
  __shared__ uint64_t full[Traits::kWarps][kSlots];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  M3SA_DECODE_STAMPS_BEGIN();
  M3SA_DECODE_STAMP(0);

  // One item a CTA: the grid is decode tokens x KV heads x splits.
  const int split = static_cast<int>(blockIdx.x % p.splits);
  const int64_t pair = blockIdx.x / p.splits; // (token, KV head)
  const int g = static_cast<int>(pair % p.kv_heads);
  const int t = p.token_begin + static_cast<int>(pair / p.kv_heads);
  uint64_t* my_full = full[warp];
  touch_parameters(params); // into the constant cache while the previous grid runs
  if (lane == 0) {          // the only thread that arrives on this warp's barriers initialises them
    for (int i = 0; i < kSlots; ++i) sm90::mbarrier_init(&my_full[i], 1);
    sm90::fence_barrier_init();
    if (warp == 0) sm90::prefetch_tensor_map(params.k_map);
    if (warp == 1) sm90::prefetch_tensor_map(params.v_map);
  }
  const PreparedDivisor splits_divisor(p.splits); // the range, after the selection
  const int guess = guessed_request(p, t);         // select_blocks
  prefetch_selection_metadata(p, t, g, split, guess);
  // Launched to overlap the previous kernel (PDL): nothing above read global memory.
  wait_for_prior_grids();
  allow_next_grid();
  M3SA_DECODE_STAMP(1);
  uint32_t q[8][4];
  if (kDecodeQueryLoad<kFp8, true> == QueryLoad::kBeforeSelection)
    load_query<kFp8>(p, t, g, true, q); // in flight during the selection
  select_blocks(p, t, g, guess, sel);   // ends in a CTA barrier
  M3SA_DECODE_STAMP(2);
  const int position = sel.position;
  const auto [b_begin, b_end] = split_selection_range(sel.count, split, splits_divisor);
  // The range's stages: whole blocks, but the last one (the token's own block, when selected)
  // only up to the position.
  int stages = 0;
  if (b_end > b_begin) {
    const int visible = min(128, position - sel.block[b_end - 1] * 128 + 1);
    stages =
        (b_end - b_begin - 1) * Traits::kStagesPerBlock + (visible + kStageKeys - 1) / kStageKeys;
  }
  const int first = stages * warp / Traits::kWarps;
  const int count = stages * (warp + 1) / Traits::kWarps - first;
  uint8_t* my_ring = ring + warp * Traits::kWarpBytes;
  // Stage first + i of the range: key row `row` of selected block b.
  const auto stage_block = [&](int i) { return b_begin + (first + i) / Traits::kStagesPerBlock; };
  const auto stage_row = [&](int i) { return (first + i) % Traits::kStagesPerBlock * kStageKeys; };
  const auto issue = [&](int i) { // lane 0: stage i of this warp into slot i % kSlots
    const int b = stage_block(i), row = stage_row(i);
    const int page = static_cast<int>(sel.page[b]); // < 2^31: encode_kv_cache_map checks
    uint8_t* dst = my_ring + (i % kSlots) * Traits::kSlotBytes;
    uint64_t* bar = &my_full[i % kSlots];
    sm90::mbarrier_arrive_expect_tx(bar, Traits::kSlotBytes);
#pragma unroll
    for (int h = 0; h < Traits::kBoxesPerTile; ++h) {
      uint8_t* k_dst = dst + h * Traits::kBoxBytes;
      uint8_t* v_dst = k_dst + Traits::kTileBytes;
      if constexpr (Traits::kEvictFirst) {
        const uint64_t policy = sm90::l2_evict_first_policy();
        sm90::tma_load_4d(k_dst, params.k_map, bar, h * 64, row, g, page, policy);
        sm90::tma_load_4d(v_dst, params.v_map, bar, h * 64, row, g, page, policy);
      } else {
        sm90::tma_load_4d(k_dst, params.k_map, bar, h * 64, row, g, page);
        sm90::tma_load_4d(v_dst, params.v_map, bar, h * 64, row, g, page);
      }
    }
  };
  constexpr int kVariant = M3SA_ATTENTION_DECODE_SM90_VARIANT;
  if (lane == 0 && kVariant != 2)
    for (int i = 0; i < min(count, kSlots); ++i) issue(i);
  if (kDecodeQueryLoad<kFp8, true> != QueryLoad::kBeforeSelection)
    load_query<kFp8>(p, t, g, true, q);

  float logit_scale = logit_scale_log2(p.k_scale);
  if constexpr (kFp8) logit_scale *= queries_to_scaled_half(q);
  RowState st;
  st.reset();
  for (int i = 0; i < count; ++i) {
    const int last_key = position - sel.block[stage_block(i)] * 128 - stage_row(i);
    uint8_t* k_tile = my_ring + (i % kSlots) * Traits::kSlotBytes;
    const uint8_t* v_tile = k_tile + Traits::kTileBytes;
    if (kVariant != 2) sm90::mbarrier_wait(&my_full[i % kSlots], (i / kSlots) & 1);
    if (i == 0) M3SA_DECODE_STAMP(3);
    if constexpr (kVariant == 1) {
    } else if constexpr (kFp8) {
      attend_e4m3_slot(st, q, k_tile, v_tile, last_key, logit_scale);
      sm90::fence_proxy_async_shared(); // the widened V's writes before TMA refills the slot
    } else {
      attend_keys<true>(st, q, SwizzledHalves{k_tile, Traits::kBoxBytes},
                        SwizzledHalves{v_tile, Traits::kBoxBytes}, 0, last_key, logit_scale);
    }
    __syncwarp(); // every lane has read the slot: it may be refilled
    if (lane == 0 && i + kSlots < count && kVariant != 2) issue(i + kSlots);
  }
  M3SA_DECODE_STAMP(4);
  // Every box this warp issued has landed and been read: its ring holds its partial.
  store_partial<SharedPartialLayout>(st, reinterpret_cast<float*>(my_ring));
  finish_decode_item(p, reinterpret_cast<const float*>(ring), Traits::kWarpBytes, ClusterMerge{},
                     pair, split, t, g, &sel.last_arrival); // never clustered
  M3SA_DECODE_STAMP(5);
  M3SA_DECODE_STAMPS_END(p.splits, sel.last_arrival);
#endif
}

template <bool kFp8>
cudaError_t launch_decode_sm90(const SparseAttentionSm90Params& p, int grid, cudaStream_t stream) {
  return launch_with_shared_memory(sparse_attention_decode_sm90_kernel<kFp8>, dim3(grid),
                                   kDecodeThreads, DecodeAttentionSm90Traits<kFp8>::kSmemBytes,
                                   stream, p, LaunchOptions{1, true});
}
template <bool kFp8> bool decode_sm90_has_sm90a_code() {
  return has_sm90a_code(sparse_attention_decode_sm90_kernel<kFp8>);
}

} // namespace m3sa::cuda
