#pragma once
// Decode rows of index_topk on Hopper: the index cache streamed by TMA (cuda.index_topk.sm90,
// decode requests of at most kDecodeSm90MaxRows rows).
//
// Contract: as decode_topk_kernel (decode_topk.cuh), whose tile bookkeeping and publish / merge
// tail it shares: for each decode request's q_len x H rows, the selection of contract §5 over the
// blocks' scale x max of q . k (keys at positions <= the row's; NaN propagates), or the rank's
// candidate keys for a context-parallel shard. Page ids outside [0, num_pages) are flagged
// (kPageOutOfRange) and never read; bad tiles are flagged and give -1 rows.
//
// Why: decode scoring reads every request's whole index cache each step, so it is an HBM stream,
// and the portable kernel keeps one 16-32 KB page in flight per CTA through registers with three
// CTA barriers a page: e4m3 pages (16 KB) reached 57 % of the copy rate (bench/NOTES.md). Here
// pages arrive by TMA (the cache's 128 B-swizzled tensor map, as the SM90 prefill scorer's),
// 192 KB of boxes per SM are in flight or being read, and no CTA barrier runs while they stream.
//
// Mapping: grid (tiles, splits) as the portable kernel, one CTA per SM of Warps warps, each with a
// ring of three boxes: 4 warps of whole-page boxes (128 tokens x 128 B: an e4m3 page is one box, a
// bf16 page two) or 8 warps of half-page boxes (64 tokens: e4m3 two a page, bf16 four), where two
// warps a scheduler hide each other's maxima and insertions (decode_sm90_warps, indexer_traits.h,
// says which the plan takes). Ranges of at least kDecodeSm90MinBlocksPerRange blocks (short
// contexts leave the last CTAs without blocks; at batch 1 S=8K, 32 ranges of 2 blocks). Each warp
// is independent until the end: it takes blocks_per_list consecutive blocks of the CTA's range and
// streams them through its own ring (one mbarrier a box). Lane 0 issues a box and, once the warp
// has read it, the box kSlots further on into the same slot, so a slot's phases advance only as its
// own warp consumes them (no empty barriers, no producer warp). The MMA is "swapped" (mma.sync with
// keys as M and query rows as N): rows <= 8 fill one n8 tile instead of 1/16 .. 1/2 of an m16 one,
// so a page costs the warp 64 m16n8k16 (bf16; e4m3 widened to fp16: mma_e4m3_as_f16), with A
// fragments by ldmatrix from the swizzled box (conflict-free) and the queries' B fragments held in
// registers. A query row's block max is a max over the 8 m-tiles' accumulators (of the page's
// boxes), then over the 8 lanes of its column; the causal mask runs only on a block that reaches
// past the tile's first position. Lane i keeps row i's candidate list ([warp][8 rows][fill] in
// shared memory, a key taken by one read of the list: insert_descending, candidate_lists.h); at the
// end the shared tail publishes the lists of the warps that may hold blocks as they are (with one
// split, ranks them in place).
//
// The cluster instantiation (kClusterFinish; e4m3 caches at short contexts and small batches, where
// the plan launches each tile's ranges as one thread-block cluster along grid y,
// decode_sm90_cluster_splits): the ranges push those lists into rank 0's shared memory instead
// (st.async counted down one mbarrier), and rank 0 merges them - no workspace, arrival atomic or
// staging on the tile's path. A kernel of its own, so that the other launches carry neither its
// receiving area nor its cluster code: built into every kernel, they cost the launches without
// clusters 0.4-0.66 us at batch 1 H=4 S >= 32K (bench/NOTES.md s44 r2, r4).
#include "cuda/kernels/decode_topk.cuh"
#include "cuda/kernels/sm90/hopper.cuh"

