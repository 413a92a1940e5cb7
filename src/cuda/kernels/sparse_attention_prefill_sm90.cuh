#pragma once
// Sparse attention for prefill rows on Hopper: the block-major attend step
// (sparse_attention_prefill.cuh) on wgmma, fed by TMA, warp-specialised.
//
// Contract: as attend_block_members_kernel: for every sorted entry (KV head g, page, token, slot)
// of the pass, the compact partial (m, l, O) of the token's 16 query rows of group g over the
// page's keys visible to it (the first `visible` keys), at prefill_partial(token, g, slot). The
// entries, their sort and the merge of each token's partials are the portable path's
// (sparse_attention_prefill_entries.cu); so are the numerics: logits in fp32 from bf16 operands,
// P.V with P split into a bf16 high part and the bf16 rounding of the rest, partials in 16-bit
// fixed point. e4m3 caches: K widened to bf16 (exact, as Q), V to fp16 (exact: every e4m3 value is
// an fp16 value) and P rounded once to fp16 (11 bits of a weight in [0, 1], against the split's
// ~16), so that P.V takes 8 wgmmas a page instead of 16.
//
// Why this shape: a GQA group gives 16 query rows per token, and wgmma needs M = 64, so a tile is
// 4 member tokens of one (KV head, page) - the entries of a page are consecutive after the sort,
// so any 4 of them share the page's K and V (bench/NOTES.md s13; design doc, section 4).
// Mapping: one CTA per SM, persistent over work items of kRunEntries sorted entries, a producer
// warpgroup and 2 consumer warpgroups (bf16: 384 threads) or 3 (e4m3: 512). Every warp walks the
// same items, runs (the entries of one page) and groups (up to 4 consecutive entries of a run),
// from the item's keys and values held in its registers (read one item ahead), so no schedule is
// shared through memory and no role waits on a load per group:
//   - producer warpgroup (registers released): warp 0 brings each run's page, K and V as four
//     128-key x 64-dim TMA boxes, into one of two page buffers (e4m3: two raw 128 x 128 B boxes
//     into the raw page); warp 1 brings each group's 4 tokens x 16 query rows (two 16 x 64 boxes
//     a token) into the next of a pool of Q slots; warp 2 (e4m3: warps 2 and 3) relays "page
//     ready" once a page has landed, after zeroing the V rows past the run's last visible key
//     (pages hold whatever the engine left there, and 0 x NaN would poison P.V; K rows past it
//     are masked to -inf in the logits instead) - for e4m3, after widening the raw page (exact:
//     K to bf16 into one of two key buffers, V to fp16 into the one value buffer), keys first,
//     each as soon as the consumers have released that buffer;
//   - the consumer warpgroups take the groups in turn: S = Q K^T (m64n128k16 SS, 8 k-steps:
//     fp32, 64 per thread), the softmax of each row over the page (a warp holds one member's 16
//     rows, in the mma.sync layout the portable kernel uses), then O = P V as 16 m64n128k16 RS
//     wgmmas (P's high and low parts from registers, V from shared memory MN-major; e4m3: 8, P
//     in fp16). Each warp then writes its member's m, l and scale directly and stages O, in
//     fixed point, in its rows of the spent Q slot (the slot's swizzled layout: conflict-free),
//     from where two TMA stores write it as whole rows (per-thread stores of the 4 KB partial
//     were two thirds of the kernel's time, s13 r3), released once they have read it, after the
//     warp's next S is issued. One consumer's softmax and epilogue overlap the others' MMAs.
// Why three consumers with e4m3: at two warps a scheduler the consumers were latency-bound
// (s48 r2's stall samples: 44 % issue use, tensor cores a third busy); fp16 P (one part) lets a
// consumer live in 152 registers, and the shared memory of the second page buffer holds the
// query slots a third consumer needs (bench/NOTES.md s48). Why two key buffers then: with one,
// the next page's keys widened only after every consumer's last S of the page, and the
// consumers waited for them 6 % of their time (s49 r5's stall samples); the second takes the
// 32 KB of two query slots (six, two a consumer, where the pool had eight).
// Barriers: the page ring's (PrefillPageRing: a page's keys and values ready and empty, each
// released by every consumer warp once per run, whether or not it had a group in it; bf16 waits
// for and releases both halves together, e4m3 releases the keys after its last S of the run),
// q_full / q_empty per Q slot (a slot is released once its staged partials have been read by
// their TMA stores; the pool is a multiple of the consumers, so a slot stays with one),
// raw_full / raw_empty (e4m3).
#include "cuda/kernels/sm90/hopper.cuh"
#include "cuda/kernels/sparse_attention_prefill.cuh"

