#pragma once
// Block scoring on Hopper: wgmma fed by TMA, warp-specialised, persistent (cuda.score_blocks.sm90,
// and the prefill rows of cuda.index_topk.sm90).
//
// Contract: as score_blocks_kernel (score_blocks.cuh) for unsharded requests: for every scheduled
// row (token x index head) and every causal block b of its request, scores[head, token, b] =
// scale * max over the block's keys at positions <= the row's position of q . k (fp32 products
// accumulated by the tensor cores; NaN propagates); -inf where no key of the block is visible to
// the row; with fill_tail, -inf in the columns past the tile's causal blocks. Page ids outside
// [0, num_pages) are flagged (kPageOutOfRange) and not read: their scores are not written.
// Tiles whose metadata cannot be served are flagged (kSeqLenBeyondTable) and not read.
//
// Mapping: one CTA per SM, 3 warpgroups. Warpgroup 0 is the producer: it walks the same work
// units as the consumers and brings each causal block's index-K page into a ring of kStages
// shared-memory stages (full / empty mbarrier pairs). bf16 pages arrive by TMA straight into the
// ring. e4m3 pages arrive by TMA into a second ring of raw pages, and the producer's four warps
// widen them to fp16 into the first (the e4m3 queries too): the MMAs are 16-bit for both dtypes,
// because Hopper's e4m3 wgmma does not accumulate in full fp32 (its selections differed from the
// exact ones in 0.5-0.9 % of rows on random data, bench/NOTES.md), while every e4m3 value is an
// fp16 value and 16-bit wgmma accumulates exactly like the portable kernel. The kTensorCoreFp8
// instantiation (cuda.index_topk.sm90_qgmma only) takes e4m3 pages by TMA straight into an 8-stage
// ring of 16 KB and multiplies them by e4m3 wgmma (m64n128k32, four steps a page): 1.47x faster,
// inexact, so its selections are certified afterwards (certify_selection.cuh). Warpgroups 1 and 2
// are consumers: a row tile is 256 query rows (256 / H tokens: the H index heads of a token are
// consecutive rows, so every H gets the same MMA tile); consumer c owns rows [128 c, 128 c + 128)
// as two m64 wgmma tiles, N = 128 keys = one page, K = 128 dims, fp32 accumulators in registers (2
// x 64 per thread). After its MMAs a consumer releases the stage, then reduces each row's 128
// columns to the block maximum (32 values per thread, then the 4 lanes of a quad) and stores it,
// while the other consumer's MMAs run: the epilogue has to stay below one consumer's MMA time (1024
// tensor clocks a page), so the unmasked maximum is a bare FMNMX chain, the causal mask runs only
// on blocks that reach past the tile's first position, and a warp gathers its rows' maxima of 8
// blocks in shared memory and writes them as 32-byte runs a row while its next MMAs run. bf16
// queries (H a power of two) arrive by TMA, a unit's during the CTA's previous unit's last block;
// otherwise they are staged once per work unit by the consumers (plain loads, swizzled stores); for
// widened e4m3 the consumers then hold their rows as wgmma A fragments in registers for the unit
// (its producer's widening already loads shared memory; bf16 stays faster with A read from there,
// bench/NOTES.md s20 r2). Work units are (row tile, range of blocks_per_range causal blocks),
// numbered range-major so that the CTAs running at the same time read the same pages (L2 reuse
// across row tiles), strided over the persistent grid; the schedule kernel lists only the units
// that hold blocks (and each tile's range 0) and sizes the ranges so that the CTAs' shares come out
// even (schedule_tiles.cu).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "cuda/indexer_params.h"
#include "cuda/kernels/score_blocks.cuh"
#include "cuda/kernels/scorer_stamps.cuh"
#include "cuda/kernels/sm90/hopper.cuh"

