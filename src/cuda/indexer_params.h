#pragma once
// Plain parameter structs of the CUDA indexer kernels (host- and device-includable; of CUDA's
// headers only the vector types). Strides are in elements. Every length is read on the device; only
// capacities and the live token / request counts travel as values, so a captured graph replays on
// new data.
#include <vector_types.h>

#include <cstdint>

namespace m3sa::cuda {

// Bits of the device-side error flag (contract §9): a kernel that meets bad metadata skips the read
// and ORs a bit in; read it with m3sa::read_device_errors().
enum DeviceErrorBits : int32_t {
  kPageOutOfRange = 1,      // a block-table entry outside [0, num_pages)
  kSeqLenBeyondTable = 2,   // seq_len > block-table width * 128, or q_len > seq_len
  kSlotOutOfRange = 4,      // insert_index_k slot >= num_pages * 128
  kDecodeQLenMismatch = 8,  // a decode request whose q_len is not batch.decode_q_len
  kPositionOutOfRange = 16, // norm_rope_insert: a position outside [0, 2^24) or the cos/sin table
};

// One unit of scoring work: consecutive tokens of one request.
struct RowTile {
  int32_t request;
  int32_t token_begin; // packed token index
  int32_t token_count; // <= tile_tokens
  int32_t padding;     // keeps the struct 16 bytes: one vector load per tile
};

// What the schedule kernel tells the SM90 scorer (cuda.score_blocks.sm90): its work units are
// (row tile, range of blocks_per_range consecutive causal blocks), listed range-major in
// ScoringUnit entries: every tile's range 0 (its flags and the export's tail), then only the
// ranges that hold blocks.
struct ScoringSchedule {
  int32_t num_tiles;
  int32_t blocks_per_range;
  int32_t ranges;    // max over tiles of ceil(causal blocks / blocks_per_range), >= 1
  int32_t num_units; // entries of the unit list
};
struct ScoringUnit {
  int32_t tile;
  int32_t range;
};

struct ScheduleParams {
  const int32_t* cu_q_lens; // [R + 1]
  const int32_t* seq_lens;  // [R]
  int32_t first_request;    // tiles for requests [first_request, num_requests)
  int32_t num_requests;
  int32_t tile_tokens;   // tokens per tile: 64 / H rows of 128-d queries
  int32_t tile_capacity; // entries in tiles
  RowTile* tiles;        // [tile_capacity] out
  int32_t* num_tiles;    // [1] out
  // SM90 scorer only (else null): also fill the schedule and its unit list from the tiles'
  // causal block counts.
  ScoringSchedule* schedule;
  ScoringUnit* units;      // [unit_capacity] out
  int32_t* range_starts;   // [range_capacity] scratch
  int32_t unit_capacity;   // >= tiles x max(1, ceil(table_width / kMinBlocksPerRange))
  int32_t range_capacity;  // >= max(1, ceil(table_width / kMinBlocksPerRange))
  int32_t table_width;     // block-table columns: bounds each tile's blocks
  int32_t persistent_ctas; // the scorer's grid: the units are sized to balance over it
};

struct ScoreBlocksParams {
  const void* index_q; // [T, H, 128] bf16 or e4m3 (same as the cache)
  int64_t q_stride_token, q_stride_head;
  const void* index_k_cache; // [num_pages, 128, 128]
  int64_t cache_stride_page, cache_stride_token;
  int32_t num_pages;
  const int32_t* cu_q_lens;   // [R + 1]
  const int32_t* seq_lens;    // [R]
  const int32_t* block_table; // [R, width]
  int64_t block_table_stride;
  int32_t block_table_width;
  const RowTile* tiles;     // [tile_capacity] from the schedule kernel
  const int32_t* num_tiles; // [1]
  float* scores;            // [H, T, score_width] out
  int64_t score_stride_head, score_stride_token, score_stride_block;
  int32_t score_width;
  int32_t fill_tail; // 1: write -inf for columns past the tile's causal blocks
  int32_t heads;
  int32_t tile_tokens;
  int32_t splits; // gridDim.y: block ranges per tile
  float scale;
  int32_t* error_flags; // [1]
  // Context-parallel shard: this rank scores only its blocks. block_table holds the rank's local
  // blocks (column j = the rank's j-th block); global block ids rank the candidates.
  // Unsharded: count 1, rank 0 (local == global).
  int32_t shard_count, shard_rank;
  int32_t shard_span; // > 0: contiguous shards of shard_span blocks; 0: round-robin (b % count)
};

// The SM90 scorer: `scoring` as for the portable kernel (tiles of 256 / H tokens; num_tiles,
// splits and the shard fields unused: unsharded only), the cache through a TMA descriptor.
struct ScoreBlocksSm90Params {
  // CUtensorMap (opaque, 128 B, 64-aligned) of index_k_cache: 3D (128 dims, 128 tokens, pages),
  // boxes of 128 B x 128 tokens x 1 page, 128 B swizzle. Encoded by the host per run.
  alignas(64) uint64_t index_k_map[16];
  // CUtensorMap of index_q (bf16, H a power of two: tensor_maps.h encode_index_q_map), when
  // query_by_tma: the consumers' query rows arrive by TMA, the next unit's during the last block.
  alignas(64) uint64_t index_q_map[16];
  int32_t query_by_tma;
  ScoreBlocksParams scoring;
  const ScoringSchedule* schedule; // [1] from the schedule kernel
  const ScoringUnit* units;        // [schedule->num_units] from the schedule kernel
};

// The rows a selection writes, shared by the kernels that end in selections (select, merge).
struct SelectionRows {
  const int32_t* cu_q_lens; // [R + 1]
  const int32_t* seq_lens;  // [R]
  int32_t num_requests;
  int32_t num_tokens;     // live tokens; rows past it are left alone
  int32_t token_capacity; // rows per head in the grid
  int32_t* topk;          // [H, T, K] out
  int64_t topk_stride_head, topk_stride_token, topk_stride_k;
  int32_t heads, top_k, local_blocks, init_blocks;
};

struct SelectTopkParams {
  const float* scores; // [H, T, width]
  int64_t score_stride_head, score_stride_token, score_stride_block;
  int32_t score_width; // rows needing more causal blocks are refused (error flag)
  SelectionRows rows;
  int32_t first_request; // rows of earlier requests (decode) are left to the decode kernel
  int32_t* error_flags;  // [1]
  // 0: a first pass bounds the fill-th score from below (select_topk.cuh rank_floor) and only
  // the candidates above the bound are ranked, against each other; rows where too many survive
  // (ties) rank every candidate. 1: every row ranks every candidate (the tests' comparison).
  // Same selections either way.
  int32_t rank_every_candidate;
  // Set by launch_select_topk: > 0 when select_topk_groups_kernel has selected the rows of at most
  // this many candidates and select_topk_kernel is to take only the longer ones.
  int32_t group_candidates;
};

// For every causal block of the prefill requests [first_request, num_requests) and every k32 step
// j, the largest L2 norm of the visible keys' (positions < seq_len) dims [0, 32 (j + 1)): +inf for
// a block with a NaN key or an invalid page (certify_selection.cuh then rescores such blocks, or
// leaves the row to the flag). Of `scoring` it reads the cache, seq_lens and the block table.
struct KeyNormParams {
  ScoreBlocksParams scoring; // e4m3 cache
  int32_t first_request, num_requests;
  float4* key_norms; // [R, key_norm_stride] out (workspace); blocks past the stride are left out
  int32_t key_norm_stride;
};

// index_topk's prefill rows after QGMMA scores (inexact sums) and their selection: every row's
// selection checked against the per-block error bound error_scale * sum_j |q_{<=j}| key_norm[j],
// and the blocks whose bound reaches across the row's K-th score rescored exactly (fp32 sums of the
// exact e4m3 products) and selected among. `select` as the selection was launched with; of
// `scoring` the query, the cache, the block table and the scale.
struct CertifySelectionParams {
  SelectTopkParams select;
  ScoreBlocksParams scoring; // e4m3 query and cache
  const float4* key_norms;   // [R, key_norm_stride] (KeyNormParams)
  int64_t key_norm_stride;
  float error_scale; // kQgmmaStepError * |scale|
};

// Decode rows of index_topk: scoring as above (tiles, num_tiles and scores unused; tiles are
// derived from the request index), then per-range candidate lists merged by the last CTA.
struct DecodeTopkParams {
  ScoreBlocksParams scoring;
  int32_t num_decode_requests;
  int32_t decode_q_len;
  int32_t tiles_per_request; // ceil(decode_q_len / tile_tokens); gridDim.x >= requests * this
  int32_t top_k, init_blocks, local_blocks;
  uint64_t* partial_lists; // [gridDim.x, splits, 64, top_k - init - local] workspace
  int32_t* arrivals;       // [gridDim.x] zero on entry; left zero on exit
  uint64_t* candidates;    // non-null: [H, token capacity, ranked slots] keys out instead of topk
  int32_t candidate_token_capacity;
  int32_t* topk; // [H, T, K] out
  int64_t topk_stride_head, topk_stride_token, topk_stride_k;
};

// The Hopper decode kernel (decode_topk_sm90.cuh): `decode` as for the portable kernel (splits:
// one CTA per SM's worth), the index cache through a TMA descriptor.
struct DecodeTopkSm90Params {
  // CUtensorMap (opaque, 128 B, 64-aligned) of index_k_cache, as ScoreBlocksSm90Params's.
  alignas(64) uint64_t index_k_map[16];
  DecodeTopkParams decode;
};

// Merge of per-rank candidate keys [ranks, H, T, ranked slots] into final selections.
struct MergeCandidatesParams {
  const uint64_t* candidates;
  int64_t rank_stride; // H * T * ranked slots
  int32_t num_ranks;
  SelectionRows rows;
};

// norm_rope_insert; rows per token: q heads, index-q heads, k heads, v heads, index k.
struct NormRopeInsertParams {
  const void* q; // [T, Hq, 128] bf16
  int64_t q_stride_token, q_stride_head;
  const void* k; // [T, Hkv, 128] bf16
  int64_t k_stride_token, k_stride_head;
  const void* v; // [T, Hkv, 128] bf16
  int64_t v_stride_token, v_stride_head;
  const void* index_q; // [T, H, 128] bf16
  int64_t index_q_stride_token, index_q_stride_head;
  const void* index_k; // [T, 128] bf16
  int64_t index_k_stride_token;
  const int64_t* positions; // [T]
  int64_t positions_stride;
  const void* norm_weights[4]; // [128] each: q, k, index q, index k
  int32_t norm_weight_is_f32[4];
  const void* cos_sin_cache; // [rows, 64] bf16 or f32, or null: computed from inv_freq
  int64_t cos_sin_stride, cos_sin_rows;
  int32_t cos_sin_is_f32;
  const int64_t* slot_mapping; // [T]
  int64_t slot_stride;
  const int64_t* index_slot_mapping; // [T]
  int64_t index_slot_stride;
  void* q_out; // [T, Hq, 128] bf16
  int64_t q_out_stride_token, q_out_stride_head;
  void* k_cache; // [pages, 128, Hkv, 128] bf16 or e4m3
  int64_t k_cache_stride_page, k_cache_stride_token, k_cache_stride_head;
  void* v_cache; // [pages, 128, Hkv, 128], k_cache's dtype
  int64_t v_cache_stride_page, v_cache_stride_token, v_cache_stride_head;
  int64_t kv_pages;
  int32_t kv_is_fp8;
  float k_scale, v_scale;
  void* index_q_out; // [T, H, 128] bf16 or e4m3 (the index cache dtype)
  int64_t index_q_out_stride_token, index_q_out_stride_head;
  void* index_k_cache; // [index_pages, 128, 128]
  int64_t index_cache_stride_page, index_cache_stride_token;
  int64_t index_pages;
  int32_t index_is_fp8;
  int32_t num_tokens, q_heads, kv_heads, index_heads;
  float eps, weight_offset;
  float inv_freq[32];   // theta^(-i/32) rounded to fp32, computed on the host
  int32_t* error_flags; // [1]
};

struct InsertIndexKParams {
  const void* index_k; // [T, 128] bf16 or f32
  int64_t k_stride_token;
  int32_t k_is_f32;
  const int64_t* slot_mapping; // [T]
  int64_t slot_stride;
  int32_t num_tokens;
  void* index_k_cache; // [num_pages, 128, 128] bf16 or e4m3
  int64_t cache_stride_page, cache_stride_token;
  int32_t num_pages;
  int32_t cache_is_fp8;
  int32_t* error_flags; // [1]
};

} // namespace m3sa::cuda