namespace m3sa::cuda {

inline constexpr int kPrefillSm90Members = 4; // tokens a tile: 4 x 16 query rows = wgmma's M
// Consumer warpgroups of a kernel: 2 (bf16, and the page-union kernel), or 3 (the block-major
// kernel with an e4m3 cache: its consumers are latency-bound at two warps a scheduler - s48 r2's
// stall samples - and with P in one fp16 part their registers fit 152 a thread).
template <int kConsumers> inline constexpr int kPrefillSm90ThreadsOf = 128 * (1 + kConsumers);
inline constexpr int kPrefillSm90Threads = kPrefillSm90ThreadsOf<2>;
// setmaxnreg moves registers within the launch allocation (the register file over the threads,
// in steps of 8: 168 a thread at 384 threads, 128 at 512; checked where the plan asks whether the
// binary holds the kernel).
template <int kConsumers>
inline constexpr int kPrefillSm90LaunchRegistersOf =
    65536 / kPrefillSm90ThreadsOf<kConsumers> / 8 * 8;
inline constexpr int kPrefillSm90LaunchRegisters = kPrefillSm90LaunchRegistersOf<2>;
// The e4m3 widening loop needs 56 registers in the producers; bf16's 40 leave two consumers 232.
template <bool kFp8> inline constexpr int kPrefillSm90ProducerRegisters = kFp8 ? 56 : 40;
template <bool kFp8, int kConsumers = 2>
inline constexpr int kPrefillSm90ConsumerRegisters = (kPrefillSm90LaunchRegistersOf<kConsumers> *
                                                          kPrefillSm90ThreadsOf<kConsumers> -
                                                      128 * kPrefillSm90ProducerRegisters<kFp8>) /
                                                     (128 * kConsumers) / 8 * 8;
// The warpgroups' registers after setmaxnreg stay within the register file, for every kernel
// shape built: bf16 (and the page-union kernel) with two consumers, e4m3 block-major with three
// (152 a consumer, what ptxas compiled without spills, s48).
template <bool kFp8, int kConsumers>
inline constexpr bool kPrefillSm90RegistersFit =
    128 * kPrefillSm90ProducerRegisters<kFp8> +
        128 * kConsumers* kPrefillSm90ConsumerRegisters<kFp8, kConsumers> <=
    65536;
static_assert(kPrefillSm90RegistersFit<false, 2> && kPrefillSm90RegistersFit<true, 2> &&
              kPrefillSm90RegistersFit<true, 3> && kPrefillSm90ConsumerRegisters<true, 3> == 152);

// What both Hopper prefill kernels (this one and the page-union kernel) stage: a page's K and V as
// four 128-key x 64-dim boxes (K dims 0-63, 64-127, then V the same; an e4m3 page arrives raw, K
// then V, 128 keys x 128 B each) and query tiles of 4 tokens x 16 rows, two 64-dim boxes a token.
struct PrefillSm90Tiles {
  static constexpr int kBoxBytes = 128 * 128;      // 128 keys x 64 bf16 dims
  static constexpr int kPageBytes = 4 * kBoxBytes; // K dims 0-63, 64-127, then V the same
  static constexpr int kRawBytes = 2 * 128 * 128;  // an e4m3 page, K then V
  static constexpr int kQueryBoxBytes = 16 * 128;  // 16 query rows x 64 dims
  static constexpr int kQueryBytes = 2 * kPrefillSm90Members * kQueryBoxBytes; // dims 0-63, 64-127
  static constexpr int kPages = 2;
};

// The block-major kernel's: bf16 two page buffers, two consumers and six query slots; e4m3 two
// key buffers and one value buffer (keys and values are released and widened separately, so the
// next page's keys widen while this page's groups run, and its values while the first group runs
// S), three consumers and six slots.
template <bool kFp8> struct PrefillSm90Layout : PrefillSm90Tiles {
  static constexpr int kConsumers = kFp8 ? 3 : 2;
  static constexpr int kPageBuffers = kFp8 ? 1 : 2; // values (bf16: whole pages)
  static constexpr int kKeyBuffers = 2;
  static constexpr int kThreads = kPrefillSm90ThreadsOf<kConsumers>;
  // Query slots, one pool that the groups take in turn (group % kQueryPool) whichever consumer
  // runs them; a slot is also where its group's partials are staged for their TMA stores, so it
  // is released only after them (after its consumer's next S): as many as shared memory holds.
  // A consumer's next group is kConsumers groups on, a slot's next group kQueryPool on: the query
  // tile of a group is loaded while the kQueryPool - kConsumers groups before it run.
  static constexpr int kQueryPool = 6;
  static_assert(kQueryPool > kConsumers, "a consumer's next group takes another slot");
  static constexpr int kQueryOffset = (kKeyBuffers + kPageBuffers) * (kPageBytes / 2);
  // e4m3: one raw page that the relay warps widen into a page buffer; one is enough, since a raw
  // page is free again as soon as it is widened.
  static constexpr int kRawOffset = kQueryOffset + kQueryPool * kQueryBytes;
  static constexpr int kSmemBytes = kRawOffset + (kFp8 ? kRawBytes : 0) + 1024; // + atom alignment
  static_assert(kSmemBytes <= 227 * 1024 - 2048, "one CTA per SM, with the static barriers");
};

// The page buffers of a Hopper prefill kernel and their barriers, with a page's keys and values
// released separately, so that a consumer that runs P.V of one page with S of the next (the
// page-union kernel's ping-pong) frees the keys of a page as soon as its S is done and the values
// after its P.V: keys_ready (the K boxes' TMA bytes; e4m3: the relay), values_full (the V boxes'
// bytes), values_ready (the relay), keys_empty / values_empty (every consumer warp, once per page
// each); for e4m3 the raw page's raw_full / raw_empty. A page's sequence number (its count among
// the pages the CTA streams) picks its buffer and barrier phases.
template <bool kFp8, int kPages = PrefillSm90Tiles::kPages, int kConsumers = 2,
          int kKeyPages = kPages> // key buffers: kPages (each page buffer holds K then V), or more
struct PrefillPageRing {
  static constexpr int kRelayWarps = kFp8 ? 2 : 1;   // warps 2 (and 3) of the producer warpgroup
  static constexpr int kHalfBytes = PrefillSm90Tiles::kPageBytes / 2; // a page's K (or V)
  // kKeyPages == kPages: [kPages][K, V]; else [kKeyPages][K] then [kPages][V]. 1024-aligned.
  uint8_t* pages;
  uint8_t* raw;                                      // e4m3: [kRawBytes]
  uint64_t *keys_ready, *values_full, *values_ready; // [kKeyPages], [kPages], [kPages]
  uint64_t *keys_empty, *values_empty;               // [kKeyPages], [kPages]
  uint64_t *raw_full, *raw_empty;