namespace m3sa::cuda {

inline constexpr int kSm90ScoreThreads = 384; // producer warpgroup + 2 consumer warpgroups
// setmaxnreg moves registers within the CTA's launch allocation (168 a thread at 384 threads,
// 1 CTA/SM): a consumer's increase waits until the producer's decrease has freed enough, so the
// split must fit that pool, not the SM's 65536 (a split over it hangs the consumers).
inline constexpr int kSm90LaunchRegisters = 168;
inline constexpr int kSm90ProducerRegisters = 56;
inline constexpr int kSm90ConsumerRegisters = 224;
static_assert(128 * kSm90ProducerRegisters + 256 * kSm90ConsumerRegisters <=
              kSm90LaunchRegisters * kSm90ScoreThreads);

// Shared memory: 16-bit queries (256 rows x 2 slabs of 128 B; bf16, or fp16 widened from e4m3), a
// ring of 16-bit pages (2 slabs of 128 keys x 128 B) and, for e4m3 caches, a ring of raw pages
// (128 keys x 128 B).
// kTensorCoreFp8: e4m3 pages go straight into a ring of 16 KB stages and are multiplied by e4m3
// wgmma (QGMMA), whose sums are not exact (index_topk certifies its selections afterwards,
// certify_selection.cuh).
template <typename StoredT, bool kTensorCoreFp8 = false> struct Sm90ScoreTraits {
  static constexpr bool kNativeFp8 = std::is_same_v<StoredT, __nv_fp8_e4m3> && kTensorCoreFp8;
  static constexpr bool kFp8 = std::is_same_v<StoredT, __nv_fp8_e4m3> && !kNativeFp8; // widened
  static constexpr int kSlabBytes = 128 * 128; // 128 rows x 128 B: one wgmma operand slab
  static constexpr int kSlabs = kNativeFp8 ? 1 : 2;
  static constexpr int kStageBytes = kSlabs * kSlabBytes;
  static constexpr int kStages = kNativeFp8 ? 8 : kFp8 ? 3 : 4;
  static constexpr int kRawStages = kFp8 ? 4 : 0;
  static constexpr int kRawBytes = 128 * 128;
  static constexpr int kQueryBytes = kSlabs * kSm90TileRows * 128;
  // + one query barrier a consumer (bf16 queries by TMA)
  static constexpr int kBarriers = 2 * kStages + 2 * kRawStages + 2;
  // bf16: the two m64 tiles are two commit groups, and tile 0's maxima run while tile 1
  // multiplies. Widened e4m3 (A from registers) waits for both: there the split made its MMAs
  // slower and the kernel no faster (s21 r3).
  static constexpr bool kTileOverlap = !kFp8 && !kNativeFp8;
  // A consumer warp gathers its 32 rows' maxima of kScoreColumns blocks in shared memory and
  // writes them as runs of kScoreColumns consecutive blocks a row: one 4-byte store a row and
  // block scattered over 32 rows cost the consumers ~300 cycles a block (s21 r1, M3SA_SCORER_SKIP
  // 1). Per warp: the rows' output pointers, then [32 rows][kScoreColumns + 1] values (+ 1: a
  // column's 32 rows in 32 banks). Widened e4m3 keeps them in the warp's own query rows (its A
  // fragments are in registers after the staging), the others in a region of their own.
  static constexpr int kScoreColumns = 8;
  static constexpr int kScoreRowWords = kScoreColumns + 1;
  static constexpr int kWarpScoreBytes = 32 * 8 + 32 * kScoreRowWords * 4;
  static constexpr int kScoreBytes = kFp8 ? 0 : 8 * kWarpScoreBytes;
  // + 1 KB to align the operands to 1024 B, + the barriers.
  static constexpr int kSmemBytes = kQueryBytes + kStages * kStageBytes + kRawStages * kRawBytes +
                                    kScoreBytes + 1024 + kBarriers * 8;
};
static_assert(Sm90ScoreTraits<__nv_bfloat16>::kSmemBytes <= 227 * 1024);
static_assert(Sm90ScoreTraits<__nv_fp8_e4m3>::kSmemBytes <= 227 * 1024);
static_assert(Sm90ScoreTraits<__nv_fp8_e4m3, true>::kSmemBytes <= 227 * 1024);
// Widened e4m3 gathers a warp's scores in its 16 query rows of slab 0.
static_assert(Sm90ScoreTraits<__nv_fp8_e4m3>::kWarpScoreBytes <= 16 * 128);

// A unit's blocks [begin, end), or an empty range (bad tiles: nothing is read).
__device__ __forceinline__ BlockRange sm90_unit_blocks(const ScoringSchedule& s,
                                                       const TileGeometry& geo, int range) {
  const int begin = range * s.blocks_per_range;
  const int end = geo.bad ? begin : min(geo.n_max, begin + s.blocks_per_range);
  return {begin, max(begin, end)};
}

// The page sequence of this CTA's units (list entries u = blockIdx.x + i gridDim.x): what the
// producer loads, in the order the consumers use it.
struct Sm90PageCursor {
  int64_t unit = -1;
  int block = 0, end = 0, request = 0;

