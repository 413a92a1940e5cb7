#pragma once
// Block scoring on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), portable to SM80+.
// One CTA = one row tile (up to 64 query rows: tokens x index heads of one request) times one
// range of its causal blocks; its 4 warps share every 128x128 key block staged in shared memory.
// e4m3 data runs on the e4m3 MMA (m16n8k32) where the target has it (SM89+); on older targets it
// is widened to bf16 on the way in (exact), so products and accumulation match the bf16 path.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "cuda/indexer_params.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/indexer_traits.h"
#include "cuda/prepared_divisor.h"

namespace m3sa::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
inline constexpr bool kHaveFp8Mma = true;
#else
inline constexpr bool kHaveFp8Mma = false;
#endif

inline constexpr int kSmemStride =
    128 + 8; // bf16 elements per staged row: +16 B kills bank conflicts
inline constexpr int kScoreSmemBytes =
    (kTileRows + 128) * kSmemStride * 2 + 4 * 16 * 4; // + partial row maxima
// The plan's splits assume kScoringCtasPerSm resident CTAs: their shared memory fits the smallest
// SM80+ budget (A100: 164 KB per SM).
static_assert(kScoringCtasPerSm * kScoreSmemBytes <= 164 * 1024);

// 16-byte chunks of a 128-element stored row: loaded raw, stored into a staged bf16 row.
template <typename StoredT> struct Staging;

template <> struct Staging<__nv_bfloat16> {
  static constexpr int kChunks = 16; // 256 B per row
  __device__ static void store(uint32_t* dst_row, int chunk, uint4 raw) {
    reinterpret_cast<uint4*>(dst_row)[chunk] = raw;
  }
};

template <> struct Staging<__nv_fp8_e4m3> {
  static constexpr int kChunks =
      8; // 128 B per row: kept as bytes for the e4m3 MMA, else widened to 256 B
  __device__ static void store(uint32_t* dst_row, int chunk, uint4 raw) {
    if constexpr (kHaveFp8Mma) {
      reinterpret_cast<uint4*>(dst_row)[chunk] = raw;
    } else {
      widen_e4m3x16_to_bf16(raw, reinterpret_cast<uint4*>(dst_row) + 2 * chunk);
    }
  }
};

template <typename StoredT>
__device__ __forceinline__ uint4 load_chunk(const StoredT* row, int chunk) {
  return __ldg(reinterpret_cast<const uint4*>(row) + chunk);
}

// Stages rows [0, rows) (row i at src + row_offset(i)) as bf16 into dst[i][0..128); rows in
// [rows, padded_rows) become zeros.
template <typename StoredT, typename RowOffset>
__device__ __forceinline__ void stage_rows(uint32_t* dst, const StoredT* src, int rows,
                                           int padded_rows, RowOffset row_offset) {
  constexpr int kChunks = Staging<StoredT>::kChunks;
  for (int i = threadIdx.x; i < padded_rows * kChunks; i += kScoreThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const uint4 raw =
        row < rows ? load_chunk(src + row_offset(row), chunk) : make_uint4(0, 0, 0, 0);
    Staging<StoredT>::store(dst + row * (kSmemStride / 2), chunk, raw);
  }
}

// One 128-key block in flight: every thread holds its share of the raw chunks in registers, so
// all of a block's loads are issued back to back and overlap the MMAs of the previous block.
template <typename StoredT> struct KeyBlockPrefetch {
  static constexpr int kChunks = Staging<StoredT>::kChunks;
  static constexpr int kPerThread = 128 * kChunks / kScoreThreads;
  uint4 raw[kPerThread];

  __device__ void load(const StoredT* page_base, int64_t token_stride, int keys) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kScoreThreads, row = idx / kChunks, chunk = idx % kChunks;
      raw[i] =
          row < keys ? load_chunk(page_base + row * token_stride, chunk) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ void store(uint32_t* k_s) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kScoreThreads, row = idx / kChunks, chunk = idx % kChunks;
      Staging<StoredT>::store(k_s + row * (kSmemStride / 2), chunk, raw[i]);
    }
  }
};