  __device__ void init() const { // one thread, before the CTA's first barrier
    for (int i = 0; i < kKeyPages; ++i) {
      sm90::mbarrier_init(&keys_ready[i], 1);
      sm90::mbarrier_init(&keys_empty[i], 4 * kConsumers); // each consumer warp, once per page
    }
    for (int i = 0; i < kPages; ++i) {
      sm90::mbarrier_init(&values_full[i], 1);
      sm90::mbarrier_init(&values_ready[i], 1);
      sm90::mbarrier_init(&values_empty[i], 4 * kConsumers);
    }
    sm90::mbarrier_init(raw_full, 1);
    sm90::mbarrier_init(raw_empty, 1);
  }
  __device__ uint8_t* page(uint32_t sequence) const { // K, then V (kKeyPages == kPages)
    static_assert(kKeyPages == kPages, "pages hold K and V together");
    return pages + (sequence % kPages) * PrefillSm90Tiles::kPageBytes;
  }
  __device__ uint8_t* keys(uint32_t sequence) const {
    return kKeyPages == kPages ? pages + (sequence % kPages) * 2 * kHalfBytes
                               : pages + (sequence % kKeyPages) * kHalfBytes;
  }
  __device__ uint8_t* values(uint32_t sequence) const {
    return kKeyPages == kPages ? pages + (sequence % kPages) * 2 * kHalfBytes + kHalfBytes
                               : pages + (kKeyPages + sequence % kPages) * kHalfBytes;
  }
  __device__ static uint32_t use(uint32_t sequence) { return (sequence / kPages) & 1; }
  __device__ static uint32_t key_use(uint32_t sequence) { return (sequence / kKeyPages) & 1; }

  // Producer warp 0, one lane: brings page `page` of KV head g (e4m3: into the raw page). The keys
  // go in as soon as the buffer's keys are free, the values when its values are.
  __device__ void load(const SparseAttentionPrefillSm90Params& params, uint32_t sequence, int g,
                       int page_id) const {
    load(params, sequence, g, page_id, params.v_map, g, page_id);
  }
  // The same with V from page v_page of head v_g of the cache v_map describes (bf16: the page-union
  // kernel's fp16 pages, union_values_map; e4m3 reads V from params.v_map whatever is passed).
  __device__ void load(const SparseAttentionPrefillSm90Params& params, uint32_t sequence, int g,
                       int page_id, const void* v_map, int v_g, int v_page) const {
    using T = PrefillSm90Tiles;
    if constexpr (kFp8) {
      sm90::mbarrier_wait(raw_empty, (sequence & 1) ^ 1);
      sm90::mbarrier_arrive_expect_tx(raw_full, T::kRawBytes);
      sm90::tma_load_4d(raw, params.k_map, raw_full, 0, 0, g, page_id);
      sm90::tma_load_4d(raw + T::kRawBytes / 2, params.v_map, raw_full, 0, 0, g, page_id);
    } else {
      const int kb = sequence % kKeyPages, b = sequence % kPages;
      sm90::mbarrier_wait(&keys_empty[kb], key_use(sequence) ^ 1);
      sm90::mbarrier_arrive_expect_tx(&keys_ready[kb], 2 * T::kBoxBytes);
      for (int box = 0; box < 2; ++box)
        sm90::tma_load_4d(keys(sequence) + box * T::kBoxBytes, params.k_map, &keys_ready[kb],
                          64 * box, 0, g, page_id);
      sm90::mbarrier_wait(&values_empty[b], use(sequence) ^ 1);
      sm90::mbarrier_arrive_expect_tx(&values_full[b], 2 * T::kBoxBytes);
      for (int box = 0; box < 2; ++box)
        sm90::tma_load_4d(values(sequence) + box * T::kBoxBytes, v_map, &values_full[b], 64 * box,
                          0, v_g, v_page);
    }
  }

