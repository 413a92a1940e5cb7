#pragma once
// Sparse attention for prefill rows on Hopper, token-major over page unions: where the tokens of a
// tile share most of their selections, attend them over the union of their pages with an online
// softmax and write their outputs directly, with no per-(token, block) partial.
//
// Contract: for every page-union tile (KV head g, kUnionTokens consecutive tokens of the pass) with
// union_counts >= 0, the bf16 output (and lse) of each of its tokens' 16 query rows of group g over
// the keys its selections make visible: page union_pages[i] with union_visible[i]'s byte for the
// token (0: not selected; else the first that many keys). Such tiles' entries are sentinels and the
// merge skips their tokens (gather_selection_entries_kernel decides, per tile, on the device).
// Numerics: logits in fp32 from bf16 operands (as the block-major kernel), merged across pages
// online in fp32 instead of through 16-bit fixed-point partials; P rounded once to fp16 (11 bits
// of a weight in [0, 1], a relative rounding of at most 2^-11, as the e4m3 block-major kernel),
// and V read in fp16 from union_values, where convert_union_values_kernel put each page the
// pass's tiles name once (attention_params.h kUnionValueCells) - exact for every |v| >= 2^-17
// (fp16 holds bf16's 8 significant bits there) and within 2^-25 below it, which is where the
// page's largest |v| lies in [2^-6, 65280] (kHalfValuesLeast, kHalfValuesMost): P.V then takes 8
// f16 wgmmas a page. A page outside that range (values fp16 cannot hold, or so small that its
// 2^-25 would matter), or one that found no cell, keeps bf16 V from the cache, and P's fp16 value
// is split exactly into bf16 high and low parts for it (16 wgmmas).
//
// Why fp16 P.V: with no partials the kernel is bound by its MMAs, a third of which were the bf16
// split's low part (bench/NOTES.md s15, s29). Why converted outside the kernel: converted in the
// relay, per page and tile, the conversion stood between a page's landing and its values_ready,
// on the consumers' path in a two-page ring (s55 r2: +66 %; s14 r3 and s44 r3 with e4m3).
// Why: the block-major path writes and reads a 4.2 KB partial for every (token, selected block),
// which bounds it at ~1.2 ms for an 8K chunk at 64/4 whatever the selections (bench/NOTES.md s13
// r4-r5). When the tokens of a query block share their blocks (an engine's real selections:
// 16-20 distinct blocks a 128-token query block, bench/structured_attention.py), a tile of 8
// tokens reads each of ~16-20 pages once for 128 query rows, and nothing else leaves the SM but
// the outputs.
//
// Mapping: one CTA per SM, persistent over the pass's listed tiles, which the CTAs claim one at a
// time (union_queue: every warp walks its CTA's claimed tiles in order, their pages from
// registers, lane i holding entry i), 3 warpgroups:
//   - producer warpgroup: warp 0 brings the tile's pages in list order (PrefillPageRing, as the
//     block-major kernel), warp 1 claims the tiles and brings their query rows (consumer c gets
//     tokens 4c .. 4c + 3, 16 rows each) and which of its pages read fp16 V (posted with the
//     tile), warp 2 (and 3 for e4m3) relays page ready after zeroing V rows past the tile's
//     largest visible key count on that page (e4m3: widening);
//   - consumer warpgroups 1 and 2 (4 tokens = wgmma's M of 64 each) run every page of the tile:
//     S = Q K^T (8 SS wgmmas), the token's visible keys masked (all of them where it did not
//     select the page), the running max / denominator / O rescaled, O += P V (8 RS wgmmas, or 16
//     on a page whose V stayed bf16); they
//     take turns issuing (FA3's ping-pong, two named barriers): a turn issues P.V of the previous
//     page and S of this one, and a consumer's softmax runs while the other's wgmmas do; at the
//     end each warp writes its token's 16 rows (rows < group) times v_scale / l, and the lse.
// Barriers: the ring's keys_ready / values_full / values_ready / keys_empty / values_empty (a
// page's keys are released after its S, its values after its P.V, so that a turn holds the
// values of one page and the keys of the next while two more halves load; with one release per
// page the two-page ring stalled the turns: bench/NOTES.md s15 r3), raw_full / raw_empty for
// e4m3, q_full / q_empty per consumer and slot (a slot is released after the tile's last page).
// Instantiated for bf16 caches only (attention.cu says why not e4m3); the template keeps the
// ring's e4m3 form, which the block-major kernel uses, for a widening that keeps up.
#include "cuda/kernels/sparse_attention_prefill_sm90.cuh"