  // The next page id (possibly invalid: the caller checks), false past the last.
  __device__ bool next(const ScoreBlocksSm90Params& params, const ScoringSchedule& s, int* page) {
    const ScoreBlocksParams& p = params.scoring;
    while (block >= end) {
      unit = unit < 0 ? blockIdx.x : unit + gridDim.x;
      if (unit >= s.num_units) return false;
      const ScoringUnit u = params.units[unit];
      const TileGeometry geo = tile_geometry(p, p.tiles[u.tile]);
      const BlockRange blocks = sm90_unit_blocks(s, geo, u.range);
      block = blocks.begin, end = blocks.end, request = geo.request;
    }
    *page = p.block_table[request * p.block_table_stride + block++];
    return true;
  }
};

__device__ __forceinline__ bool sm90_page_valid(const ScoreBlocksParams& p, int page) {
  return page >= 0 && page < p.num_pages;
}

// Widened e4m3 operands are fp16 (0: bf16, a diagnostic build's). Both are exact - every e4m3
// value, subnormals included, is an fp16 and a bf16 value, and the product of two e4m3 values is
// exact in fp32 - and the wgmma accumulates both in fp32 alike, so the scores do not change; but
// a pair widens to fp16 in one conversion where bf16 takes three more (through fp32), and the
// producer's widening shares the SMs' issue slots with the consumers' maxima.
#ifndef M3SA_SCORER_WIDEN_TO_HALF
#define M3SA_SCORER_WIDEN_TO_HALF 1
#endif
inline constexpr bool kScorerWidensToHalf = M3SA_SCORER_WIDEN_TO_HALF != 0;

// 16 e4m3 values (dims [16 c, 16 c + 16) of row `row`) widened (kScorerWidensToHalf) and stored
// as the two 16-byte chunks they occupy in a 16-bit operand [2 slabs][rows][128 B] with
// `slab_stride` bytes between the slabs.
__device__ __forceinline__ void store_widened_e4m3x16(uint8_t* operand, int slab_stride, int row,
                                                      int c, uint4 raw) {
  uint32_t w[8];
  if constexpr (kScorerWidensToHalf)
    widen_e4m3x16_to_half(raw, w);
  else
    widen_e4m3x16(raw, w);
  uint8_t* slab = operand + (c / 4) * slab_stride;
  *reinterpret_cast<uint4*>(slab + sm90::swizzled_offset(row, 2 * (c % 4))) =
      make_uint4(w[0], w[1], w[2], w[3]);
  *reinterpret_cast<uint4*>(slab + sm90::swizzled_offset(row, 2 * (c % 4) + 1)) =
      make_uint4(w[4], w[5], w[6], w[7]);
}

// A consumer thread's block maxima of its four rows (tile t, half h: m[2 t + h]) when every key
// of the block is visible to them: value (i, e) of a row is key column 8 i + 2 (lane % 4) + e of
// acc[t][4 i + 2 h + e]. All four rows at once, so that their FMNMX chains overlap: row by row,
// each row's shuffles and store waited on the one before (s19 r3 ncu: the maxima took a quarter
// of the consumers' samples, most of them short-scoreboard stalls on the shuffles).
// bench/micro/wgmma_rate.cu times this same code.
template <int kFirst = 0, int kEnd = 4>
__device__ __forceinline__ void unmasked_block_maxima(const float (&acc)[2][64], float (&m)[4]) {
#pragma unroll
  for (int r = kFirst; r < kEnd; ++r) {
    const float(&d)[64] = acc[r / 2];
    const int h = r % 2;
    float chain[4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
      chain[c] = nan_propagating_max(d[4 * c + 2 * h], d[4 * c + 2 * h + 1]);
#pragma unroll
    for (int i = 4; i < 16; ++i)
      chain[i % 4] = nan_propagating_max(
          chain[i % 4], nan_propagating_max(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]));
    m[r] = nan_propagating_max(nan_propagating_max(chain[0], chain[1]),
                               nan_propagating_max(chain[2], chain[3]));
  }
}

// The same for a block that reaches past the tile's first position: row r sees the columns
// 8 i + e <= visible[r] (key column 8 i + 2 (lane % 4) + e relative to the block's first key).
template <int kFirst = 0, int kEnd = 4>
__device__ __forceinline__ void masked_block_maxima(const float (&acc)[2][64],
                                                    const int (&visible)[4], float (&m)[4]) {
#pragma unroll
  for (int r = kFirst; r < kEnd; ++r) {
    const float(&d)[64] = acc[r / 2];
    const int h = r % 2;
    m[r] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * i + e <= visible[r]) m[r] = nan_propagating_max(m[r], d[4 * i + 2 * h + e]);
  }
}

// The four rows' maxima across the quad of lanes that holds each row, the four rows' shuffles
// issued together.
__device__ __forceinline__ void combine_quad_maxima(float (&m)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r)
    m[r] = nan_propagating_max(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
#pragma unroll
  for (int r = 0; r < 4; ++r)
    m[r] = nan_propagating_max(m[r], __shfl_xor_sync(0xffffffffu, m[r], 2));
}

// Diagnostic builds only (never in the library; bench/NOTES.md s20 r4): 1 = no page is loaded or
// waited for, the consumers multiply whatever the stages hold: the kernel without its page supply.
#ifndef M3SA_SCORER_NO_PAGES
#define M3SA_SCORER_NO_PAGES 0
#endif
// Diagnostic builds only: the consumers' other ingredients left out, to find which of them costs
// the ~1,150 cycles a block the kernel spends above bench/micro/wgmma_rate's loop (s20 r5). Bits:
// 1 = no score stores (the maxima folded into a register), 2 = no maxima at all (one accumulator
// of each tile folded), 4 = queries staged for a CTA's first unit only, 8 = no block-table read a
// block (every page taken as valid). Selections are wrong in such builds: time them, nothing else.
#ifndef M3SA_SCORER_SKIP
#define M3SA_SCORER_SKIP 0
#endif