  // The relay warps (thread: 0 .. 32 kRelayWarps - 1): values ready once they have landed, with V
  // rows at and past `rows` (the largest visible key count of the page's tokens) zeroed - pages
  // hold whatever the engine left there, and 0 x NaN would poison P.V (K rows past a token's
  // visible keys are masked to -inf in the logits instead); for e4m3, keys and values ready after
  // widening the raw page into the page buffer (exact): K to bf16, as Q; V to fp16, for P.V in
  // fp16 (the page-union kernel, bf16 only, shares this ring).
  __device__ void relay(uint32_t sequence, int rows, int thread) const {
    using T = PrefillSm90Tiles;
    const int kb = sequence % kKeyPages, b = sequence % kPages;
    if constexpr (kFp8) {
      // Keys, then values, each as soon as the consumers have released that buffer: the next
      // page's keys widen while this page's groups run (two key buffers), its values once every
      // consumer has run its last P.V of this one.
      sm90::mbarrier_wait(raw_full, sequence & 1);
      for (int which = 0; which < 2; ++which) { // K, V
        sm90::mbarrier_wait(which == 0 ? &keys_empty[kb] : &values_empty[b],
                            (which == 0 ? key_use(sequence) : use(sequence)) ^ 1);
        uint8_t* dst = which == 0 ? keys(sequence) : values(sequence);
        const SwizzledHalves widened{dst, T::kBoxBytes};
        for (int i = thread; i < 128 * 8; i += 32 * kRelayWarps) {
          const int row = i >> 3, chunk = i & 7;
          uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
          if (which == 0 || row < rows) {
            const uint4 bits = *reinterpret_cast<const uint4*>(raw + which * (T::kRawBytes / 2) +
                                                               sm90::swizzled_offset(row, chunk));
            uint32_t w[8];
            if (which == 0)
              widen_e4m3x16(bits, w);
            else
              widen_e4m3x16_to_half(bits, w);
            lo = make_uint4(w[0], w[1], w[2], w[3]), hi = make_uint4(w[4], w[5], w[6], w[7]);
          }
          *reinterpret_cast<uint4*>(dst + widened.offset(row, 2 * chunk)) = lo;
          *reinterpret_cast<uint4*>(dst + widened.offset(row, 2 * chunk + 1)) = hi;
        }
        sm90::fence_proxy_async_shared(); // the widened half before wgmma's reads
        sm90::named_barrier_sync(1, 32 * kRelayWarps);
        if (thread == 0) {
          if (which == 0) {
            sm90::mbarrier_arrive(&keys_ready[kb]);
          } else {
            sm90::mbarrier_arrive(raw_empty);
            sm90::mbarrier_arrive(&values_ready[b]);
          }
        }
      }
    } else {
      const int lane = thread & 31;
      sm90::mbarrier_wait(&values_full[b], use(sequence));
      if (rows < 128) {
        uint8_t* v = values(sequence);
        for (int i = lane; i < (128 - rows) * 16; i += 32) { // whole 128 B rows: no swizzle
          const int row = rows + i / 16, half = (i / 8) & 1, chunk = i & 7;
          *reinterpret_cast<uint4*>(v + half * T::kBoxBytes + row * 128 + chunk * 16) =
              make_uint4(0, 0, 0, 0);
        }
        sm90::fence_proxy_async_shared(); // the zeros before wgmma's reads
      }
      __syncwarp();
      if (lane == 0) sm90::mbarrier_arrive(&values_ready[b]);
    }
  }

  // Consumer warps: every consumer warp waits for every page and releases its keys and its values
  // once each (its arrivals must fall in this page's phase, whether or not it had work on it).
  __device__ void wait_keys(uint32_t sequence) const {
    sm90::mbarrier_wait(&keys_ready[sequence % kKeyPages], key_use(sequence));
  }
  __device__ void wait_values(uint32_t sequence) const {
    sm90::mbarrier_wait(&values_ready[sequence % kPages], use(sequence));
  }
  __device__ void wait_ready(uint32_t sequence) const {
    wait_keys(sequence);
    wait_values(sequence);
  }
  __device__ void release_keys(uint32_t sequence) const {
    arrive_once(&keys_empty[sequence % kKeyPages]);
  }
  __device__ void release_values(uint32_t sequence) const {
    arrive_once(&values_empty[sequence % kPages]);
  }
  __device__ void release(uint32_t sequence) const {
    release_keys(sequence);
    release_values(sequence);
  }
  __device__ static void arrive_once(uint64_t* empty) { // a warp's arrival
    __syncwarp();
    if ((threadIdx.x & 31) == 0) sm90::mbarrier_arrive(empty);
  }
};

// A Hopper prefill kernel's barriers, in static shared memory: the page ring's, and per query slot
// (of a consumer, or of the pool) q_full (the TMA bytes) / q_empty (the 4 warps of the consumer
// that used the slot). init() by one thread, then a CTA barrier, before any use.
template <bool kFp8, int kQuerySlots, int kConsumers = 2, int kPages = PrefillSm90Tiles::kPages,
          int kQueryOwners = kConsumers, // 1: the slots are one pool
          int kKeyPages = kPages>
struct PrefillSm90Barriers {
  uint64_t keys_ready[kKeyPages], values_full[kPages], values_ready[kPages];
  uint64_t keys_empty[kKeyPages], values_empty[kPages];
  uint64_t q_full[kQueryOwners][kQuerySlots], q_empty[kQueryOwners][kQuerySlots];
  uint64_t raw_full, raw_empty; // e4m3 only

