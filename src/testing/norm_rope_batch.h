#pragma once
// Inputs and outputs of norm_rope_insert on the host, filled deterministically, plus the
// comparisons its tests and the demo make (ulp distance per output, e4m3 near-ties).
#include <cstdint>
#include <string>
#include <vector>

#include "testing/host_tensor.h"

namespace m3sa::testing {

struct NormRopeSpec {
  int tokens = 64;
  int q_heads = 8, kv_heads = 2, index_heads = 2;
  DType kv_dtype = DType::bf16, index_dtype = DType::bf16;
  int kv_pages = 4, index_pages = 4;
  int64_t max_position = 1 << 20; // positions drawn in [0, max_position), both ends included
  int table_rows = 0;             // > 0: a cos/sin table of this many rows (positions below it)
  DType table_dtype = DType::bf16;
  DType weight_dtype = DType::bf16;
  int padding_every = 5;     // every n-th token has slot -1 (0: none)
  bool shared_slots = false; // index slots == KV slots (one tensor for both)
  float k_scale = 1.f, v_scale = 1.f;
  uint64_t seed = 1;
};

class NormRopeBatch {
public:
  explicit NormRopeBatch(const NormRopeSpec& spec);
  const NormRopeSpec& spec() const { return spec_; }
  // Not OK when a tensor could not be allocated: nothing is filled then, and nothing else of the
  // batch may be used.
  Status status() const { return status_; }

  // Views over this batch; `in_place` writes q_out over q and index_q_out over index_q (bf16
  // index only).
  NormRopeInsertArgs args(bool in_place = false) const;
  // Outputs and caches set to the sentinel byte 0x5a (caches: every slot, written or not).
  void poison_outputs() const;

  HostTensor q, k, v, index_q, index_k, positions, weights[4], cos_sin_cache, slot_mapping,
      index_slot_mapping;
  HostTensor q_out, k_cache, v_cache, index_q_out, index_k_cache;

private:
  Status status_;
  NormRopeSpec spec_;
};

Status run_norm_rope_insert(const MsaConfig& config, const NormRopeBatch& batch, Backend backend,
                            int num_threads = 0, bool in_place = false);
// The same with the caller's arguments over the batch (outputs laid elsewhere, e.g. in a guarded
// buffer); the plan is sized by the batch.
Status run_norm_rope_insert(const MsaConfig& config, const NormRopeBatch& batch,
                            const NormRopeInsertArgs& args, Backend backend, int num_threads = 0);

// Element-wise comparison of two bf16 / e4m3 tensors of the same shape: how many elements
// differ, the largest distance in units in the last place of the stored format, and how many are
// more than one ulp apart: `absorbed` where the values are within `abs_tolerance` of each other
// (a rotation x1 cos - x2 sin that cancels to a small value keeps the fp32 pipeline's absolute
// error, not its relative one), `outside` otherwise.
struct UlpComparison {
  int64_t elements = 0, differing = 0, max_ulps = 0, absorbed = 0, outside = 0;
  std::string to_string() const;
};
UlpComparison compare_ulps(const TensorView& want, const TensorView& got, double abs_tolerance = 0);

// A pipeline's norm_rope_insert results for the sampled tokens of `step` (rows of q_out and
// index_q_out by token, cache rows at the step's slots) against the reference run on just those
// tokens: every output within one ulp, or 2^-12 where a rotation cancels.
struct NormRopeCheck {
  UlpComparison outputs[5]; // q_out, index_q_out, k_cache, v_cache, index_k_cache rows
  Status status;
  bool ok() const;
  std::string to_string() const;
};
NormRopeCheck check_norm_rope_sample(const MsaConfig& config, const NormRopeBatch& step,
                                     const std::vector<int64_t>& sample, const HostTensor& q_out,
                                     const HostTensor& index_q_out, const HostTensor& k_cache,
                                     const HostTensor& v_cache, const HostTensor& index_k_cache);

} // namespace m3sa::testing
