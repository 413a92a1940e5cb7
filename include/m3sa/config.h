#pragma once
// Model constants of MiniMax-M3 sparse attention and the knobs the library keeps configurable
// (docs/contract.md §1).
#include <cstdint>

namespace m3sa {

inline constexpr int kBlockTokens = 128; // sparse block == KV page, fixed by the model
inline constexpr int kHeadDim = 128;     // index and main head dim, fixed by the model
inline constexpr int kMaxTopK = 32;
inline constexpr int kMaxIndexHeads = 16;
inline constexpr int kMaxDecodeQLen = 16; // MTP draft tokens per decode request
inline constexpr int kMaxGqaGroup = 16;   // query heads per KV head

struct MsaConfig {
  int top_k = 16;            // blocks selected per (index head, token), 1..32
  int local_blocks = 1;      // most recent blocks always selected (the query's own block first)
  int init_blocks = 0;       // first blocks always selected
  int num_index_heads = 4;   // index-Q heads in this call (4 / TP, at least 1), 1..16
  float score_scale = 1.f;   // positive; selection does not depend on it, exported scores do
  bool reduce_heads = false; // HuggingFace parity: one selection from the max over heads

  // norm_rope_insert: Gemma RMSNorm x * rsqrt(mean(x^2) + eps) * (offset + w), then NeoX RoPE on
  // dims [0, 64) with pairs (i, i + 32).
  float rms_norm_eps = 1e-6f;
  float norm_weight_offset = 1.f; // 1: checkpoint gains (Gemma "+1"); 0: gains with +1 baked in
  double rope_theta = 5e6;        // cos/sin computed from positions (no caller table)
};

inline constexpr int kRotaryDim = 64;                // partial RoPE: the first half of 128
inline constexpr int64_t kMaxRopePosition = 1 << 24; // positions in [0, 2^24) (16M tokens)

} // namespace m3sa