  __device__ PrefillPageRing<kFp8, kPages, kConsumers, kKeyPages> ring(uint8_t* pages,
                                                                       uint8_t* raw) {
    return {pages,      raw,          keys_ready, values_full, values_ready,
            keys_empty, values_empty, &raw_full,  &raw_empty};
  }
  __device__ void init() {
    ring(nullptr, nullptr).init();
    for (int c = 0; c < kQueryOwners; ++c)
      for (int s = 0; s < kQuerySlots; ++s) {
        sm90::mbarrier_init(&q_full[c][s], 1);
        sm90::mbarrier_init(&q_empty[c][s], 4); // each warp of the consumer
      }
    sm90::fence_barrier_init();
  }
};

// S = Q K^T for a query tile's 4 tokens x 16 rows (the m64 A operand at shared address q_tile)
// against a page's 128 keys (k_tile): 8 wgmmas, committed as one group (the caller waits).
__device__ __forceinline__ void issue_tile_scores(float (&s)[64], uint32_t q_tile,
                                                  uint32_t k_tile) {
  using T = PrefillSm90Tiles;
  const uint64_t q = sm90::operand_descriptor(q_tile), k = sm90::operand_descriptor(k_tile);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t k_offset = (kk >> 2) * T::kBoxBytes + (kk & 3) * 32;
    const uint32_t q_offset = (kk >> 2) * (T::kQueryBytes / 2) + (kk & 3) * 32;
    sm90::wgmma_m64n128k16_bf16(s, sm90::advance_descriptor(q, q_offset),
                                sm90::advance_descriptor(k, k_offset), kk > 0);
  }
  sm90::wgmma_commit_group();
}

// O (+)= P V over a page's V tile (shared address v_tile): 16 RS wgmmas (the high and low parts of
// each k-step of 16 keys; kHalf: 8, P and V in fp16, for e4m3 caches), committed as one group (the
// caller waits). `accumulate` false overwrites O.
template <bool kHalf = false>
__device__ __forceinline__ void issue_tile_values(float (&o)[64], uint32_t (&p_hi)[8][4],
                                                  uint32_t (&p_lo)[8][4], uint32_t v_tile,
                                                  bool accumulate) {
  sm90::fence_fragments(p_hi);
  if constexpr (!kHalf) sm90::fence_fragments(p_lo);
  // V MN-major at 16 keys a k-step: rows of 64 dims, the two 64-dim halves a box apart.
  const uint64_t v0 = sm90::operand_descriptor(v_tile, PrefillSm90Tiles::kBoxBytes);
  sm90::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint64_t v = sm90::advance_descriptor(v0, j * 16 * 128);
    sm90::wgmma_m64n128k16_rs_mn_major_b<kHalf>(o, p_hi[j], v, j > 0 || accumulate);
    if constexpr (!kHalf) sm90::wgmma_m64n128k16_rs_mn_major_b(o, p_lo[j], v, 1);
  }
  sm90::wgmma_commit_group();
}

// A warp's 16 rows of S (s[4 i + e]: row gid + 8 (e >> 1), key 8 i + 2 tid + (e & 1)), raw q.k,
// keys at or past `visible` masked (only a token's own block, or a page it did not select, is cut
// short: a warp-uniform branch), and each row's maximum over the page as a log2-domain logit. The
// logits themselves are scaled in page_weights, inside the exponent's FFMA: logit_scale > 0, so
// the maximum of the raw products, scaled, is the maximum of the scaled ones.
__device__ __forceinline__ void mask_logits(float (&s)[64], float logit_scale, int visible,
                                            float (&row_max)[2]) {
  const int tid = threadIdx.x & 3;
  if (visible < 128) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (8 * i + 2 * tid + (e & 1) >= visible) s[4 * i + e] = -INFINITY;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float pairs[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) pairs[i] = fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
    row_max[r] = tree_max(pairs);
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
    row_max[r] *= logit_scale;
  }
}

// One work item (kRunEntries sorted entries) as every warp holds it: lane l keeps the keys and
// values of entries l and 32 + l, read one item ahead, so that no role waits on a global load per
// group; the roles read an entry's fields by shuffles (so every lane of a warp walks the items).
struct ItemEntries {
  static_assert(kRunEntries == 64, "two entries a lane");
  uint32_t keys[2], values[2];
  // Entry i of the item (lanes may ask for different entries): both halves are shuffled and the
  // asking lane selects, since a shuffle sends what the source lane holds, whatever the asker
  // wants; a select, not an indexed load (a dynamically indexed array lives in local memory).
  __device__ uint32_t key(int i) const { return pick(keys, i); }
  __device__ uint32_t value(int i) const { return pick(values, i); }
  __device__ static uint32_t pick(const uint32_t (&halves)[2], int i) {
    const uint32_t low = __shfl_sync(0xffffffffu, halves[0], i & 31);
    const uint32_t high = __shfl_sync(0xffffffffu, halves[1], i & 31);
    return i < 32 ? low : high;
  }
};
__device__ __forceinline__ ItemEntries load_item(const SparseAttentionParams& p, int entries,
                                                 int64_t item) {
  const int lane = threadIdx.x & 31;
  const int64_t base = item * kRunEntries;
  ItemEntries e;
#pragma unroll
  for (int half = 0; half < kRunEntries / 32; ++half) {
    const int64_t i = base + 32 * half + lane;
    const bool in = i < entries;
    e.keys[half] = in ? p.sorted_keys[i] : p.entry_sentinel;
    e.values[half] = in ? p.sorted_values[i] : 0u;
  }
  return e;
}