template <typename StoredT, bool kTensorCoreFp8>
__global__ void __launch_bounds__(kSm90ScoreThreads, 1)
    score_blocks_sm90_kernel(const __grid_constant__ ScoreBlocksSm90Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = Sm90ScoreTraits<StoredT, kTensorCoreFp8>;
  constexpr int kStages = Traits::kStages, kRawStages = Traits::kRawStages;
  const ScoreBlocksParams& p = params.scoring;
  extern __shared__ uint8_t smem_raw[];
  // Operands at a 1024-byte boundary (the swizzle atom); barriers after them.
  uint8_t* smem = sm90::align_to_swizzle_atom(smem_raw);
  uint8_t* query_s = smem;                                   // [slab][256 rows][128 B], 16-bit
  uint8_t* key_s = smem + Traits::kQueryBytes;               // [stage][slab][128 keys][128 B]
  uint8_t* raw_s = key_s + kStages * Traits::kStageBytes;    // [raw stage][128 keys][128 B] e4m3
  uint8_t* score_s = raw_s + kRawStages * Traits::kRawBytes; // [warp][Traits::kWarpScoreBytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(score_s + Traits::kScoreBytes);
  uint64_t* empty = full + kStages;
  uint64_t* raw_full = empty + kStages;
  uint64_t* raw_empty = raw_full + kRawStages;
  uint64_t* query_full = raw_empty + kRawStages; // [consumer]

  const int warpgroup = threadIdx.x / 128;
  M3SA_SCORER_STAMPS_ENTRY();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // bf16: the TMA thread's arrive with the page's bytes; e4m3: the 4 widening warps.
      sm90::mbarrier_init(&full[s], Traits::kFp8 ? 4 : 1);
      sm90::mbarrier_init(&empty[s], 8); // one arrive per consumer warp
    }
    for (int s = 0; s < kRawStages; ++s) {
      sm90::mbarrier_init(&raw_full[s], 1);  // the TMA thread's arrive with the bytes
      sm90::mbarrier_init(&raw_empty[s], 4); // the 4 widening warps
    }
    for (int c = 0; c < 2; ++c) sm90::mbarrier_init(&query_full[c], 1); // the TMA thread's arrive
    sm90::fence_barrier_init();
  }
  __syncthreads();
  // Launched to overlap the schedule kernel: nothing above read global memory (the schedule is
  // that kernel's output).
  wait_for_prior_grids();
  allow_next_grid();
  M3SA_SCORER_STAMPS_START();
  const ScoringSchedule schedule = *params.schedule;

  if (warpgroup == 0) {
    sm90::release_registers<kSm90ProducerRegisters>();
    if (M3SA_SCORER_NO_PAGES) return;
    if constexpr (!Traits::kFp8) {
      if (threadIdx.x != 0) return;
      sm90::prefetch_tensor_map(params.index_k_map);
      Sm90PageCursor cursor;
      int page;
      for (int i = 0; cursor.next(params, schedule, &page); ++i) {
        const int stage = i % kStages;
        M3SA_SCORER_SPAN(stamp);
        sm90::mbarrier_wait(&empty[stage], ((i / kStages) & 1) ^ 1);
        M3SA_SCORER_ADD(stamp, PageWait);
        if (!sm90_page_valid(p, page)) { // consumers skip it too; the flag says why
          atomicOr(p.error_flags, kPageOutOfRange);
          sm90::mbarrier_arrive(&full[stage]);
          continue;
        }
        sm90::mbarrier_arrive_expect_tx(&full[stage], Traits::kStageBytes);
        for (int slab = 0; slab < Traits::kSlabs; ++slab)
          sm90::tma_load_3d(key_s + stage * Traits::kStageBytes + slab * Traits::kSlabBytes,
                            params.index_k_map, &full[stage], slab * 64, 0, page);
      }
    } else {
      // Thread 0 keeps kRawStages raw pages in flight; all 128 threads widen them in order.
      Sm90PageCursor issue_cursor, widen_cursor;
      int issued = 0;
      const auto issue_next = [&] {
        int page;
        if (!issue_cursor.next(params, schedule, &page)) return;
        const int slot = issued % kRawStages;
        sm90::mbarrier_wait(&raw_empty[slot], ((issued / kRawStages) & 1) ^ 1);
        if (sm90_page_valid(p, page)) {
          sm90::mbarrier_arrive_expect_tx(&raw_full[slot], Traits::kRawBytes);
          sm90::tma_load_3d(raw_s + slot * Traits::kRawBytes, params.index_k_map, &raw_full[slot],
                            0, 0, page);
        } else {
          atomicOr(p.error_flags, kPageOutOfRange);
          sm90::mbarrier_arrive(&raw_full[slot]);
        }
        ++issued;
      };
      if (threadIdx.x == 0) {
        sm90::prefetch_tensor_map(params.index_k_map);
        for (int i = 0; i < kRawStages; ++i) issue_next();
      }
      const int lane = threadIdx.x % 32;
      int page;
      for (int i = 0; widen_cursor.next(params, schedule, &page); ++i) {
        const int slot = i % kRawStages, stage = i % kStages;
        sm90::mbarrier_wait(&raw_full[slot], (i / kRawStages) & 1);
        M3SA_SCORER_SPAN(stamp);
        sm90::mbarrier_wait(&empty[stage], ((i / kStages) & 1) ^ 1);
        M3SA_SCORER_ADD(stamp, PageWait);
        if (sm90_page_valid(p, page)) {
          const uint8_t* raw = raw_s + slot * Traits::kRawBytes;
          uint8_t* stage_s = key_s + stage * Traits::kStageBytes;
#pragma unroll 2
          for (int j = 0; j < 8; ++j) { // 128 keys x 8 chunks of 16 e4m3 values
            const int chunk = threadIdx.x + 128 * j, key = chunk / 8, c = chunk % 8;
            const uint4 v = *reinterpret_cast<const uint4*>(raw + sm90::swizzled_offset(key, c));
            store_widened_e4m3x16(stage_s, Traits::kSlabBytes, key, c, v);
          }
          sm90::fence_proxy_async_shared(); // the stores, before the consumers' wgmma reads
        }
        __syncwarp();
        if (lane == 0) {
          sm90::mbarrier_arrive(&full[stage]);
          sm90::mbarrier_arrive(&raw_empty[slot]);
        }
        if (threadIdx.x == 0) issue_next(); // the raw slot just freed takes the next page
      }
    }
    M3SA_SCORER_PRODUCER_DONE();
    return;
  }

  sm90::claim_registers<kSm90ConsumerRegisters>();
  const int consumer = warpgroup - 1, thread = threadIdx.x - 128 * warpgroup;
  const int warp = thread / 32, lane = thread % 32;
  const int heads = p.heads;
  // This consumer's rows: tile t (m64), half h: row_base + 64 t + 16 warp + lane / 4 + 8 h.
  const int row_base = consumer * 128;
  const auto thread_row = [&](int t, int h) {
    return row_base + 64 * t + 16 * warp + lane / 4 + 8 * h;
  };
  float acc[2][64];
  int iteration = 0;
  // bf16 queries by TMA (params.query_by_tma): a consumer's 128 rows as 4 boxes (2 m64 tiles x 2
  // slabs of 64 dims, 8 KB each), issued by its thread 0 once all its warps' MMAs have read
  // query_s: during the last block of the previous unit when that unit is the CTA's previous one
  // and the next unit holds blocks, else at the unit's start. The consumer then waits on
  // query_full[consumer] instead of loading and storing the rows itself.
  const bool query_by_tma = !Traits::kFp8 && !Traits::kNativeFp8 && params.query_by_tma != 0;
  uint32_t query_phase = 0;
  int prefetched_unit = -1; // the unit whose queries are in flight or landed
  const auto issue_query_boxes = [&](int token_begin) {
    if (thread != 0) return;
    constexpr int kBoxBytes = 64 * 128;
    sm90::mbarrier_arrive_expect_tx(&query_full[consumer], 4 * kBoxBytes);
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int slab = 0; slab < 2; ++slab)
        sm90::tma_load_3d(query_s + slab * (kSm90TileRows * 128) + (row_base + 64 * t) * 128,
                          params.index_q_map, &query_full[consumer], slab * 64, 0,
                          token_begin + (row_base + 64 * t) / heads);
  };