namespace m3sa::cuda {

template <bool kFp8> struct PrefillUnionSm90Layout : PrefillSm90Tiles {
  static constexpr int kQuerySlots = kFp8 ? 1 : 2; // per consumer; e4m3 needs room for its raw page
  static constexpr int kQueryOffset = kPages * kPageBytes;
  static constexpr int kRawOffset = kQueryOffset + 2 * kQuerySlots * kQueryBytes;
  static constexpr int kSmemBytes = kRawOffset + (kFp8 ? kRawBytes : 0) + 1024; // + atom alignment
  static_assert(kSmemBytes <= 227 * 1024 - 2048, "one CTA per SM, with the static barriers");
};

// A listed tile as every warp holds it: lane i keeps entry i (count <= kUnionPages = 32).
struct UnionTile {
  static_assert(kUnionPages == 32, "one entry a lane");
  int64_t tile;
  int count;
  uint32_t page, visible_low, visible_high;
  uint32_t cell;        // the entry's union_values cell (kNoValueCell: none, or not warp 0)
  uint32_t half_values; // bit i: entry i's V is fp16, in its cell (the same in every lane)
  __device__ uint32_t page_of(int i) const { return __shfl_sync(0xffffffffu, page, i); }
  __device__ uint32_t cell_of(int i) const { return __shfl_sync(0xffffffffu, cell, i); }
  // Visible keys of every token of the tile on entry i: byte k for token k.
  __device__ uint64_t visible_of(int i) const {
    return uint64_t{__shfl_sync(0xffffffffu, visible_low, i)} |
           uint64_t{__shfl_sync(0xffffffffu, visible_high, i)} << 32;
  }
};

// The CTA's tiles, claimed one at a time from the pass's listed tiles, largest unions first
// (union_queue, union_listed): warp 1 claims a tile and posts it in a ring of slots in shared
// memory, and every warp that walks the tiles (the readers) takes them from there in order and
// frees the slot. A CTA that drew larger unions so takes fewer tiles, and the last claims are the
// smallest (attention_params.h: what a static share of the tiles cost). Warp 1 claims the next tile
// as soon as it has asked for this one's query rows, so a CTA holds up to two tiles it has not
// begun: the lead that keeps the query rows ahead of the consumers.
inline constexpr uint32_t kNoTile = 0xffffffffu; // the CTA's last slot: no tile left
struct UnionTileQueue {
  static constexpr int kSlots = 4; // > the tiles a reader runs ahead of another (two query slots)
  uint32_t tile[kSlots], half_values[kSlots]; // UnionTile::half_values of the slot's tile
  uint64_t full[kSlots], empty[kSlots];
  __device__ void init(int readers) { // one thread, before fence_barrier_init
    for (int s = 0; s < kSlots; ++s) {
      sm90::mbarrier_init(&full[s], 1);
      sm90::mbarrier_init(&empty[s], readers); // lane 0 of each reader
    }
  }
};

// Calls run(tile, tile_sequence, first_page_sequence) for every tile of the CTA in order; the
// sequences count the CTA's tiles and pages (query slots, page buffers and barrier phases).
// `claims`: the warp that claims the tiles (warp 1); every other caller is a reader.
// `loads_pages`: the warp that brings the pages (warp 0), the only one that reads their cells.
template <typename Run>
__device__ __forceinline__ void for_each_union_tile(const SparseAttentionParams& p,
                                                    UnionTileQueue& queue, bool claims,
                                                    bool loads_pages, Run&& run) {
  const int lane = threadIdx.x & 31;
  // The claiming warp's lane b: bucket b's count and the end of its claims (the buckets in order).
  const uint32_t bucket_count = claims ? p.union_queue[lane] : 0u;
  uint32_t bucket_end = bucket_count;
  static_assert(kUnionPages == 32, "a bucket a lane");
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t below = __shfl_up_sync(0xffffffffu, bucket_end, d);
    if (lane >= d) bucket_end += below;
  }
  const int64_t bucket_stride = int64_t{union_tiles(p)} * p.kv_heads;
  uint32_t page_sequence = 0;
  for (uint32_t tile_sequence = 0;; ++tile_sequence) {
    const int slot = static_cast<int>(tile_sequence % UnionTileQueue::kSlots);
    const uint32_t use = tile_sequence / UnionTileQueue::kSlots & 1;
    uint32_t tile = kNoTile, half_values = 0;
    if (claims) {
      uint32_t claim = 0;
      if (lane == 0) {
        if (tile_sequence >= UnionTileQueue::kSlots)
          sm90::mbarrier_wait(&queue.empty[slot], use ^ 1);
        claim = atomicAdd(p.union_queue + kUnionPages, 1u);
      }
      claim = __shfl_sync(0xffffffffu, claim, 0);
      // The claim's bucket: the first whose claims end above it (none: every tile claimed).
      const uint32_t above = __ballot_sync(0xffffffffu, claim < bucket_end);
      if (above != 0) {
        const int bucket = __ffs(above) - 1;
        const uint32_t first = __shfl_sync(0xffffffffu, bucket_end - bucket_count, bucket);
        tile = p.union_listed[bucket * bucket_stride + (claim - first)];
        if (p.union_value_cells) { // which entries read fp16 V (the readers read it from the slot)
          const int count = p.union_counts[tile];
          uint32_t form = 0;
          if (lane < count) {
            const uint32_t cell = p.union_value_cells[int64_t{tile} * kUnionPages + lane];
            form = cell != kNoValueCell ? p.union_value_forms[cell] : 0u;
          }
          half_values = __ballot_sync(0xffffffffu, form != 0);
        }
      }
      if (lane == 0) {
        queue.tile[slot] = tile, queue.half_values[slot] = half_values;
        sm90::mbarrier_arrive(&queue.full[slot]);
      }
    } else {
      sm90::mbarrier_wait(&queue.full[slot], use);
      tile = queue.tile[slot], half_values = queue.half_values[slot];
      __syncwarp();
      if (lane == 0) sm90::mbarrier_arrive(&queue.empty[slot]);
    }
    if (tile == kNoTile) return;
    UnionTile t;
    t.tile = tile;
    t.count = p.union_counts[tile];
    t.page = 0, t.visible_low = 0, t.visible_high = 0, t.cell = kNoValueCell;
    t.half_values = half_values;
    if (lane < t.count) {
      t.page = p.union_pages[t.tile * kUnionPages + lane];
      if (p.union_value_cells && loads_pages)
        t.cell = p.union_value_cells[t.tile * kUnionPages + lane];
      const uint64_t v = p.union_visible[t.tile * kUnionPages + lane];
      t.visible_low = static_cast<uint32_t>(v), t.visible_high = static_cast<uint32_t>(v >> 32);
    }
    run(t, tile_sequence, page_sequence);
    page_sequence += t.count;
  }
}