// Calls run(entries, begin, end, run_sequence) for every run (the entries [begin, end) of one KV
// head's page) of the CTA's items in order, then returns. The sequence numbers count runs across
// items: they pick the page buffer and its barrier phases. Sentinels (no visible block) sort last.
template <typename Run>
__device__ __forceinline__ void for_each_run(const SparseAttentionParams& p, Run&& run) {
  const int lane = threadIdx.x & 31;
  const int sorted = sorted_entries(p);
  const int64_t items = (int64_t{sorted} + kRunEntries - 1) / kRunEntries;
  uint32_t sequence = 0;
  ItemEntries entries = load_item(p, sorted, blockIdx.x);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ItemEntries next = load_item(p, sorted, item + gridDim.x); // in flight during this item
    uint64_t run_starts = 0;
    int valid = 0;
#pragma unroll
    for (int half = 0; half < kRunEntries / 32; ++half) {
      const uint32_t key = entries.keys[half];
      uint32_t previous = __shfl_up_sync(0xffffffffu, key, 1);
      if (half > 0) {
        const uint32_t last = __shfl_sync(0xffffffffu, entries.keys[half - 1], 31);
        if (lane == 0) previous = last;
      }
      const bool live = key != p.entry_sentinel;
      const bool head = live && ((half == 0 && lane == 0) || previous != key);
      run_starts |= uint64_t{__ballot_sync(0xffffffffu, head)} << (32 * half);
      valid += __popc(__ballot_sync(0xffffffffu, live));
    }
    if (valid == 0) return; // every later item is empty too
    for (uint64_t left = run_starts; left != 0; ++sequence) {
      const int begin = __ffsll(static_cast<long long>(left)) - 1;
      left &= left - 1;
      const int end = left != 0 ? __ffsll(static_cast<long long>(left)) - 1 : valid;
      run(entries, begin, end, sequence);
    }
    entries = next;
  }
}

// 2^x for x <= 0 (a weight against its row's maximum) by MUFU.EX2 alone; results below 2^-126
// flush to 0 (exp2f's extra range handling costs three instructions a weight, and such weights
// are below a rounding step of the row's denominator, which holds a 1).
__device__ __forceinline__ float exp2_flushed(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The weights 2^(logit_scale s - m_use) of a warp's 16 rows over a page (s: raw q.k) as A
// fragments of 8 k-steps of 16 keys (the m64k16 A layout is mma.sync's per warp), split into bf16
// high and low parts (kHalf: one fp16 part, p_lo untouched: fp16 keeps 11 bits of a weight in
// [0, 1], a relative rounding of at most 2^-11); each row's sum over this thread's keys is added
// to l.
template <bool kHalf = false>
__device__ __forceinline__ void page_weights(const float (&s)[64], float logit_scale,
                                             const float (&m_use)[2], float (&l)[2],
                                             uint32_t (&p_hi)[8][4], uint32_t (&p_lo)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 2 * j + h;
        const float w0 = exp2_flushed(fmaf(s[4 * i + 2 * r], logit_scale, -m_use[r]));
        const float w1 = exp2_flushed(fmaf(s[4 * i + 2 * r + 1], logit_scale, -m_use[r]));
        l[r] += w0 + w1;
        if constexpr (kHalf) {
          const __half2 w = __floats2half2_rn(w0, w1);
          p_hi[j][2 * h + r] = *reinterpret_cast<const uint32_t*>(&w);
        } else {
          split_weights(w0, w1, p_hi[j][2 * h + r], p_lo[j][2 * h + r]);
        }
      }
}