#if M3SA_SCORER_SKIP
  float skip_sink = 0.f; // keeps the folds alive
#endif
#if M3SA_SCORER_SKIP & 4
  bool staged_once = false;
#endif
  for (int unit = blockIdx.x; unit < schedule.num_units; unit += gridDim.x) {
    const ScoringUnit su = params.units[unit];
    const RowTile tile = p.tiles[su.tile];
    const int range = su.range;
    const TileGeometry geo = tile_geometry(p, tile);
    const BlockRange blocks = sm90_unit_blocks(schedule, geo, range);
    const auto score_row = [&](int row) {
      return p.scores + (row % heads) * p.score_stride_head +
             (tile.token_begin + row / heads) * p.score_stride_token;
    };
    if (range == 0) { // once per tile: its flag, and the export's columns past its blocks
      if (geo.bad && consumer == 0 && thread == 0) atomicOr(p.error_flags, kSeqLenBeyondTable);
      if (p.fill_tail && !geo.bad) {
        const int tail = p.score_width - geo.n_max;
        for (int i = threadIdx.x - 128; i < geo.rows * tail; i += 256)
          score_row(i % geo.rows)[(geo.n_max + i / geo.rows) * p.score_stride_block] = -INFINITY;
      }
    }
    if (blocks.begin >= blocks.end) continue;
    // The CTA's next unit, when its queries can come during this unit's last block.
    int next_token_begin = -1;
    if (query_by_tma && unit + static_cast<int>(gridDim.x) < schedule.num_units) {
      const ScoringUnit nu = params.units[unit + gridDim.x];
      const RowTile next_tile = p.tiles[nu.tile];
      const BlockRange nb = sm90_unit_blocks(schedule, tile_geometry(p, next_tile), nu.range);
      if (nb.begin < nb.end) next_token_begin = next_tile.token_begin;
    }
    M3SA_SCORER_SPAN(stamp);
    M3SA_SCORER_COUNT(1, blocks.end - blocks.begin);

    // Per row of this thread: the position the causal mask compares key positions with (relative
    // to b * 128 and this lane's first column).
    const bool rows_active = row_base < geo.rows; // this consumer has rows in the tile
    int last_key[4];                              // row r = 2 t + h
#pragma unroll
    for (int r = 0; r < 4; ++r)
      last_key[r] = geo.first_pos + thread_row(r / 2, r % 2) / heads - 2 * (lane % 4);

    // This consumer's 128 query rows, swizzled into its half of query_s: bf16, e4m3 widened to
    // fp16, or e4m3 as stored for QGMMA; zeros past the tile. Thread i takes chunk i % kChunks of
    // every kRowStep-th row from i / kChunks, its loads issued kLoadBatch at a time, the first
    // batch before the barrier (one load at a time, each unit's staging waited 16 load latencies:
    // ncu put a third of the S = 8K stalls on them, s18 r3).
    constexpr int kChunks = sizeof(StoredT) == 1 ? 8 : 16; // 16-byte chunks of a stored row
    constexpr int kRowStep = 128 / kChunks, kLoadBatch = 8;
    static_assert(kChunks % kLoadBatch == 0);
    const StoredT* q = static_cast<const StoredT*>(p.index_q);
    const int chunk = thread % kChunks;
    // Row r is token r / H, head r % H: shifts when H is a power of two (an integer division by H
    // costs ~20 instructions, 16 of them a unit and thread), a division otherwise.
    const int head_shift = (heads & (heads - 1)) == 0 ? __ffs(heads) - 1 : -1;
    const auto load_batch = [&](int first, uint4(&raw)[kLoadBatch], auto token_of) {
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int row = row_base + thread / kChunks + kRowStep * (first + k);
        const int token = token_of(row);
        raw[k] = row < geo.rows ? load_chunk(q + (tile.token_begin + token) * p.q_stride_token +
                                                 (row - token * heads) * p.q_stride_head,
                                             chunk)
                                : make_uint4(0, 0, 0, 0);
      }
    };