namespace m3sa::cuda {

template <typename StoredT, int Warps, bool kClusterFinish = false> struct DecodeSm90Traits {
  static constexpr bool kFp8 = std::is_same_v<StoredT, __nv_fp8_e4m3>;
  // One TMA box: kBoxTokens consecutive tokens of a page x 128 B of their dims. A page's boxes go
  // token part by token part, each part's dims in order (bf16: dims 0-63, then 64-127).
  static constexpr int kBoxTokens = decode_sm90_box_tokens(Warps);
  static constexpr int kBoxBytes = kBoxTokens * 128;
  static constexpr int kDimParts = kFp8 ? 1 : 2; // 128-byte parts of a key's dims
  static constexpr int kBoxesPerPage = 128 / kBoxTokens * kDimParts;
  static constexpr int kBoxKeyTiles = kBoxTokens / 16; // m16 key tiles a box
  static constexpr int kStepsPerBox = 4;               // m16n8k16 bf16 / m16n8k32 e4m3 k-steps
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSlots = kDecodeSm90RingBytes / (kWarps * kBoxBytes); // boxes per warp
  static constexpr int kRingBytes = kWarps * kSlots * kBoxBytes;
  static constexpr int kListBytes = kWarps * kDecodeSm90MaxRows * 32 * 8;
  // After the stream the ring holds the last CTA's staged lists, then the merge scratch.
  static constexpr int kStageKeys = kRingBytes / 8 - kDecodeMergeWarps * kMergeScratchKeys;
  // The cluster instantiation's receiving area (rank 0's; beside the ring, whose lists and merge
  // scratch it would otherwise be, but the peers push while rank 0 may still stream) and barrier.
  static constexpr int kReceiveBytes = kClusterFinish ? kDecodeSm90ReceiveKeys * 8 + 8 : 0;
  // The ring at a 1024-byte boundary (the swizzle atom), then the lists (the staged queries
  // before them), the barriers, the last-CTA flag and the receiving area.
  static constexpr int kSmemBytes =
      1024 + kRingBytes + kListBytes + kWarps * kSlots * 8 + 16 + kReceiveBytes;
};
// Both shapes (kDecodeSm90NarrowWarps, kDecodeSm90WideWarps): whole key tiles a box, whole boxes a
// page, boxes at swizzle-atom (1024 B) boundaries, three boxes a warp, the shared memory of one
// CTA an SM, and the staged queries ([8][256 B]) within the list area.
template <int Warps> constexpr bool decode_sm90_shape_fits() {
  using Bf16 = DecodeSm90Traits<__nv_bfloat16, Warps>;
  using Fp8 = DecodeSm90Traits<__nv_fp8_e4m3, Warps>;
  using Fp8Cluster = DecodeSm90Traits<__nv_fp8_e4m3, Warps, true>;
  return Bf16::kBoxTokens % 16 == 0 && 128 % Bf16::kBoxTokens == 0 &&
         Bf16::kSlots == kDecodeSm90BoxesPerWarp && Fp8::kSlots == kDecodeSm90BoxesPerWarp &&
         Bf16::kSmemBytes <= 227 * 1024 && Fp8Cluster::kSmemBytes <= 227 * 1024 &&
         kDecodeSm90MaxRows * 256 <= Bf16::kListBytes;
}
static_assert(decode_sm90_shape_fits<kDecodeSm90NarrowWarps>() &&
              decode_sm90_shape_fits<kDecodeSm90WideWarps>());
// The receiving area follows the last-CTA flag's 16 bytes at a 16-byte boundary (st.async.v4).
static_assert((DecodeSm90Traits<__nv_fp8_e4m3, kDecodeSm90NarrowWarps, true>::kSmemBytes -
               DecodeSm90Traits<__nv_fp8_e4m3, kDecodeSm90NarrowWarps, true>::kReceiveBytes) %
                      16 ==
                  0 &&
              (DecodeSm90Traits<__nv_fp8_e4m3, kDecodeSm90WideWarps, true>::kSmemBytes -
               DecodeSm90Traits<__nv_fp8_e4m3, kDecodeSm90WideWarps, true>::kReceiveBytes) %
                      16 ==
                  0);
// The CTAs an SM holds fit its 228 KB (1 KB of it reserved a CTA): the 4-warp shape, the one a
// build of two CTAs an SM launches.
static_assert(kDecodeSm90CtasPerSm *
                  (DecodeSm90Traits<__nv_bfloat16, kDecodeSm90NarrowWarps>::kSmemBytes + 1024) <=
              228 * 1024);

// Diagnostic builds only (never in the library): 1 = no page is read (the fixed cost: launch,
// tile set-up, publish and merge), 2 = nothing after the stream (no publish, no merge), 3 = pages
// streamed through the rings but not scored (no MMA, maximum or list: the rings' own rate), 5 =
// scored but no key enters a list (the lists' insertions and the merge's work on full lists left
// out). (4, every MMA issued twice, and 6, e4m3 keys masked instead of widened, answered their
// questions in s26 r3 and s32 r3 - neither the MMAs nor the widening cost more than 0.5 % - and
// were removed.)
#ifndef M3SA_DECODE_SM90_VARIANT
#define M3SA_DECODE_SM90_VARIANT 0
#endif

// e4m3 x e4m3 -> fp32, 16x8x32, as two fp16 m16n8k16 MMAs over the widened values. SM90 has no
// e4m3 mma.sync: ptxas widens both operands of every m16n8k32 (F2FP), issues two HMMA.16816 from
// zero and adds their sum to the accumulator (4 FADD). Here the queries' fragments are widened
// once (widen_e4m3_b_fragment), the keys' at each MMA, and both MMAs accumulate in place: a
// quarter fewer instructions a page (s32 r3: e4m3 0.1-0.3 us faster at batch 1, up to 1.8 us at
// batch 128). Masking the keys' bytes instead of widening them was no faster (s32 r3), so the
// widening itself costs nothing measurable. The same products are taken, k permuted alike in A
// and B: a word's low two bytes (k 4c, 4c + 1) are fp16 k 2c, 2c + 1, its high two (4c + 2, 4c +
// 3) fp16 k 8 + 2c, 8 + 2c + 1; A's words 0-1 (B's b0) feed the first MMA, words 2-3 (b1) the
// second. (Widening: widen_e4m3x4_to_half2x2, common.cuh.)
__device__ __forceinline__ void widen_e4m3_b_fragment(const uint32_t (&b)[2], uint32_t (&out)[4]) {
  widen_e4m3x4_to_half2x2(b[0], out[0], out[1]);
  widen_e4m3x4_to_half2x2(b[1], out[2], out[3]);
}
__device__ __forceinline__ void mma_e4m3_as_f16(float (&acc)[4], const uint32_t (&a)[4],
                                                const uint32_t (&b_half)[4]) {
  uint32_t k_low[4], k_high[4];
  widen_e4m3x4_to_half2x2(a[0], k_low[0], k_low[2]);
  widen_e4m3x4_to_half2x2(a[1], k_low[1], k_low[3]);
  widen_e4m3x4_to_half2x2(a[2], k_high[0], k_high[2]);
  widen_e4m3x4_to_half2x2(a[3], k_high[1], k_high[3]);
  mma_f16_16816(acc, k_low, b_half[0], b_half[1]);
  mma_f16_16816(acc, k_high, b_half[2], b_half[3]);
}

template <typename StoredT, int MaxK, int Warps, bool kClusterFinish = false>
__global__ void __launch_bounds__(DecodeSm90Traits<StoredT, Warps>::kThreads, kDecodeSm90CtasPerSm)
    decode_topk_sm90_kernel(const __grid_constant__ DecodeTopkSm90Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = DecodeSm90Traits<StoredT, Warps, kClusterFinish>;
  constexpr int kSlots = Traits::kSlots, kBoxesPerPage = Traits::kBoxesPerPage;
  const DecodeTopkParams& p = params.decode;
  const ScoreBlocksParams& s = p.scoring;
  M3SA_DECODE_STAMPS_BEGIN();
  M3SA_DECODE_STAMP(0);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = sm90::align_to_swizzle_atom(smem_raw);
  uint64_t* lists = reinterpret_cast<uint64_t*>(ring + Traits::kRingBytes);
  uint64_t* full = lists + Traits::kListBytes / 8; // [warp][slot]
  int* is_last = reinterpret_cast<int*>(full + Traits::kWarps * kSlots);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The cluster instantiation, launched in clusters of the tile's ranges: the lists finish in rank
  // 0's shared memory (publish_and_merge). Any other cluster shape finishes through the workspace.
  ClusterLists cluster{};
  if constexpr (kClusterFinish) {
    uint64_t* receive = reinterpret_cast<uint64_t*>(is_last + 4); // [kDecodeSm90ReceiveKeys]
    if (sm90::cluster_ranks() > 1 && sm90::cluster_ranks() == gridDim.y)
      cluster = ClusterLists{receive, receive + kDecodeSm90ReceiveKeys};
  }
  // Before the wait, what reads no memory the previous grid may write: the parameters into the
  // constant cache, the descriptor into the TMA unit, this warp's ring barriers (lane 0 is the only
  // thread that arrives on them; the CTA barrier after the queries' staging publishes them) and
  // the receiving barrier (published to the cluster by the release arrive below, before any global
  // access, so that its fence waits for nothing - the descriptor's prefetch comes after it).
  touch_parameters(params);
  if (lane == 0) {
    for (int i = 0; i < kSlots; ++i) sm90::mbarrier_init(&full[warp * kSlots + i], 1);
    if (kClusterFinish && warp == 0 && cluster.bar != nullptr) sm90::mbarrier_init(cluster.bar, 1);
    sm90::fence_barrier_init();
    if (!kClusterFinish && warp == 0) sm90::prefetch_tensor_map(params.index_k_map);
  }
  if constexpr (kClusterFinish) {
    if (cluster.bar != nullptr) sm90::cluster_arrive_release(); // waited for before the pushes
    if (threadIdx.x == 0) sm90::prefetch_tensor_map(params.index_k_map);
  }
  prefetch_decode_tile_metadata(p);
  // The tile's request and part, and the divisors of its range, before the wait: after it they
  // were four reciprocal sequences on batch 1's path to its first page (s41 SASS).
  const DecodeTileStart start = prepare_decode_tile(p);
  // So are the divisions by the index heads: this thread's staged query row (token, head) and its
  // lane's query columns' tokens (2c and 2c + 1, c = lane % 4).
  constexpr int kQueryChunks = Traits::kFp8 ? 8 : 16;
  const int q_row = threadIdx.x / kQueryChunks, q_chunk = threadIdx.x % kQueryChunks;
  const int q_token = q_row / s.heads, q_head = q_row % s.heads;
  const int col0_token = (2 * (lane & 3)) / s.heads, col1_token = (2 * (lane & 3) + 1) / s.heads;
  // Launched to overlap the previous kernel (PDL): wait for it before reading memory.
  wait_for_prior_grids();
  allow_next_grid();
  DecodeTile t;
  if (!begin_decode_tile(p, &t, &start)) {
    M3SA_DECODE_STAMPS_END(s.splits, 0);
    return;
  }
  M3SA_DECODE_STAMP(1);
  const int rows = t.geo.rows, fill = t.fill;
  // This rank's blocks (all, unsharded).
  const int n_local = shard_local_count(s, t.geo.n_max, &start.shards);
  if constexpr (kClusterFinish)
    if (cluster.bar != nullptr && threadIdx.x == 0)
      expect_cluster_lists<Traits::kWarps>(t, n_local, kDecodeSm90MinBlocksPerRange, cluster);
  // This warp's blocks: blocks_per_list consecutive blocks of the CTA's range.
  const BlockRange range =
      split_block_range(n_local, s.splits, kDecodeSm90MinBlocksPerRange, &start.splits);
  const int count = max(0, range.end - range.begin);
  const int per_warp = blocks_per_list(
      blocks_per_split(n_local, s.splits, kDecodeSm90MinBlocksPerRange, &start.splits),
      Traits::kWarps);
  const int first = range.begin + warp * per_warp;
  const int blocks =
      M3SA_DECODE_SM90_VARIANT == 1 ? 0 : max(0, min(count - warp * per_warp, per_warp));
  const int boxes = blocks * kBoxesPerPage;
  const int* table = s.block_table + t.geo.request * s.block_table_stride;
  const auto page_valid = [&](int page) { return page >= 0 && page < s.num_pages; };
  uint8_t* my_ring = ring + warp * kSlots * Traits::kBoxBytes;
  uint64_t* my_full = full + warp * kSlots;

  // The stream's boxes carry the evict_first L2 policy: each page is read once a step, and 60-odd
  // other layers run before this one's next step. At batch 1 what the stream would push out of
  // L2 is what the last CTA's finish reads next: -0.2..-0.35 us at S >= 32K, -0.5..-0.8 at 1M
  // (bench/NOTES.md s61 r1-r3). Every e4m3 box takes it (-0.15..-0.9 us at every batch). A bf16
  // page's 256-byte rows are read as two dim halves, a box each (per token part), and the index
  // cache's map promotes L2 fetches to 256 B: tagging the first half's box (whose fetch brings in
  // the second half) lost up to 1.3 % at batches >= 32 (s61 r2), while tagging only the second
  // halves gained 1-1.3 % there (B=128 S=128K 1358 -> 1344 us, s61 r3) but kept little of batch
  // 1's gain - so a one-tile launch (gridDim.x == 1: batch 1) tags both halves, others the second.
  const bool one_tile = gridDim.x == 1;
  // Box u of this warp: dims [64 (u % 2), +64) of block u / 2 (bf16), block u (e4m3). An invalid
  // page completes its slot's phase without bytes; the readers skip it.
  const auto issue = [&](int u) {
    const int slot = u % kSlots;
    const int page = table[first + u / kBoxesPerPage];
    if (!page_valid(page)) {
      sm90::mbarrier_arrive(&my_full[slot]);
      return;
    }
    sm90::mbarrier_arrive_expect_tx(&my_full[slot], Traits::kBoxBytes);
    const int part = u % kBoxesPerPage; // token part, then dim part
    const int dims = part % Traits::kDimParts * 64,
              tokens = part / Traits::kDimParts * Traits::kBoxTokens;
    if (Traits::kFp8 || one_tile || part % Traits::kDimParts == 1)
      sm90::tma_load_3d(my_ring + slot * Traits::kBoxBytes, params.index_k_map, &my_full[slot],
                        dims, tokens, page, sm90::l2_evict_first_policy());
    else
      sm90::tma_load_3d(my_ring + slot * Traits::kBoxBytes, params.index_k_map, &my_full[slot],
                        dims, tokens, page);
  };
  // The queries' loads go out first, so that their latency overlaps lane 0's page-id load and
  // TMA issue (warp 0's other lanes wait for lane 0): rows staged as plain 256 B rows (zeros past
  // `rows`), one 16-byte chunk a thread.
  static_assert(kDecodeSm90MaxRows * kQueryChunks <= Traits::kThreads);
  uint4 q_raw = make_uint4(0, 0, 0, 0);
  if (q_row < rows)
    q_raw =
        load_chunk(static_cast<const StoredT*>(s.index_q) +
                       (t.tile.token_begin + q_token) * s.q_stride_token + q_head * s.q_stride_head,
                   q_chunk);
  if (lane == 0)
    for (int u = 0; u < min(boxes, kSlots); ++u) issue(u);
  if (q_row < kDecodeSm90MaxRows) reinterpret_cast<uint4*>(lists)[q_row * 16 + q_chunk] = q_raw;
  __syncthreads();
  // Each lane's B fragments: query row g = lane / 4, words 8 ks + c and 8 ks + c + 4 of the 16 B
  // chunks of each 128-byte part of its dims (c = lane % 4).
  const int g = lane >> 2, c = lane & 3;
  uint32_t b[Traits::kDimParts][Traits::kStepsPerBox][2];
  {
    const uint32_t* q_s = reinterpret_cast<const uint32_t*>(lists) + g * 64;
#pragma unroll
    for (int part = 0; part < Traits::kDimParts; ++part)
#pragma unroll
      for (int ks = 0; ks < Traits::kStepsPerBox; ++ks) {
        b[part][ks][0] = q_s[part * 32 + ks * 8 + c];
        b[part][ks][1] = q_s[part * 32 + ks * 8 + c + 4];
      }
  }
  // e4m3: the queries' fragments widened to fp16 once, not at every k-step of every box.
  uint32_t b_half[Traits::kFp8 ? Traits::kStepsPerBox : 1][4];
  if constexpr (Traits::kFp8)
#pragma unroll
    for (int ks = 0; ks < Traits::kStepsPerBox; ++ks) widen_e4m3_b_fragment(b[0][ks], b_half[ks]);
  __syncthreads(); // every warp holds its fragments: the lists may overwrite the queries
  uint64_t* own_list = lists + (warp * kDecodeSm90MaxRows + lane) * fill;
  for (int i = lane; i < kDecodeSm90MaxRows * fill; i += 32)
    lists[warp * kDecodeSm90MaxRows * fill + i] = 0;
  __syncwarp();
  const bool owns_row = lane < rows;
  const SelectionRow own = t.selection_row(owns_row ? lane : 0);
  uint64_t entry_bar = 0;
  // Positions of this lane's query columns 2c and 2c + 1 (columns past `rows` are never reported).
  const int pos0 = t.geo.first_pos + col0_token, pos1 = t.geo.first_pos + col1_token;
  const uint32_t ring_address = sm90::shared_address(my_ring);

  for (int k = 0; k < blocks; ++k) {
    const int j = first + k, block = shard_global(s, j);
    const bool valid = page_valid(table[j]);
    float acc[8][4];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
    for (int box = 0; box < kBoxesPerPage; ++box) {
      const int u = k * kBoxesPerPage + box, slot = u % kSlots;
      sm90::mbarrier_wait(&my_full[slot], (u / kSlots) & 1);
      if (u == 0) M3SA_DECODE_STAMP(2);
      if (valid && M3SA_DECODE_SM90_VARIANT != 3) {
        const uint32_t box_address = ring_address + slot * Traits::kBoxBytes;
        // The page's key tiles and the query's dim part this box holds.
        constexpr int kTiles = Traits::kBoxKeyTiles;
        const int tile0 = box / Traits::kDimParts * kTiles, part = box % Traits::kDimParts;
        // A k-step's ldmatrix are issued while the previous step's MMAs run: the asm statements
        // keep their order, and a warp has few others on its scheduler to hide an ldmatrix ->
        // MMA wait behind.
        uint32_t a[2][kTiles][4];
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt)
          sm90::load_a_fragment(a[0][mt], box_address, mt * 16, 0, lane);
#pragma unroll
        for (int ks = 0; ks < Traits::kStepsPerBox; ++ks) {
          if (ks + 1 < Traits::kStepsPerBox)
#pragma unroll
            for (int mt = 0; mt < kTiles; ++mt)
              sm90::load_a_fragment(a[(ks + 1) & 1][mt], box_address, mt * 16, 2 * (ks + 1), lane);
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt) {
            if constexpr (Traits::kFp8)
              mma_e4m3_as_f16(acc[tile0 + mt], a[ks & 1][mt], b_half[ks]);
            else
              mma_bf16_16816(acc[tile0 + mt], a[ks & 1][mt], b[part][ks][0], b[part][ks][1]);
          }
        }
      }
      __syncwarp(); // every lane's ldmatrix of the slot has returned: it may be refilled
      if (lane == 0 && u + kSlots < boxes) issue(u + kSlots);
    }
    if (!valid) {
      if (lane == 0) atomicOr(s.error_flags, kPageOutOfRange);
      continue;
    }
    if (M3SA_DECODE_SM90_VARIANT == 3) continue;
    // acc[mt]: keys mt * 16 + g ([0], [1]) and + 8 ([2], [3]) x columns 2c ([0], [2]), 2c + 1.
    float m0 = -INFINITY, m1 = -INFINITY;
    if (block * 128 + 127 <= t.geo.first_pos) { // every key visible to every row
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        m0 = nan_propagating_max(m0, nan_propagating_max(acc[mt][0], acc[mt][2]));
        m1 = nan_propagating_max(m1, nan_propagating_max(acc[mt][1], acc[mt][3]));
      }
    } else { // keys past a row's position (and past seq_len) do not count
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = block * 128 + mt * 16 + g + 8 * h;
          if (key <= pos0) m0 = nan_propagating_max(m0, acc[mt][2 * h]);
          if (key <= pos1) m1 = nan_propagating_max(m1, acc[mt][2 * h + 1]);
        }
    }
