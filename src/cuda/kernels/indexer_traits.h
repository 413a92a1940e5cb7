#pragma once
// Constants the indexer kernels (score_blocks.cuh, decode_topk.cuh) and their host launchers
// (cuda/indexer.cu) must agree on. Plain C++: included by .cu and .cpp alike.
#include <algorithm>

namespace m3sa::cuda {

// Query rows (tokens x index heads of one request) one scoring CTA holds: 64 / H tokens a tile.
inline constexpr int kTileRows = 64;
inline constexpr int kScoreThreads = 128;
// Scoring and decode CTAs resident per SM, the basis of the plan's block splits: 3 x SMs /
// max_requests ranges per row tile fill the GPU in one wave. Residency needs <= 168 registers per
// thread (65536 / (3 x 128), today 144..166 on sm_90a) and 3 x kScoreSmemBytes of shared memory
// (static_assert in score_blocks.cuh). Not enforced with __launch_bounds__(kScoreThreads, 3): that
// changes the register allocation of three of the six kernels (fp8 scoring 144 -> 150, decode
// bf16 166 -> 168, decode fp8 k16 160 -> 158, ptxas -v), i.e. codegen; check `-Xptxas -v` after a
// kernel edit instead.
inline constexpr int kScoringCtasPerSm = 3;

inline int tile_tokens(int heads) { return std::max(1, kTileRows / heads); }

// The Hopper decode kernel (decode_topk_sm90.cuh): requests of at most this many rows (q_len x H:
// one n8 MMA tile), one CTA per SM (its ring takes most of the shared memory).
inline constexpr int kDecodeSm90MaxRows = 8;
inline constexpr int kDecodeSm90CtasPerSm = 1;

// The SM90 scorer (score_blocks_sm90.cuh): 256 query rows a tile, 256 / H tokens.
inline constexpr int kSm90TileRows = 256;
inline int sm90_tile_tokens(int heads) { return std::max(1, kSm90TileRows / heads); }

} // namespace m3sa::cuda