template <bool kFp8>
__global__ void __launch_bounds__(PrefillSm90Layout<kFp8>::kThreads, 1)
    attend_block_members_sm90_kernel(
        const __grid_constant__ SparseAttentionPrefillSm90Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = PrefillSm90Layout<kFp8>;
  constexpr int kConsumers = L::kConsumers;
  using Ring = PrefillPageRing<kFp8, L::kPageBuffers, kConsumers, L::kKeyBuffers>;
  // Each slot stays with one consumer (group g and g + kQueryPool run on the same one), so a
  // consumer has seen a slot's previous fill land before it waits for the next. A pool that hands
  // slots between consumers (s49's eight for three) needs the taker to wait for the release
  // first, and every lane to release (racecheck): 73f537c had both.
  static_assert(L::kQueryPool % kConsumers == 0, "a slot stays with one consumer");
  const SparseAttentionParams& p = params.attention;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  __shared__ PrefillSm90Barriers<kFp8, L::kQueryPool, kConsumers, L::kPageBuffers, 1,
                                 L::kKeyBuffers>
      barriers;
  const Ring ring = barriers.ring(smem, smem + L::kRawOffset);
  uint64_t(&q_full)[L::kQueryPool] = barriers.q_full[0];
  uint64_t(&q_empty)[L::kQueryPool] = barriers.q_empty[0];
  // A pass without live entries (every tile went token-major: structured selections) returns
  // before the barriers' set-up: every thread reads the same count, so the whole CTA leaves.
  if (sorted_entries(p) == 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) barriers.init();
  __syncthreads();
  const auto group_count = [](int begin, int end) {
    return (end - begin + kPrefillSm90Members - 1) / kPrefillSm90Members;
  };

  if (warp < 4) { // producer warpgroup
    sm90::release_registers<kPrefillSm90ProducerRegisters<kFp8>>();
    if (warp == 0) { // pages (e4m3: raw pages)
      if (lane == 0) {
        sm90::prefetch_tensor_map(params.k_map);
        sm90::prefetch_tensor_map(params.v_map);
      }
      for_each_run(p, [&](const ItemEntries& entries, int begin, int, uint32_t sequence) {
        const uint32_t key = entries.key(begin);
        if (lane == 0)
          ring.load(params, sequence, static_cast<int>(key / p.num_pages),
                    static_cast<int>(key % p.num_pages));
      });
    } else if (warp == 1) { // query tiles
      if (lane == 0) sm90::prefetch_tensor_map(params.q_map);
      uint32_t group = 0;
      for_each_run(p, [&](const ItemEntries& entries, int begin, int end, uint32_t) {
        const int g = static_cast<int>(entries.key(begin) / p.num_pages);
        for (int first = begin; first < end; first += kPrefillSm90Members, ++group) {
          // Lane 2 m + half brings member m's dims 64 half .. + 63; a short group repeats its
          // last member (the tile's bytes stay constant; the repeated rows are not stored).
          const int m = lane >> 1, half = lane & 1;
          const int t = p.token_begin + entry_token(entries.value(min(first + (m & 3), end - 1)));
          const int slot = group % L::kQueryPool;
          const uint32_t use = group / L::kQueryPool;
          if (lane == 0) {
            sm90::mbarrier_wait(&q_empty[slot], (use & 1) ^ 1);
            sm90::mbarrier_arrive_expect_tx(&q_full[slot], L::kQueryBytes);
          }
          __syncwarp();
          if (lane < 2 * kPrefillSm90Members)
            sm90::tma_load_3d(smem + L::kQueryOffset + slot * L::kQueryBytes +
                                  half * (L::kQueryBytes / 2) + m * L::kQueryBoxBytes,
                              params.q_map, &q_full[slot], 64 * half, g * p.group, t);
        }
      });
    } else if (warp < 2 + Ring::kRelayWarps) { // page ready (e4m3: widened)
      for_each_run(p, [&](const ItemEntries& entries, int begin, int end, uint32_t sequence) {
        int rows = 0; // the run's largest visible key count
#pragma unroll
        for (int half = 0; half < kRunEntries / 32; ++half) {
          const int i = 32 * half + lane;
          if (i >= begin && i < end) rows = max(rows, entry_visible(entries.values[half]));
        }
        for (int o = 16; o > 0; o >>= 1) rows = max(rows, __shfl_xor_sync(0xffffffffu, rows, o));
        ring.relay(sequence, rows, threadIdx.x - 64);
      });
    }
    return;
  }

  // Consumers.
  sm90::claim_registers<kPrefillSm90ConsumerRegisters<kFp8, kConsumers>>();
  const int consumer = (warp - 4) >> 2, member_of_warp = warp & 3;
  const int tid = lane & 3;
  const float logit_scale = logit_scale_log2(p.k_scale);
  // The query slot of a group (groups go round the consumers) and its barriers.
  const auto slot_of = [](uint32_t group) { return group % L::kQueryPool; };
  const auto query_tile = [&](uint32_t group) {
    return smem + L::kQueryOffset + slot_of(group) * L::kQueryBytes;
  };

  // Softmax of this warp's member's rows over the page alone: m and the denominator's share into
  // st, the weights as split A fragments.
  const auto page_softmax = [&](float(&s)[64], int visible, RowState& st, uint32_t(&p_hi)[8][4],
                                uint32_t(&p_lo)[8][4]) {
    float row_max[2], m_use[2];
    mask_logits(s, logit_scale, visible, row_max);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st.m[r] = row_max[r];
      m_use[r] = row_max[r] == -INFINITY ? 0.f : row_max[r];
      st.l[r] = 0.f;
    }
    page_weights<kFp8>(s, logit_scale, m_use, st.l, p_hi, p_lo);
  };

  // A warp's spent query slot is released once its TMA stores have read the staged partial, but
  // not right after issuing them: lane 0's wait there held the warp ~7 % of its time (s48 r2's
  // stall samples), so the wait comes after the warp's next S = Q K^T is issued (that group uses
  // another slot), or after its last group. -1: nothing pending.
  int pending_slot = -1;
  const auto release_pending_slot = [&] {
    if (pending_slot < 0) return;
    if (lane == 0) {
      sm90::bulk_wait_group_read(); // the slot may be refilled from here on
      sm90::mbarrier_arrive(&q_empty[pending_slot]);
    }
    __syncwarp();
    pending_slot = -1;
  };

  // The member's partial: m, l and a stored directly; O staged in the member's rows of the spent
  // query slot, in the slot's own swizzled layout (conflict-free), and written by two TMA stores,
  // so that the partial leaves as whole 128 B rows without holding up the warp; the slot is
  // released later (release_pending_slot).
  const auto store_member_partial = [&](RowState& st, const float(&o)[64], bool live,
                                        uint32_t value, int g, uint32_t group) {
    if (live) {
      uint8_t* staged = query_tile(group) + member_of_warp * L::kQueryBoxBytes;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.o[i][e] = o[4 * i + e];
      const int token = entry_token(value),
                index = (token * p.kv_heads + g) * p.top_k + entry_slot(value);
      store_compact_partial(
          st, prefill_partial(p, token, g, entry_slot(value)), [&](int row, int nt, uint32_t word) {
            *reinterpret_cast<uint32_t*>(staged + (nt >> 3) * (L::kQueryBytes / 2) +
                                         sm90::swizzled_offset(row, nt & 7) + 4 * tid) = word;
          });
      sm90::fence_proxy_async_shared(); // the staged words before the TMA stores read them
      __syncwarp();
      if (lane == 0) {
        // evict_first: the merge reads the partials after the whole pass (~1 GB at 64/4), and
        // they would otherwise push the query tiles and pages out of L2 (s48 r4: consumers
        // waited on query tiles ~11 % of their time).
        const uint64_t policy = sm90::l2_evict_first_policy();
        sm90::tma_store_3d(params.partial_map, staged, 0, 0, index, policy);
        sm90::tma_store_3d(params.partial_map, staged + L::kQueryBytes / 2, 64, 0, index, policy);
        sm90::bulk_commit_group();
      }
    }
    __syncwarp();
    pending_slot = static_cast<int>(slot_of(group));
  };

  uint32_t group = 0; // counts the CTA's groups: group % kConsumers takes a group
  for_each_run(p, [&](const ItemEntries& entries, int begin, int end, uint32_t sequence) {
    const int g = static_cast<int>(entries.key(begin) / p.num_pages);
    const uint32_t k_tile = sm90::shared_address(ring.keys(sequence));
    const uint32_t v_tile = sm90::shared_address(ring.values(sequence));
    const int groups = group_count(begin, end);
    // Every warp waits for the page, even without a group in this run: its releases must fall in
    // this page's phases. With one value buffer (e4m3) the keys are released after the warp's
    // last S of the run (`last`; -1: no group), the values after its last P.V (before that
    // group's epilogue, so that the relay widens the next page's values meanwhile).
    constexpr bool kOneBuffer = L::kPageBuffers == 1;
    int last = -1;
    if constexpr (kOneBuffer) {
      const int first = static_cast<int>((consumer + kConsumers - group % kConsumers) % kConsumers);
      if (first < groups) last = first + (groups - 1 - first) / kConsumers * kConsumers;
      ring.wait_keys(sequence);
    } else {
      ring.wait_ready(sequence);
    }
    for (int i = 0; i < groups; ++i, ++group) {
      if (group % kConsumers != static_cast<uint32_t>(consumer)) continue;
      const int entry = begin + kPrefillSm90Members * i + member_of_warp;
      const bool live = entry < end;
      const uint32_t value = entries.value(min(entry, end - 1));
      float s[64];
      sm90::mbarrier_wait(&q_full[slot_of(group)], (group / L::kQueryPool) & 1);
      issue_tile_scores(s, sm90::shared_address(query_tile(group)), k_tile);
      release_pending_slot(); // while the tensor cores run S
      sm90::wgmma_wait_all();
      sm90::fence_accumulators(s);
      if (kOneBuffer && i == last) ring.release_keys(sequence); // they may be rewritten (widened)
      RowState st;
      uint32_t p_hi[8][4], p_lo[8][4];
      page_softmax(s, live ? entry_visible(value) : 128, st, p_hi, p_lo);
      if constexpr (kOneBuffer) ring.wait_values(sequence);
      float o[64];
      issue_tile_values<kFp8>(o, p_hi, p_lo, v_tile, false);
      sm90::wgmma_wait_all();
      sm90::fence_accumulators(o);
      sm90::fence_fragments(p_hi);
      if constexpr (!kFp8) sm90::fence_fragments(p_lo);
      if (kOneBuffer && i == last) ring.release_values(sequence); // they may be rewritten
      store_member_partial(st, o, live, value, g, group);
    }
    if (kOneBuffer && last < 0) {
      ring.wait_values(sequence);
      ring.release(sequence);
    }
    if constexpr (!kOneBuffer) ring.release(sequence);
  });
  release_pending_slot(); // the last group's stores have read their slot before the CTA exits
#endif
}

template <bool kFp8>
cudaError_t launch_attend_block_members_sm90(const SparseAttentionPrefillSm90Params& p, int grid,
                                             cudaStream_t stream) {
  return launch_with_shared_memory(attend_block_members_sm90_kernel<kFp8>, dim3(grid),
                                   PrefillSm90Layout<kFp8>::kThreads,
                                   PrefillSm90Layout<kFp8>::kSmemBytes, stream, p);
}
template <bool kFp8> bool attend_block_members_sm90_has_sm90a_code() {
  return has_sm90a_code(attend_block_members_sm90_kernel<kFp8>,
                        kPrefillSm90LaunchRegistersOf<PrefillSm90Layout<kFp8>::kConsumers>);
}

} // namespace m3sa::cuda