#pragma unroll
    for (int offset = 4; offset < 32; offset <<= 1) {
      m0 = nan_propagating_max(m0, __shfl_xor_sync(0xffffffffu, m0, offset));
      m1 = nan_propagating_max(m1, __shfl_xor_sync(0xffffffffu, m1, offset));
    }
    // Row r's max sits in lane r / 2 (c = r / 2, g = 0), column parity r % 2.
    const float even = __shfl_sync(0xffffffffu, m0, (lane >> 1) & 3);
    const float odd = __shfl_sync(0xffffffffu, m1, (lane >> 1) & 3);
    if (owns_row && fill > 0 && M3SA_DECODE_SM90_VARIANT != 5) {
      const uint64_t key = selection_key((lane & 1 ? odd : even) * s.scale, block);
      if (key > entry_bar && own.is_candidate(block))
        entry_bar = insert_descending<MaxK>(own_list, fill, key);
    }
  }
  M3SA_DECODE_STAMP(3);
  if (M3SA_DECODE_SM90_VARIANT == 2) return;
  __syncthreads();
  M3SA_DECODE_STAMP(4);
  // The warps' lists go out as they are and the merge ranks them all: merging them here first
  // took 1.4-2.5 us after the stream (bench/NOTES.md s8 r2).
  uint64_t* ring_keys = reinterpret_cast<uint64_t*>(ring);
  publish_and_merge<MaxK, Traits::kWarps, kClusterFinish>(
      t, CtaLists<Traits::kWarps>{lists, kDecodeSm90MaxRows}, n_local, is_last,
      MergeMemory{ring_keys, Traits::kStageKeys, ring_keys + Traits::kStageKeys},
      kDecodeSm90MinBlocksPerRange, cluster);
  M3SA_DECODE_STAMP(5);
  M3SA_DECODE_STAMPS_END(s.splits, s.splits == 1 || *is_last);
