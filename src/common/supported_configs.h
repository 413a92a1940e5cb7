#pragma once
// The one table of what each backend runs. supports(), make_plan() and the tests' backend
// enumeration all read it, so they cannot drift apart.
#include <cstdint>

#include "m3sa/ops.h"
#include "m3sa/types.h"

namespace m3sa::detail {

constexpr uint32_t op_bit(OpKind op) { return 1u << static_cast<uint32_t>(op); }
inline constexpr uint32_t kAllOps = op_bit(OpKind::insert_index_k) | op_bit(OpKind::score_blocks) |
                                    op_bit(OpKind::select_topk_blocks) |
                                    op_bit(OpKind::index_topk) | op_bit(OpKind::sparse_attention) |
                                    op_bit(OpKind::norm_rope_insert);

struct BackendCapability {
  Backend backend;
  bool built;             // compiled into this library
  bool needs_cuda_device; // runs only where a CUDA device is visible
  uint32_t ops;           // op_bit() mask
  int min_top_k, max_top_k;
  int max_index_heads;
  bool fp8_cache; // fp8_e4m3 index-K / KV caches
  bool reduce_heads;
  const char* missing_ops_reason; // why an op outside `ops` is absent
};

#ifdef M3SA_HAVE_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif

inline constexpr BackendCapability kSupportedConfigs[] = {
    {Backend::reference, true, false, kAllOps, 1, 32, 16, true, true, ""},
    {Backend::cpu, true, false, kAllOps, 1, 32, 16, true, true, ""},
    {Backend::cuda, kCudaBuilt, true, kAllOps, 1, 32, 16, true, false, ""},
};

inline const BackendCapability& capability(Backend backend) {
  for (const auto& row : kSupportedConfigs)
    if (row.backend == backend) return row;
  return kSupportedConfigs[0]; // unreachable for valid enum values
}

} // namespace m3sa::detail