#if M3SA_SCORER_SKIP & 4
    const bool stage_queries = !staged_once;
    staged_once = true;
#else
    constexpr bool stage_queries = true;
#endif
    if (query_by_tma) {
      if (prefetched_unit != unit) {
        sm90::named_barrier_sync(1 + consumer, 128); // the previous unit's MMAs have read query_s
        issue_query_boxes(tile.token_begin);
      }
      sm90::mbarrier_wait(&query_full[consumer], query_phase);
      query_phase ^= 1;
    }
#pragma unroll
    for (int first = 0; first < kChunks && stage_queries && !query_by_tma; first += kLoadBatch) {
      uint4 raw[kLoadBatch];
      if (head_shift >= 0)
        load_batch(first, raw, [&](int row) { return row >> head_shift; });
      else
        load_batch(first, raw, [&](int row) { return row / heads; });
      if (first == 0)
        sm90::named_barrier_sync(1 + consumer, 128); // the previous unit's MMAs have read query_s
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int row = row_base + thread / kChunks + kRowStep * (first + k);
        if constexpr (Traits::kFp8)
          store_widened_e4m3x16(query_s, kSm90TileRows * 128, row, chunk, raw[k]);
        else // bf16, or e4m3 for QGMMA (8 chunks: slab 0 only)
          *reinterpret_cast<uint4*>(query_s + (chunk / 8) * (kSm90TileRows * 128) +
                                    sm90::swizzled_offset(row, chunk % 8)) = raw[k];
      }
    }
    if (!query_by_tma) {
      sm90::fence_proxy_async_shared();
      sm90::named_barrier_sync(1 + consumer, 128);
    }
    // Widened e4m3: the consumer's query rows as wgmma A fragments in registers for the whole
    // unit, so that the MMAs read only the keys from shared memory, where the producer's widening
    // already adds 48 KB of traffic a page (index_topk 3-4 % faster at S >= 32K, s20 r2). bf16
    // keeps A in shared memory: there registers made it 2-5 % slower (the same run).
    uint32_t query_a[2][8][4];
    if constexpr (Traits::kFp8) {
      const uint32_t query_base = sm90::shared_address(query_s);
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < 8; ++j) // k step j: chunks 2 (j % 4), + 1 of slab j / 4
          sm90::load_a_fragment(query_a[t][j], query_base + (j / 4) * (kSm90TileRows * 128),
                                row_base + 64 * t + 16 * warp, 2 * (j % 4), lane);
    }
    // The warp's gathered scores (Traits::kScoreColumns): its 32 rows' outputs (local row l =
    // 16 t + 8 h + lane / 4 of thread_row(t, h); nullptr past the tile), then their values.
    uint8_t* const warp_scores = Traits::kFp8
                                     ? query_s + (row_base + 16 * warp) * 128
                                     : score_s + (4 * consumer + warp) * Traits::kWarpScoreBytes;
    float** const score_rows = reinterpret_cast<float**>(warp_scores);
    float* const score_values = reinterpret_cast<float*>(warp_scores + 32 * 8);
    __syncwarp(); // widened e4m3: the warp's fragment loads read these bytes before
    {
      const int row = row_base + 64 * (lane / 16) + 16 * warp + lane % 16;
      score_rows[lane] = row < geo.rows ? score_row(row) : nullptr;
    }
    int group_begin = blocks.begin; // column j holds block group_begin + j
    unsigned group_columns = 0;     // bit j: column j holds maxima to write
    // Entry e of the warp's 32 x kScoreColumns is row e / kScoreColumns, column e % kScoreColumns:
    // each store instruction writes kScoreColumns consecutive blocks of 32 / kScoreColumns rows.
    // The shared-memory reads go first, kWriteBatch entries at a time, and the stores are
    // st.global (__stcg): with generic stores each read waited for the store before it (8
    // shared-memory round trips a flush under the MMAs' operand traffic, s21 r2).
    const auto write_gathered_scores = [&] {
      if (group_columns == 0) return; // warp-uniform: pages and rows_active are
      __syncwarp();
      constexpr int kWriteBatch = Traits::kFp8 ? 2 : 4; // e4m3 spilled with 4 (its A fragments)
#pragma unroll
      for (int first = 0; first < Traits::kScoreColumns; first += kWriteBatch) {
        float* out[kWriteBatch];
        float value[kWriteBatch];
#pragma unroll
        for (int i = 0; i < kWriteBatch; ++i) {
          const int e = lane + 32 * (first + i), r = e / Traits::kScoreColumns;
          out[i] = score_rows[r];
          value[i] = score_values[r * Traits::kScoreRowWords + e % Traits::kScoreColumns];
        }
#pragma unroll
        for (int i = 0; i < kWriteBatch; ++i) {
          const int j = (lane + 32 * (first + i)) % Traits::kScoreColumns;
          if ((group_columns >> j & 1) != 0 && out[i] != nullptr)
            __stcg(out[i] + (group_begin + j) * p.score_stride_block, value[i]);
        }
      }
      __syncwarp(); // the columns are free again
    };
    M3SA_SCORER_ADD(stamp, Staging);

    for (int b = blocks.begin; b < blocks.end; ++b, ++iteration) {
      const int stage = iteration % kStages;
      // Block maxima of the thread's rows kFirst .. kEnd - 1 (tile t, half h: m[2 t + h]): all
      // four after the MMAs, or with kTileOverlap tile 0's rows between the two groups' waits.
      float m[4];
      const auto block_maxima = [&]<int kFirst, int kEnd>(float(&out)[4]) {
        if (b * 128 + 127 <= geo.first_pos) { // every key of the block is visible to every row
          unmasked_block_maxima<kFirst, kEnd>(acc, out);
        } else {
          int visible[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) visible[r] = last_key[r] - b * 128;
          masked_block_maxima<kFirst, kEnd>(acc, visible, out);
        }
      };
      if (!M3SA_SCORER_NO_PAGES) sm90::mbarrier_wait(&full[stage], (iteration / kStages) & 1);
      M3SA_SCORER_ADD(stamp, PageWait);
#if M3SA_SCORER_SKIP & 8
      constexpr bool page_ok = true;
#else
      const bool page_ok =
          sm90_page_valid(p, p.block_table[geo.request * p.block_table_stride + b]);
#endif
      // Both m64 tiles, always: a branch around wgmma (even a uniform one) makes ptxas serialise
      // them; an idle tile (rows of zeros past the tile) costs tensor time only on short chunks.
      {
        const uint32_t key_base = sm90::shared_address(key_s + stage * Traits::kStageBytes);
        const uint32_t query_base = sm90::shared_address(query_s) + row_base * 128;
        sm90::fence_accumulators(acc[0]);
        sm90::fence_accumulators(acc[1]);
        sm90::wgmma_fence();
        if constexpr (Traits::kNativeFp8) {
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int k = 0; k < 4; ++k) // 32 e4m3 dims of the 128-byte row per instruction
              sm90::wgmma_m64n128k32_e4m3(
                  acc[t], sm90::operand_descriptor(query_base + t * 64 * 128 + k * 32),
                  sm90::operand_descriptor(key_base + k * 32), k);
        } else {
          if constexpr (Traits::kFp8) {
            sm90::fence_fragments<8>(query_a[0]);
            sm90::fence_fragments<8>(query_a[1]);
          }
#pragma unroll
          for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int slab = 0; slab < 2; ++slab) {
#pragma unroll
              for (int k = 0; k < 4; ++k) { // 32 bytes of the 128-byte row per instruction
                const uint64_t bk =
                    sm90::operand_descriptor(key_base + slab * Traits::kSlabBytes + k * 32);
                if constexpr (Traits::kFp8)
                  sm90::wgmma_m64n128k16_rs<kScorerWidensToHalf>(acc[t], query_a[t][slab * 4 + k],
                                                                 bk, slab + k);
                else
                  sm90::wgmma_m64n128k16_bf16(
                      acc[t],
                      sm90::operand_descriptor(query_base + slab * (kSm90TileRows * 128) +
                                               t * 64 * 128 + k * 32),
                      bk, slab + k);
              }
            }
            if constexpr (Traits::kTileOverlap) sm90::wgmma_commit_group(); // tile t's group
          }
        }
        if constexpr (!Traits::kTileOverlap) sm90::wgmma_commit_group();
        if (b - group_begin == Traits::kScoreColumns) { // full: out while the tensor cores work
          write_gathered_scores();
          group_begin = b, group_columns = 0;
        }
        if constexpr (Traits::kTileOverlap) { // tile 0's maxima while tile 1 multiplies
          sm90::wgmma_wait<1>();
          sm90::fence_accumulators(acc[0]);
          if (page_ok && rows_active && !(M3SA_SCORER_SKIP & 2))
            block_maxima.template operator()<0, 2>(m);
        }
        sm90::wgmma_wait_all();
        sm90::fence_accumulators(acc[0]);
        sm90::fence_accumulators(acc[1]);
        if (b + 1 == blocks.end && next_token_begin >= 0) { // the next unit's queries, now
          sm90::named_barrier_sync(1 + consumer, 128);      // every warp's MMAs have read query_s
          issue_query_boxes(next_token_begin);
          prefetched_unit = unit + gridDim.x;
        }
      }
      M3SA_SCORER_ADD(stamp, Mma);
      __syncwarp();
      if (lane == 0 && !M3SA_SCORER_NO_PAGES)
        sm90::mbarrier_arrive(&empty[stage]); // the page may be refilled now
      if (!page_ok || !rows_active) continue;
