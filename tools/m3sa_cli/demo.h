#pragma once
// `m3sa demo`: one MiniMax-M3 sparse layer end to end (norm_rope_insert -> index_topk ->
// sparse_attention) on a synthetic mixed batch, checked against the reference on sampled rows.
#include <cstdint>
#include <string>

namespace m3sa::cli {

struct DemoOptions {
  std::string backend = "auto"; // auto | cuda | cpu | reference
  std::string index_dtype = "bf16";
  std::string kv_dtype = "bf16";
  int decode_requests = 4;
  int decode_context = 32768;
  int mtp = 1; // decode query tokens per request
  int prefill_chunk = 2048;
  int prefill_prefix = 30720;
  int index_heads = 4;
  int q_heads = 64;
  int kv_heads = 4;
  int top_k = 16;
  int threads = 0;
  int sample_rows = 64; // prefill tokens checked against the reference (all decode tokens are)
  bool reference_full = false; // also time the reference on the whole batch
  uint64_t seed = 2026;
};

// 0: every check passed; 1: a check failed; 2: the options cannot run (message on stderr).
int run_demo(const DemoOptions& options);

} // namespace m3sa::cli