// P's fp16 weights (one part, in p_hi) as bf16 high and low parts, for a page whose V stayed bf16:
// exact, since fp16's 11 significant bits fit a bf16 pair's 16.
__device__ __forceinline__ void split_half_weights(uint32_t (&p_hi)[8][4], uint32_t (&p_lo)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 w = __half22float2(*reinterpret_cast<const __half2*>(&p_hi[j][k]));
      split_weights(w.x, w.y, p_hi[j][k], p_lo[j][k]);
    }
}

template <bool kFp8>
__global__ void __launch_bounds__(kPrefillSm90Threads, 1) attend_page_unions_sm90_kernel(
    const __grid_constant__ SparseAttentionPrefillSm90Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = PrefillUnionSm90Layout<kFp8>;
  using Ring = PrefillPageRing<kFp8>;
  const SparseAttentionParams& p = params.attention;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  __shared__ PrefillSm90Barriers<kFp8, L::kQuerySlots> barriers;
  __shared__ UnionTileQueue queue;
  const Ring ring = barriers.ring(smem, smem + L::kRawOffset);
  uint64_t(&q_full)[2][L::kQuerySlots] = barriers.q_full;
  uint64_t(&q_empty)[2][L::kQuerySlots] = barriers.q_empty;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    queue.init(1 + Ring::kRelayWarps + 8); // readers: warp 0, the relay warps, 8 consumer warps
    barriers.init();                       // (its fence_barrier_init covers the queue's)
  }
  __syncthreads();
  // Every warp walks the CTA's tiles in the order warp 1 claims them.
  const auto for_each_tile = [&](auto&& run) {
    for_each_union_tile(p, queue, warp == 1, warp == 0, run);
  };
  const int tiles_per_head = union_tiles(p);
  const auto query_tile = [&](int consumer, uint32_t tile_sequence) {
    return smem + L::kQueryOffset +
           (consumer * L::kQuerySlots + tile_sequence % L::kQuerySlots) * L::kQueryBytes;
  };
  const auto query_use = [](uint32_t tile_sequence) { return tile_sequence / L::kQuerySlots & 1; };

  if (warp < 4) { // producer warpgroup
    sm90::release_registers<kPrefillSm90ProducerRegisters<kFp8>>();
    if (warp == 0) { // pages (e4m3: raw pages)
      if (lane == 0) {
        sm90::prefetch_tensor_map(params.k_map);
        sm90::prefetch_tensor_map(params.v_map);
        if (p.union_value_cells) sm90::prefetch_tensor_map(params.union_values_map);
      }
      for_each_tile([&](const UnionTile& t, uint32_t, uint32_t first_page) {
        const int g = static_cast<int>(t.tile / tiles_per_head);
        for (int i = 0; i < t.count; ++i) {
          const uint32_t page = t.page_of(i), cell = t.cell_of(i);
          if (lane == 0) {
            if (t.half_values >> i & 1u)
              ring.load(params, first_page + i, g, static_cast<int>(page), params.union_values_map,
                        0, static_cast<int>(cell));
            else
              ring.load(params, first_page + i, g, static_cast<int>(page));
          }
        }
      });
    } else if (warp == 1) { // query rows: lane 8 c + 2 m + half brings consumer c's token m, dims
                            // 64 half .. + 63
      if (lane == 0) sm90::prefetch_tensor_map(params.q_map);
      for_each_tile([&](const UnionTile& t, uint32_t tile_sequence, uint32_t) {
        const int g = static_cast<int>(t.tile / tiles_per_head);
        const int first = p.token_begin + static_cast<int>(t.tile % tiles_per_head) * kUnionTokens;
        const int consumer = (lane >> 3) & 1, m = (lane >> 1) & 3, half = lane & 1;
        // A token past the pass repeats its last one (the tile's bytes stay constant; such rows
        // are not stored).
        const int token = min(first + 4 * consumer + m, p.token_end - 1);
        const int slot = tile_sequence % L::kQuerySlots;
        if (lane < 2) {
          sm90::mbarrier_wait(&q_empty[lane][slot], query_use(tile_sequence) ^ 1);
          sm90::mbarrier_arrive_expect_tx(&q_full[lane][slot], L::kQueryBytes);
        }
        __syncwarp();
        if (lane < 4 * kPrefillSm90Members)
          sm90::tma_load_3d(query_tile(consumer, tile_sequence) + half * (L::kQueryBytes / 2) +
                                m * L::kQueryBoxBytes,
                            params.q_map, &q_full[consumer][slot], 64 * half, g * p.group, token);
      });
    } else if (warp < 2 + Ring::kRelayWarps) { // page ready (e4m3: widened)
      for_each_tile([&](const UnionTile& t, uint32_t, uint32_t first_page) {
        for (int i = 0; i < t.count; ++i) {
          const uint64_t visible = t.visible_of(i);
          int rows = 0; // the tile's largest visible key count on this page
#pragma unroll
          for (int k = 0; k < kUnionTokens; ++k)
            rows = max(rows, static_cast<int>(visible >> (8 * k) & 255));
          ring.relay(first_page + i, rows, threadIdx.x - 64);
        }
      });
    }
    return;
  }

  // Consumers: warp w of consumer c holds token 4 c + w of the tile (16 rows).
  sm90::claim_registers<kPrefillSm90ConsumerRegisters<kFp8>>();
  const int consumer = (warp - 4) >> 2, token_of_warp = 4 * consumer + (warp & 3);
  const int gid = lane >> 2, tid = lane & 3;
  const float logit_scale = logit_scale_log2(p.k_scale);
  // The consumers take turns issuing their wgmmas (FA3's ping-pong): named barrier kTurn + c is
  // consumer c's turn (its 128 threads sync, the other's 128 arrive). A turn issues P.V of the
  // previous page and S of this one, so that the consumer's softmax of this page runs while the
  // other consumer's wgmmas keep the tensor pipe busy. Consumer 0 goes first; every turn is passed
  // on, and consumer 0 takes one more at the end for the last one consumer 1 passed.
  constexpr int kTurn = 2; // 1: the e4m3 relay warps' barrier
  const auto take_turn = [&] { sm90::named_barrier_sync(kTurn + consumer, 256); };
  const auto pass_turn = [&] { sm90::named_barrier_arrive(kTurn + 1 - consumer, 256); };
  if (consumer == 1) pass_turn();
  for_each_tile([&](const UnionTile& t, uint32_t tile_sequence, uint32_t first_page) {
    const int slot = tile_sequence % L::kQuerySlots;
    const uint32_t q_tile = sm90::shared_address(query_tile(consumer, tile_sequence));
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    uint32_t p_hi[8][4], p_lo[8][4];
    // The softmax of page i's S into P (the row maxima, denominators and O rescaled; O must not
    // be in flight), the token's unseen keys masked.
    const auto page_softmax = [&](float(&s)[64], uint64_t tile_visible) {
      const int visible = static_cast<int>(tile_visible >> (8 * token_of_warp) & 255);
      float row_max[2], m_use[2], rescale[2];
      mask_logits(s, logit_scale, visible, row_max);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], row_max[r]);
        m_use[r] = m_new == -INFINITY ? 0.f : m_new; // a row without keys yet keeps exp2 finite
        rescale[r] = exp2_flushed(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= rescale[r];
      }
      // Past its first pages a row's max rarely grows: skip the 64 multiplies by 1 unless some
      // row of the warp needs them (warp-uniform; the result is the same either way).
      if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
        for (int k = 0; k < 64; ++k) o[k] *= rescale[(k >> 1) & 1];
      }
      page_weights<true>(s, logit_scale, m_use, l, p_hi, p_lo);
    };
    const auto k_tile_of = [&](int i) { return sm90::shared_address(ring.page(first_page + i)); };
    const auto v_tile_of = [&](int i) { return k_tile_of(i) + 2 * L::kBoxBytes; };
    sm90::mbarrier_wait(&q_full[consumer][slot], query_use(tile_sequence));
    // A page's keys are released once its S is done, its values once its P.V is: the turn of
    // page i holds the values of page i - 1 and the keys of page i, while the keys of page i + 1
    // and the values of page i come in. A page none of the consumer's 4 tokens selected (the
    // tile's other 4 did) costs it no MMA: its S would be masked whole and its P would add zeros
    // to O, so skipping both changes no bit. The consumer still waits for, takes the turn of and
    // releases every page, so that the ring's phases and the turns stay in step. Each branch
    // issues and waits for its own wgmmas: a wgmma whose wait lies past a branch's end made
    // ptxas serialise them all (C7518).
    const auto values_done = [&] {
      sm90::fence_accumulators(o);
      sm90::fence_fragments(p_hi);
      if constexpr (!kFp8) sm90::fence_fragments(p_lo);
    };
    // P.V of page i in its V's form (fp16 from union_values, or bf16), then `rest` - the
    // same in both branches, which must each hold their wgmmas' wait (C7518).
    const auto issue_values = [&](int i, auto&& rest) {
      if (kFp8 || (t.half_values >> i & 1u) != 0) {
        issue_tile_values<true>(o, p_hi, p_lo, v_tile_of(i), true);
        rest();
      } else {
        split_half_weights(p_hi, p_lo);
        issue_tile_values<false>(o, p_hi, p_lo, v_tile_of(i), true);
        rest();
      }
    };
    if (t.count > 0) {
      float s[64];
      bool values_pending = false; // page i - 1 had keys for this consumer: its P.V is due
      for (int i = 0; i < t.count; ++i) {
        const uint64_t visible = t.visible_of(i);
        const bool scores = static_cast<uint32_t>(visible >> (32 * consumer)) != 0;
        if (i > 0) ring.wait_values(first_page + i - 1);
        ring.wait_keys(first_page + i);
        take_turn();
        if (scores) {
          if (values_pending) {
            issue_values(i - 1, [&] {
              issue_tile_scores(s, q_tile, k_tile_of(i));
              pass_turn();
              sm90::wgmma_wait<1>(); // P.V of page i - 1
            });
            values_done();
          } else {
            issue_tile_scores(s, q_tile, k_tile_of(i));
            pass_turn();
          }
          if (i > 0) ring.release_values(first_page + i - 1);
          sm90::wgmma_wait_all(); // S of page i
          sm90::fence_accumulators(s);
          ring.release_keys(first_page + i);
          page_softmax(s, visible);
        } else {
          if (values_pending) {
            issue_values(i - 1, [&] {
              pass_turn();
              sm90::wgmma_wait_all();
            });
            values_done();
          } else {
            pass_turn();
          }
          if (i > 0) ring.release_values(first_page + i - 1);
          ring.release_keys(first_page + i);
        }
        values_pending = scores;
      }
      ring.wait_values(first_page + t.count - 1);
      take_turn();
      if (values_pending) {
        issue_values(t.count - 1, [&] {
          pass_turn();
          sm90::wgmma_wait_all();
        });
        values_done();
      } else {
        pass_turn();
      }
      ring.release_values(first_page + t.count - 1);
    }
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(&q_empty[consumer][slot]);

    // The token's rows: O times v_scale / l in bf16, and the lse (zeros and -inf without keys).
    const int g = static_cast<int>(t.tile / tiles_per_head);
    const int token = static_cast<int>(t.tile % tiles_per_head) * kUnionTokens + token_of_warp;
    if (p.token_begin + token >= p.token_end) return;
    const int64_t token_offset = int64_t{p.token_begin + token} * p.out_stride_token;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      const int row = gid + 8 * r;
      if (row >= p.group) continue;
      const float inverse = l[r] > 0.f ? p.v_scale / l[r] : 0.f;
      const int64_t head = int64_t{g} * p.group + row;
      uint32_t* out = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + token_offset +
                                                  head * p.out_stride_head + 2 * tid);
#pragma unroll
      for (int i = 0; i < 16; ++i)
        out[4 * i] = pack_bf16x2(o[4 * i + 2 * r] * inverse, o[4 * i + 2 * r + 1] * inverse);
      if (p.lse && tid == 0)
        p.lse[int64_t{p.token_begin + token} * p.lse_stride_token + head * p.lse_stride_head] =
            row_lse(m[r], l[r]);
    }
  });
  if (consumer == 0) take_turn(); // consumer 1's last pass
#endif
}

template <bool kFp8>
cudaError_t launch_attend_page_unions_sm90(const SparseAttentionPrefillSm90Params& p, int grid,
                                           cudaStream_t stream) {
  return launch_with_shared_memory(attend_page_unions_sm90_kernel<kFp8>, dim3(grid),
                                   kPrefillSm90Threads, PrefillUnionSm90Layout<kFp8>::kSmemBytes,
                                   stream, p);
}
template <bool kFp8> bool attend_page_unions_sm90_has_sm90a_code() {
  return has_sm90a_code(attend_page_unions_sm90_kernel<kFp8>, kPrefillSm90LaunchRegisters);
}

} // namespace m3sa::cuda