#if M3SA_SCORER_SKIP & 2
      skip_sink += acc[0][0] + acc[1][63];
      M3SA_SCORER_ADD(stamp, Maxima);
      continue;
#endif

      if constexpr (Traits::kTileOverlap)
        block_maxima.template operator()<2, 4>(m);
      else
        block_maxima.template operator()<0, 4>(m);
      combine_quad_maxima(m);
      {
        // The quad's lanes all hold its four rows' maxima: lane takes row r = lane % 4's, local
        // row 8 r + lane / 4.
        const int r = lane % 4;
        const float v = (r == 0 ? m[0] : r == 1 ? m[1] : r == 2 ? m[2] : m[3]) * p.scale;
#if M3SA_SCORER_SKIP & 1
        skip_sink += v;
#else
        score_values[(8 * r + lane / 4) * Traits::kScoreRowWords + (b - group_begin)] = v;
        group_columns |= 1u << (b - group_begin);
#endif
      }
      M3SA_SCORER_ADD(stamp, Maxima);
    }
    write_gathered_scores(); // the unit's last columns
  }
#if M3SA_SCORER_SKIP
  if (skip_sink == 1234.5f) atomicOr(p.error_flags, 0u); // never true: keeps the folds alive
#endif
  M3SA_SCORER_STAMPS_EXIT();
#endif
}

template <typename StoredT, bool kTensorCoreFp8 = false>
cudaError_t launch_score_blocks_sm90(const ScoreBlocksSm90Params& p, int grid, cudaStream_t s) {
  LaunchOptions options;
  options.overlap_prior = true;
  const cudaError_t status = launch_with_shared_memory(
      score_blocks_sm90_kernel<StoredT, kTensorCoreFp8>, dim3(grid), kSm90ScoreThreads,
      Sm90ScoreTraits<StoredT, kTensorCoreFp8>::kSmemBytes, s, p, options);
  after_scorer_launch(grid, s); // diagnostic builds only (scorer_stamps.cuh)
  return status;
}

template <typename StoredT, bool kTensorCoreFp8 = false> bool score_blocks_sm90_has_sm90a_code() {
  return has_sm90a_code(score_blocks_sm90_kernel<StoredT, kTensorCoreFp8>, kSm90LaunchRegisters);
}

} // namespace m3sa::cuda