#endif
}

// The cluster instantiation launches each tile's ranges (grid y) as one cluster.
template <typename StoredT, int MaxK, int Warps, bool kClusterFinish = false>
cudaError_t launch_decode_topk_sm90(const DecodeTopkSm90Params& p, dim3 grid, cudaStream_t s) {
  using Traits = DecodeSm90Traits<StoredT, Warps, kClusterFinish>;
  return launch_with_shared_memory(
      decode_topk_sm90_kernel<StoredT, MaxK, Warps, kClusterFinish>, grid, Traits::kThreads,
      Traits::kSmemBytes, s, p,
      LaunchOptions{1, true, kClusterFinish ? static_cast<int>(grid.y) : 1});
}
// Clusters of `cluster` ranges of the cluster instantiation the device holds at once (0 where it
// has no sm_90a code or the device cannot run such a cluster). Plan time only.
template <typename StoredT, int MaxK, int Warps> int decode_topk_sm90_active_clusters(int cluster) {
  using Traits = DecodeSm90Traits<StoredT, Warps, true>;
  return active_clusters(decode_topk_sm90_kernel<StoredT, MaxK, Warps, true>, Traits::kThreads,
                         Traits::kSmemBytes, 1, cluster);
}

template <typename StoredT, int MaxK, int Warps> bool decode_topk_sm90_has_sm90a_code() {
  return has_sm90a_code(decode_topk_sm90_kernel<StoredT, MaxK, Warps>);
}

} // namespace m3sa::cuda
