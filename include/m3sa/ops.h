#pragma once
// The five MSA ops. Each runs in two steps:
//   make_plan()  on the host, from capacities: sizes the caller-owned workspace, never touches
//   data; <op>(plan, args, workspace, ctx)  validates, then runs without allocating or
//   synchronising.
// The top-k buffer written by index_topk is the one sparse_attention reads (docs/contract.md §5).
#include <cstddef>
#include <cstdint>

#include "m3sa/batch.h"
#include "m3sa/config.h"
#include "m3sa/status.h"
#include "m3sa/tensor_view.h"
#include "m3sa/types.h"

namespace m3sa {

enum class OpKind : uint8_t {
  insert_index_k,
  score_blocks,
  select_topk_blocks,
  index_topk,
  sparse_attention,
  norm_rope_insert
};
const char* to_string(OpKind op);

struct PlanRequest {
  OpKind op = OpKind::index_topk;
  Backend backend = Backend::cpu;
  MsaConfig config = {};
  Capacities capacities = {};
  DType cache_dtype = DType::bf16; // index-K cache (indexer ops) or KV cache (attention)
  int num_threads = 0;             // CPU backend: 0 = OpenMP's default
  int device_ordinal = 0;          // CUDA backend
  // null or "": the best implementation of (backend, op) that can run here; else the one with
  // this exact name, whose backend the plan then uses (m3sa/registry.h lists them).
  const char* implementation = nullptr;
};

struct OpPlan {
  PlanRequest request = {};    // request.implementation: the chosen implementation's name
  int32_t implementation = -1; // index in the registry (implementation_info); -1: not planned
  int num_threads = 1;         // resolved thread count the workspace is sized for
  size_t workspace_bytes = 0;  // caller allocates at least this much on the backend's device
  // The implementation's plan-time choices (launch splits, SM count, ...): opaque and versioned,
  // a flat array so that a plan crosses into other languages as a list of integers.
  uint32_t plan_info_version = 0;
  int64_t plan_info[16] = {};
};

Status make_plan(const PlanRequest& request, OpPlan* plan);
// The name of the implementation a plan runs ("cpu.index_topk", ...), "" for an unplanned one.
const char* implementation_name(const OpPlan& plan);

struct Workspace {
  void* data = nullptr; // 64-byte aligned memory of at least plan.workspace_bytes
  size_t bytes = 0;
};

struct ExecContext {
  int num_threads = 0;    // CPU backend: 0 = the plan's; never more than the plan's
  void* stream = nullptr; // CUDA backend: a cudaStream_t (must not be the legacy default stream)
};
// Stream order holds for every CUDA op. On compute capability 9.0 the sm90 implementations launch
// their decode kernels with programmatic dependent launch: such a kernel may be scheduled while
// the stream's previous kernel is still running, but it waits for that kernel to complete (and
// its writes to be visible) before it reads or writes any global memory.

// Call once after allocating a workspace for a plan, before its first run (and again after a
// run that failed part-way). The CUDA backend keeps its device error flag and the arrival
// counters of split reductions in the workspace and does not reset them per run: a reset is one
// more graph node, which at batch 1 costs as much as the scoring itself. Enqueued on ctx.stream
// (two memsets; capturable). Host backends need no preparation: it only checks the workspace.
Status prepare_workspace(const OpPlan& plan, Workspace workspace, const ExecContext& ctx = {});

// The fused per-token step before attention (docs/contract.md §7):
// RMSNorm + partial RoPE on the main q / k and on index q / k, then q out, k / v into the paged KV
// cache and index-K into the index cache. fp32 from the bf16 load to one final rounding per output.
struct NormRopeInsertArgs {
  TensorView q;         // [T, Hq, 128] bf16, raw projection output
  TensorView k;         // [T, Hkv, 128] bf16
  TensorView v;         // [T, Hkv, 128] bf16 (stored as is: no norm, no RoPE)
  TensorView index_q;   // [T, H, 128] bf16, H = config.num_index_heads
  TensorView index_k;   // [T, 128] bf16
  TensorView positions; // [T] i64 absolute positions, in [0, 2^24) (and < cos_sin_cache rows)
  TensorView q_norm_weight, k_norm_weight;             // [128] bf16 or f32 gains
  TensorView index_q_norm_weight, index_k_norm_weight; // [128] bf16 or f32 gains
  TensorView cos_sin_cache; // optional [max_pos, 64] bf16 or f32: cos of pairs 0..31, then sin;
                            // absent: computed from positions and config.rope_theta
  TensorView slot_mapping;  // [T] i64 KV-cache slot (page * 128 + offset); < 0 skips
  TensorView index_slot_mapping; // [T] i64 index-cache slot; < 0 skips (may alias slot_mapping)
  TensorView q_out;              // [T, Hq, 128] bf16
  TensorView k_cache;            // [num_pages, 128, Hkv, 128] bf16 or fp8_e4m3, written in place
  TensorView v_cache;            // [num_pages, 128, Hkv, 128], same dtype as k_cache
  float k_scale = 1.f;           // fp8 KV cache: stored = e4m3(x / scale)
  float v_scale = 1.f;
  TensorView index_q_out;   // [T, H, 128] in the index cache dtype (the plan's cache_dtype)
  TensorView index_k_cache; // [num_index_pages, 128, 128], written in place
};

struct InsertIndexKArgs {
  TensorView index_k;       // [T, 128] bf16 or f32, rows of this step's tokens
  TensorView slot_mapping;  // [T] i64, page * 128 + offset; < 0 skips the row (padding)
  TensorView index_k_cache; // [num_pages, 128, 128] bf16 or fp8_e4m3, written in place
};

struct ScoreBlocksArgs {
  TensorView index_q;       // [T, H, 128], dtype == cache dtype (bf16 or fp8_e4m3)
  TensorView index_k_cache; // [num_pages, 128, 128]
  BatchMetadata batch;
  TensorView scores; // [H, T, N] f32, N >= block-table width; -inf past the causal blocks
};

struct SelectTopkBlocksArgs {
  TensorView scores; // [H, T, N] f32
  BatchMetadata batch;
  TensorView topk; // [H, T, K] i32: ascending logical block ids, -1 padded
};

struct IndexTopkArgs {
  TensorView index_q;       // [T, H, 128], dtype == cache dtype
  TensorView index_k_cache; // [num_pages, 128, 128] bf16 or fp8_e4m3
  BatchMetadata batch;
  TensorView topk; // [H, T, K] i32 (strides free: [T, H, K] works too)
};

struct SparseAttentionArgs {
  TensorView q;        // [T, Hq, 128] bf16
  TensorView k_cache;  // [num_pages, 128, Hkv, 128] bf16 or fp8_e4m3
  TensorView v_cache;  // [num_pages, 128, Hkv, 128], same dtype as k_cache
  float k_scale = 1.f; // per-tensor dequantisation scales
  float v_scale = 1.f;
  TensorView topk;     // [Hkv, T, K] i32, as written by index_topk
  BatchMetadata batch; // batch.block_table maps the index cache's blocks
  TensorView
      kv_block_table; // optional [R, max_blocks] i32 for the KV cache; absent = batch.block_table
  TensorView out;     // [T, Hq, 128] bf16
  TensorView lse;     // optional [T, Hq] f32, natural log; -inf for rows with no keys
};

Status insert_index_k(const OpPlan& plan, const InsertIndexKArgs& args, Workspace workspace,
                      const ExecContext& ctx = {});
Status score_blocks(const OpPlan& plan, const ScoreBlocksArgs& args, Workspace workspace,
                    const ExecContext& ctx = {});
Status select_topk_blocks(const OpPlan& plan, const SelectTopkBlocksArgs& args, Workspace workspace,
                          const ExecContext& ctx = {});
Status index_topk(const OpPlan& plan, const IndexTopkArgs& args, Workspace workspace,
                  const ExecContext& ctx = {});
Status sparse_attention(const OpPlan& plan, const SparseAttentionArgs& args, Workspace workspace,
                        const ExecContext& ctx = {});
Status norm_rope_insert(const OpPlan& plan, const NormRopeInsertArgs& args, Workspace workspace,
                        const ExecContext& ctx = {});

// Device-side validation (contract §9): CUDA kernels never read out of bounds; on bad metadata
// (page id out of range, seq_len beyond the block table, slot beyond the cache) they skip the read
// and set bits in a flag kept in the workspace. The bits accumulate over runs; this returns them
// and clears the flag (it synchronises `ctx.stream`: not for use inside capture). A workspace
// never prepared by prepare_workspace is reported as an invalid_argument.
// Bits: 1 page id out of range, 2 seq_len beyond the block table or q_len > seq_len, 4 bad slot,
// 8 a decode request whose q_len is not batch.decode_q_len, 16 a position out of range.
// Host backends validate their data up front, so their flag is always 0.
Status read_device_errors(const OpPlan& plan, Workspace workspace, const ExecContext& ctx,
                          int32_t* flags);

} // namespace m3sa
