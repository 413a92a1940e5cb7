#pragma once
// The C API's structs (m3sa/c_api.h) from the C++ API's values, for the tests that compare the
// two APIs. Written out here rather than taken from the library, so that a field the library's
// conversion drops or swaps shows as a difference.
#include <cstring>

#include "m3sa/c_api.h"
#include "m3sa/m3sa.h"

namespace m3sa::testing {

inline m3sa_tensor_view c_view(const TensorView& v) {
  m3sa_tensor_view out = {};
  out.data = v.data;
  out.dtype = static_cast<int32_t>(v.dtype);
  out.rank = v.rank;
  for (int d = 0; d < TensorView::kMaxRank; ++d) {
    out.shape[d] = v.shape[d];
    out.strides[d] = v.strides[d];
  }
  out.device_kind = static_cast<int32_t>(v.device.kind);
  out.device_ordinal = v.device.ordinal;
  return out;
}

inline m3sa_batch c_batch(const BatchMetadata& b) {
  return {c_view(b.cu_q_lens),   c_view(b.seq_lens), c_view(b.block_table), b.num_requests,
          b.num_decode_requests, b.decode_q_len,     b.num_tokens};
}

inline m3sa_config c_config(const MsaConfig& c) {
  m3sa_config out;
  m3sa_config_init(&out);
  out.top_k = c.top_k;
  out.local_blocks = c.local_blocks;
  out.init_blocks = c.init_blocks;
  out.num_index_heads = c.num_index_heads;
  out.score_scale = c.score_scale;
  out.reduce_heads = c.reduce_heads ? 1 : 0;
  out.rms_norm_eps = c.rms_norm_eps;
  out.norm_weight_offset = c.norm_weight_offset;
  out.rope_theta = c.rope_theta;
  return out;
}

inline m3sa_plan_request c_request(const PlanRequest& r) {
  m3sa_plan_request out;
  m3sa_plan_request_init(&out);
  out.op = static_cast<int32_t>(r.op);
  out.backend = static_cast<int32_t>(r.backend);
  out.config = c_config(r.config);
  out.capacities = {r.capacities.max_requests, r.capacities.max_tokens,
                    r.capacities.max_blocks_per_request};
  out.cache_dtype = static_cast<int32_t>(r.cache_dtype);
  out.num_threads = r.num_threads;
  out.device_ordinal = r.device_ordinal;
  out.implementation = r.implementation;
  return out;
}

inline m3sa_index_topk_args c_args(const IndexTopkArgs& a) {
  return {c_view(a.index_q), c_view(a.index_k_cache), c_batch(a.batch), c_view(a.topk)};
}

inline m3sa_sparse_attention_args c_args(const SparseAttentionArgs& a) {
  return {c_view(a.q),   c_view(a.k_cache), c_view(a.v_cache), a.k_scale,
          a.v_scale,     c_view(a.topk),    c_batch(a.batch),  c_view(a.kv_block_table),
          c_view(a.out), c_view(a.lse)};
}

} // namespace m3sa::testing
