#pragma once
// Host-side validation shared by every op: shapes, dtypes, strides, devices, capacities and, where
// the data is host-readable, the batch metadata itself (contract §9).
#include <cstdint>
#include <initializer_list>

#include "m3sa/ops.h"

namespace m3sa::detail {

inline constexpr int64_t kAnyExtent = -1;
inline constexpr int64_t kAtLeastOne = -2;
// No view may span more than 2^48 bytes (256 TiB, beyond any device's memory): a view that claims
// more (a cache of 2^52 pages) is rejected before any size is computed from it.
inline constexpr int kMaxTensorBytesLog2 = 48;
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << kMaxTensorBytesLog2;

struct TensorRule {
  const char* name;
  std::initializer_list<DType> dtypes;
  std::initializer_list<int64_t> shape; // extents, kAnyExtent or kAtLeastOne
  const char* shape_text;               // "[T, H, 128]"
  bool rows_contiguous = true;          // last dim has stride 1
  bool is_output = false;               // must not overlap itself
};

Status check_tensor(const TensorView& t, const TensorRule& rule, DeviceKind device);
Status check_optional_tensor(const TensorView& t, const TensorRule& rule, DeviceKind device);
Status check_disjoint(const TensorView& a, const char* a_name, const TensorView& b,
                      const char* b_name);

// One tensor argument of an op, for the aliasing rules. An output may name the input it may
// overwrite in place (exactly: same pointer, dtype, shape and strides).
struct Operand {
  const TensorView& view;
  const char* name;
  const TensorView* in_place_of = nullptr;
};
using Operands = std::initializer_list<Operand>;
// The aliasing rules of every op, checked after its shapes: outputs pairwise disjoint; each output
// disjoint from every input (but its in-place one) and from the batch metadata (`batch` may be
// null); the bytes of `workspace` the plan uses disjoint from every tensor and the metadata. A
// run that overwrote its own inputs, metadata or scratch mid-flight would read garbage.
Status check_aliasing(Operands outputs, Operands inputs, const BatchMetadata* batch,
                      const Workspace& workspace);

Status check_config(const MsaConfig& config);
// The index / KV cache dtypes the contract defines: bf16 or fp8_e4m3 (make_plan and supports).
Status check_cache_dtype(DType cache_dtype);
Status check_plan_request(const PlanRequest& request);
// A plan's thread count is capped: its workspace grows with it (OpenMP defaults stay far below).
inline constexpr int kMaxPlanThreads = 1024;
// Plan op, seal (check_plan_sealed), workspace and context of a run.
Status check_run_common(const OpPlan& plan, OpKind op, const Workspace& workspace,
                        const ExecContext& ctx);
// The one workspace check of every entry point: at least `required_bytes`, non-null when any
// are required, 64-byte aligned.
Status check_workspace(const Workspace& workspace, size_t required_bytes);

// Each op's arguments against its plan, one file per op family (validate_<family>.cpp); `workspace`
// for the aliasing rules only (check_run_common has checked its size).
Status validate_args(const OpPlan& plan, const InsertIndexKArgs& args, const Workspace& workspace);
Status validate_args(const OpPlan& plan, const ScoreBlocksArgs& args, const Workspace& workspace);
Status validate_args(const OpPlan& plan, const SelectTopkBlocksArgs& args,
                     const Workspace& workspace);
Status validate_args(const OpPlan& plan, const IndexTopkArgs& args, const Workspace& workspace);
Status validate_args(const OpPlan& plan, const SparseAttentionArgs& args,
                     const Workspace& workspace);
Status validate_args(const OpPlan& plan, const NormRopeInsertArgs& args,
                     const Workspace& workspace);

// Batch metadata against the plan's capacities; when host-readable, its contents too. `num_pages`
// bounds the pages of `block_table` that will be read; -1 skips that check.
Status check_batch(const OpPlan& plan, const BatchMetadata& batch, DeviceKind device,
                   int64_t num_pages);
// Page ids of a (second) block table for the blocks each request's seq_len covers.
Status check_block_table_pages(const BatchMetadata& batch, const TensorView& table,
                               const char* name, int64_t num_pages);

// Slots of a [T] i64 slot mapping: below num_pages x 128, or negative (skipped); no non-negative
// slot twice (contract §3).
Status check_slots(const TensorView& slots, const char* name, int64_t num_pages);

// CUDA kernels move 16-byte vectors: rows must start on 16-byte boundaries.
Status check_vector_rows(const TensorView& t, const char* name, DeviceKind device);

// Indexer tensors: a 128-wide bf16 / e4m3 tensor in the plan's cache dtype (`why` says which
// rule), the index cache, index-Q, both with the batch, and the [H, T, K] top-k output.
Status check_cache_dtype_rows(const OpPlan& plan, const TensorView& t, const TensorRule& rule,
                              const char* why, DeviceKind device);
Status check_index_cache(const OpPlan& plan, const TensorView& cache, DeviceKind device);
Status check_index_q(const OpPlan& plan, const TensorView& q, int64_t tokens, DeviceKind device);
Status check_scoring_inputs(const OpPlan& plan, const TensorView& q, const TensorView& cache,
                            const BatchMetadata& batch, DeviceKind device);
Status check_topk_out(const OpPlan& plan, const TensorView& topk, int64_t tokens,
                      DeviceKind device);

DeviceKind device_of(Backend backend);
bool host_readable(DeviceKind device);

} // namespace m3sa::detail