// e4m3 x e4m3 -> fp32, 16x8x32. Same register pattern as the bf16 MMA: word k/4 of a row.
__device__ __forceinline__ void mma_e4m3_16832(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Context-parallel shards: the rank's j-th local block is global block shard_global(j); of n global
// blocks the rank holds shard_local_count(n).
__device__ __forceinline__ int shard_global(const ScoreBlocksParams& p, int j) {
  return p.shard_span > 0 ? p.shard_rank * p.shard_span + j : j * p.shard_count + p.shard_rank;
}
// `shards`: p.shard_count as a PreparedDivisor, or null.
__device__ __forceinline__ int shard_local_count(const ScoreBlocksParams& p, int n,
                                                 const PreparedDivisor* shards = nullptr) {
  if (p.shard_span > 0) return max(0, min(p.shard_span, n - p.shard_rank * p.shard_span));
  const int rounded_up = n - p.shard_rank + p.shard_count - 1;
  return n > p.shard_rank ? (shards ? shards->quotient(rounded_up) : rounded_up / p.shard_count)
                          : 0;
}

// Where a row tile sits in its request's sequence. `bad`: the metadata cannot be served (seq_len
// beyond the block table, or q_len > seq_len); the caller flags it and reads nothing.
struct TileGeometry {
  int request, seq_len, first_pos, last_pos, rows, n_max;
  bool bad;
};

// From the request's bounds [q_begin, q_end) and length, loaded by the caller.
// `shards`: p.shard_count prepared, or null.
__device__ __forceinline__ TileGeometry tile_geometry(const ScoreBlocksParams& p,
                                                      const RowTile& tile, int q_begin, int q_end,
                                                      int seq_len,
                                                      const PreparedDivisor* shards = nullptr) {
  TileGeometry geo;
  geo.request = tile.request;
  const int q_len = q_end - q_begin;
  geo.seq_len = seq_len;
  const int blocks = (geo.seq_len + 127) / 128;
  geo.bad = shard_local_count(p, blocks, shards) > p.block_table_width ||
            (geo.seq_len > 0 && q_len > geo.seq_len);
  geo.first_pos = geo.seq_len - q_len + (tile.token_begin - q_begin);
  geo.last_pos = geo.first_pos + tile.token_count - 1;
  geo.rows = tile.token_count * p.heads;
  geo.n_max = geo.seq_len == 0 ? 0 : geo.last_pos / 128 + 1; // padding rows: no blocks
  return geo;
}
__device__ __forceinline__ TileGeometry tile_geometry(const ScoreBlocksParams& p,
                                                      const RowTile& tile) {
  return tile_geometry(p, tile, p.cu_q_lens[tile.request], p.cu_q_lens[tile.request + 1],
                       p.seq_lens[tile.request]);
}

// The blocks [begin, end) this CTA scores: split blockIdx.y of the tile's causal blocks, at least
// `min_per_split` blocks a split (the last splits then get none: begin >= end).
struct BlockRange {
  int begin, end;
};
__device__ __forceinline__ BlockRange split_block_range(int n_max, int splits,
                                                        int min_per_split = 1,
                                                        const PreparedDivisor* prepared = nullptr) {
  const int per_split = blocks_per_split(n_max, splits, min_per_split, prepared);
  const int begin = blockIdx.y * per_split;
  return {begin, min(n_max, begin + per_split)};
}

// Bytes at the start of the scoring shared memory that are free once on_start runs (the staged
// queries live in registers from then on).
inline constexpr int kReusableSmemBytes = kTileRows * kSmemStride * 2;

// Scores local blocks [range.begin, range.end) (block-table columns; global ids shard_global())
// for the tile's rows: after each block, thread `row` (< rows) calls on_score(row, global block,
// max * scale) with its row's causal block maximum. Blocks
// whose page id is out of range are flagged and not reported. Every thread calls on_start()
// once, before any on_score, when the first kReusableSmemBytes of `smem` are free for the
// caller. Needs kScoreSmemBytes of `smem`.
template <typename StoredT, typename OnStart, typename OnScore>
__device__ __forceinline__ void
score_block_range(const ScoreBlocksParams& p, const RowTile& tile, const TileGeometry& geo,
                  BlockRange range, uint32_t* smem, OnStart on_start, OnScore on_score) {
  // 32-bit words per 16x8 MMA step along k: 16 bf16 or 32 e4m3 values; 8 or 4 steps per 128 dims.
  constexpr bool kFp8Mma = kHaveFp8Mma && std::is_same_v<StoredT, __nv_fp8_e4m3>;
  constexpr int kSteps = kFp8Mma ? 4 : 8;
  if (range.begin >= range.end) {
    on_start();
    return;
  }
  uint32_t* q_s = smem;                                 // [64][136] bf16
  uint32_t* k_s = smem + kTileRows * (kSmemStride / 2); // [128][136] bf16
  float* partial =
      reinterpret_cast<float*>(smem + (kTileRows + 128) * (kSmemStride / 2)); // [4 warps][16 rows]

  // Warps split the work of a key block: G groups of 16 query rows (G = 1, 2 or 4 as the tile
  // needs), each served by 4 / G warps that take disjoint 8-key column tiles.
  const int rows = geo.rows, r = geo.request, seq_len = geo.seq_len, last_pos = geo.last_pos;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int groups = rows <= 16 ? 1 : (rows <= 32 ? 2 : 4);
  const int warps_per_group = 4 / groups;
  const int group = warp / warps_per_group, slice = warp % warps_per_group;
  const int tiles_per_warp = 16 / warps_per_group;
  const int row0 = group * 16 + g, row1 = row0 + 8;
  const int pos0 = geo.first_pos + row0 / p.heads, pos1 = geo.first_pos + row1 / p.heads;

  const StoredT* cache = static_cast<const StoredT*>(p.index_k_cache);
  const auto block_keys = [&](int j) {
    const int b = shard_global(p, j);
    return min(128, min(seq_len - b * 128, last_pos - b * 128 + 1));
  };
  const auto block_page = [&](int j) { return p.block_table[r * p.block_table_stride + j]; };
  const auto page_valid = [&](int page) { return page >= 0 && page < p.num_pages; };
  KeyBlockPrefetch<StoredT> prefetch; // the first key block loads while the queries are staged
  {
    const int page = block_page(range.begin);
    prefetch.load(cache + (page_valid(page) ? page * p.cache_stride_page : 0), p.cache_stride_token,
                  page_valid(page) ? block_keys(range.begin) : 0);
  }
  const int heads = p.heads;
  const int64_t q_token = p.q_stride_token, q_head = p.q_stride_head;
  stage_rows(q_s, static_cast<const StoredT*>(p.index_q) + tile.token_begin * q_token, rows,
             kTileRows, [=](int row) { return (row / heads) * q_token + (row % heads) * q_head; });
  __syncthreads();
  uint32_t a[kSteps][4]; // this warp's 16 query rows as A fragments, all k-steps
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const int col = ks * 8 + c; // in bf16 pairs
    a[ks][0] = q_s[row0 * (kSmemStride / 2) + col];
    a[ks][1] = q_s[row1 * (kSmemStride / 2) + col];
    a[ks][2] = q_s[row0 * (kSmemStride / 2) + col + 4];
    a[ks][3] = q_s[row1 * (kSmemStride / 2) + col + 4];
  }
  __syncthreads(); // every warp holds its fragments: q_s is free
  on_start();
  for (int j = range.begin; j < range.end; ++j) {
    const int b = shard_global(p, j);
    const int page = block_page(j);
    const bool page_ok = page_valid(page);
    const int keys = block_keys(j);
    if (!page_ok && threadIdx.x == 0) atomicOr(p.error_flags, kPageOutOfRange);
    __syncthreads(); // every warp is done with the previous block's k_s and partial maxima
    prefetch.store(k_s);
    __syncthreads();
    if (j + 1 < range.end) { // next block's loads fly while this block's MMAs run
      const int next = block_page(j + 1);
      prefetch.load(cache + (page_valid(next) ? next * p.cache_stride_page : 0),
                    p.cache_stride_token, page_valid(next) ? block_keys(j + 1) : 0);
    }
    float m0 = -INFINITY, m1 = -INFINITY;
    if (group * 16 < rows) {
      for (int nt = slice * tiles_per_warp; nt < (slice + 1) * tiles_per_warp; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const uint32_t* krow = k_s + (nt * 8 + g) * (kSmemStride / 2);
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          if constexpr (kFp8Mma)
            mma_e4m3_16832(acc, a[ks], krow[ks * 8 + c], krow[ks * 8 + c + 4]);
          else
            mma_bf16_16816(acc, a[ks], krow[ks * 8 + c], krow[ks * 8 + c + 4]);
        }
        const int j = b * 128 + nt * 8 + 2 * c; // key positions j, j + 1
        if (j < b * 128 + keys) {
          if (j <= pos0) m0 = nan_propagating_max(m0, acc[0]);
          if (j <= pos1) m1 = nan_propagating_max(m1, acc[2]);
        }
        if (j + 1 < b * 128 + keys) {
          if (j + 1 <= pos0) m0 = nan_propagating_max(m0, acc[1]);
          if (j + 1 <= pos1) m1 = nan_propagating_max(m1, acc[3]);
        }
      }
    }
    m0 = nan_propagating_max(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = nan_propagating_max(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = nan_propagating_max(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = nan_propagating_max(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    if (c == 0) {
      partial[warp * 16 + g] = m0;
      partial[warp * 16 + g + 8] = m1;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < rows && page_ok) { // thread i finishes row i
      const int row = threadIdx.x, row_group = row / 16;
      float m = -INFINITY;
      for (int s = 0; s < warps_per_group; ++s)
        m = nan_propagating_max(m, partial[(row_group * warps_per_group + s) * 16 + row % 16]);
      on_score(row, b, m * p.scale);
    }
  }
}

// score_blocks and the prefill rows of index_topk: one CTA per (scheduled row tile, block range),
// block maxima written to a [H, T, width] score matrix.
template <typename StoredT>
__global__ void __launch_bounds__(kScoreThreads)
    score_blocks_kernel(const __grid_constant__ ScoreBlocksParams p) {
  if (static_cast<int>(blockIdx.x) >= *p.num_tiles) return;
  extern __shared__ uint32_t smem[];
  const RowTile tile = p.tiles[blockIdx.x];
  const TileGeometry geo = tile_geometry(p, tile);
  if (geo.bad) {
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(p.error_flags, kSeqLenBeyondTable);
    return;
  }
  const auto score_at = [&](int row, int b) -> float& {
    return p.scores[(row % p.heads) * p.score_stride_head +
                    (tile.token_begin + row / p.heads) * p.score_stride_token +
                    b * p.score_stride_block];
  };
  score_block_range<StoredT>(
      p, tile, geo, split_block_range(geo.n_max, p.splits), smem, [] {},
      [&](int row, int b, float score) { score_at(row, b) = score; });
  if (p.fill_tail) { // columns [n_max, width): no visible key for any row of the tile
    const BlockRange tail = split_block_range(p.score_width - geo.n_max, p.splits);
    for (int i = threadIdx.x; i < geo.rows * max(0, tail.end - tail.begin); i += kScoreThreads)
      score_at(i % geo.rows, geo.n_max + tail.begin + i / geo.rows) = -INFINITY;
  }
}

} // namespace m3sa::cuda
