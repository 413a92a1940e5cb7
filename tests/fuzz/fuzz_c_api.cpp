// The C API (m3sa/c_api.h) with raw C values: plan requests and plans whose every field comes from
// the input (enum-typed ints far outside their lists, reduce_heads other than 0 / 1, edited plan
// bytes), and calls of each op whose views carry the input's dtype, rank, device, shape and
// strides over no memory (data NULL: the C layer's job is converting values, the memory paths are
// the op harnesses'). Oracles:
//   - no crash, no sanitizer report; every call returns a code in 0..4, with a message exactly
//     when it failed;
//   - where every enum-typed field is in its list, the C call's code and message equal those of
//     the C++ call on the same values (converted here, field by field, independently);
//   - otherwise the call is an invalid_argument whose message names a field
//     ("m3sa::<op>: <field>: expected one of 0..n, got v").
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "m3sa/c_api.h"

using namespace m3sa;
using namespace m3sa::fuzz;

namespace {

constexpr size_t kMaxWorkspace = size_t{16} << 20;

int32_t draw_enum(Input& in, int count) {
  return in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : in.pick(count);
}

bool in_list(int32_t value, int count) { return value >= 0 && value < count; }

m3sa_tensor_view draw_view(Input& in) {
  m3sa_tensor_view v = {};
  if (in.pick(4) == 0) return v; // absent
  v.dtype = draw_enum(in, 5);
  v.rank = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : in.pick(5);
  for (int d = 0; d < M3SA_MAX_RANK; ++d) {
    v.shape[d] = in.one_in(8) ? in.raw64() : in.pick(300);
    v.strides[d] = in.one_in(8) ? in.raw64() : in.pick(300);
  }
  v.device_kind = draw_enum(in, 2);
  v.device_ordinal = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : 0;
  return v; // data NULL
}

m3sa_batch draw_batch(Input& in) {
  m3sa_batch b;
  b.cu_q_lens = draw_view(in);
  b.seq_lens = draw_view(in);
  b.block_table = draw_view(in);
  b.num_requests = static_cast<int32_t>(in.hostile_int());
  b.num_decode_requests = static_cast<int32_t>(in.hostile_int());
  b.decode_q_len = in.one_in(4) ? static_cast<int32_t>(in.hostile_int()) : 1;
  b.num_tokens = static_cast<int32_t>(in.hostile_int());
  return b;
}

// C -> C++ for the mirror, false where a value has no C++ equivalent.
bool mirror(const m3sa_tensor_view& v, TensorView* out) {
  if (!in_list(v.dtype, 5) || v.rank < 0 || v.rank > M3SA_MAX_RANK || !in_list(v.device_kind, 2))
    return false;
  out->data = v.data;
  out->dtype = static_cast<DType>(v.dtype);
  out->rank = v.rank;
  std::memcpy(out->shape, v.shape, sizeof out->shape);
  std::memcpy(out->strides, v.strides, sizeof out->strides);
  out->device = {static_cast<DeviceKind>(v.device_kind), v.device_ordinal};
  return true;
}

bool mirror(const m3sa_batch& b, BatchMetadata* out) {
  out->num_requests = b.num_requests;
  out->num_decode_requests = b.num_decode_requests;
  out->decode_q_len = b.decode_q_len;
  out->num_tokens = b.num_tokens;
  return mirror(b.cu_q_lens, &out->cu_q_lens) && mirror(b.seq_lens, &out->seq_lens) &&
         mirror(b.block_table, &out->block_table);
}

bool mirror(const m3sa_plan_request& r, PlanRequest* out) {
  if (!in_list(r.op, 6) || !in_list(r.backend, 3) || !in_list(r.cache_dtype, 5) ||
      (r.config.reduce_heads != 0 && r.config.reduce_heads != 1))
    return false;
  out->op = static_cast<OpKind>(r.op);
  out->backend = static_cast<Backend>(r.backend);
  out->cache_dtype = static_cast<DType>(r.cache_dtype);
  MsaConfig& c = out->config;
  c.top_k = r.config.top_k;
  c.local_blocks = r.config.local_blocks;
  c.init_blocks = r.config.init_blocks;
  c.num_index_heads = r.config.num_index_heads;
  c.score_scale = r.config.score_scale;
  c.reduce_heads = r.config.reduce_heads == 1;
  c.rms_norm_eps = r.config.rms_norm_eps;
  c.norm_weight_offset = r.config.norm_weight_offset;
  c.rope_theta = r.config.rope_theta;
  out->capacities = {r.capacities.max_requests, r.capacities.max_tokens,
                     r.capacities.max_blocks_per_request};
  out->num_threads = r.num_threads;
  out->device_ordinal = r.device_ordinal;
  out->implementation = r.implementation;
  return true;
}

bool mirror(const m3sa_plan& p, OpPlan* out) {
  if (!mirror(p.request, &out->request)) return false;
  out->implementation = p.implementation;
  out->num_threads = p.num_threads;
  out->workspace_bytes = static_cast<size_t>(p.workspace_bytes);
  out->plan_info_version = p.plan_info_version;
  std::memcpy(out->plan_info, p.plan_info, sizeof out->plan_info);
  return true;
}

// The code is one of the five, the message present exactly on failure.
void check_outcome(m3sa_status status) {
  M3SA_FUZZ_CHECK(status >= M3SA_OK && status <= M3SA_INTERNAL, std::to_string(status));
  const std::string message = m3sa_last_error_message();
  M3SA_FUZZ_CHECK(status == M3SA_OK ? message.empty() : !message.empty(), message);
  M3SA_FUZZ_CHECK(status != M3SA_INTERNAL, "no internal error: " + message);
}

void check_same(m3sa_status status, const Status& want) {
  const std::string message = m3sa_last_error_message();
  M3SA_FUZZ_CHECK(status == static_cast<m3sa_status>(want.code()),
                  "C " + std::string(m3sa_status_name(status)) + " (" + message + "), C++ " +
                      want.to_string());
  M3SA_FUZZ_CHECK(status == M3SA_OK || message == want.to_string(),
                  "C: " + message + "\nC++: " + want.to_string());
}

// A value with no C++ equivalent: rejected, naming a field after the op's prefix.
void check_field_named(m3sa_status status, const char* op) {
  const std::string message = m3sa_last_error_message();
  M3SA_FUZZ_CHECK(status == M3SA_INVALID_ARGUMENT, message);
  const std::string prefix = std::string("invalid_argument: m3sa::") + op + ": ";
  M3SA_FUZZ_CHECK(message.rfind(prefix, 0) == 0, message);
  M3SA_FUZZ_CHECK(message.find(": expected ", prefix.size()) != std::string::npos, message);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  m3sa_plan_request r;
  m3sa_plan_request_init(&r);
  r.op = draw_enum(in, 6);
  r.backend = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : 1 - in.pick(2); // cpu first
  r.cache_dtype = draw_enum(in, 2);
  r.config.top_k = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : 1 + in.pick(32);
  r.config.num_index_heads = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : 1 + in.pick(4);
  r.config.reduce_heads = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : in.pick(2);
  if (in.one_in(8)) r.config.score_scale = in.raw_float();
  r.capacities = {in.pick(9), 1 + in.pick(300), 1 + in.pick(40)};
  if (in.one_in(8)) r.capacities.max_tokens = in.raw64();
  r.num_threads = in.one_in(8) ? static_cast<int32_t>(in.hostile_int()) : in.pick(3);
  std::string name;
  if (in.one_in(4)) {
    m3sa_implementation_info info;
    const int32_t index = in.pick(m3sa_implementation_count() + 1) - 1; // -1: an unknown name
    name = m3sa_implementation_info_at(index, &info) == M3SA_OK ? info.name : "cpu.unknown";
    r.implementation = name.c_str();
  }

  // make_plan: the C++ result on mirrored values, else a named field.
  m3sa_plan plan;
  const m3sa_status planned = m3sa_make_plan(&r, &plan);
  check_outcome(planned);
  PlanRequest cpp_request;
  if (mirror(r, &cpp_request)) {
    OpPlan cpp_plan;
    check_same(planned, make_plan(cpp_request, &cpp_plan));
    // The same plan, every field: the seal in plan_info hashes the whole request.
    M3SA_FUZZ_CHECK(planned != M3SA_OK || (plan.implementation == cpp_plan.implementation &&
                                           plan.num_threads == cpp_plan.num_threads &&
                                           plan.workspace_bytes == cpp_plan.workspace_bytes &&
                                           plan.plan_info_version == cpp_plan.plan_info_version &&
                                           std::memcmp(plan.plan_info, cpp_plan.plan_info,
                                                       sizeof plan.plan_info) == 0),
                    "the C plan is the C++ plan");
  } else {
    check_field_named(planned, in_list(r.op, 6) ? m3sa_op_name(r.op) : "unknown-op");
  }
  if (planned != M3SA_OK) return 0;

  // The plan, maybe with a few bytes overwritten.
  if (in.one_in(4)) {
    uint8_t* bytes = reinterpret_cast<uint8_t*>(&plan);
    for (int edits = 1 + in.pick(4); edits > 0; --edits)
      bytes[in.pick(static_cast<int>(sizeof plan))] = static_cast<uint8_t>(in.pick(256));
  }
  OpPlan cpp_plan;
  const bool plan_mirrors = mirror(plan, &cpp_plan);
  const size_t workspace_bytes =
      plan.workspace_bytes <= kMaxWorkspace ? static_cast<size_t>(plan.workspace_bytes) : 0;
  std::vector<uint8_t> storage(workspace_bytes + 64);
  uint8_t* aligned = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  const m3sa_workspace workspace = {workspace_bytes > 0 ? aligned : nullptr, workspace_bytes};
  const Workspace cpp_workspace{workspace.data, workspace_bytes};
  const m3sa_exec_context ctx = {in.one_in(8) ? -1 : in.pick(3), nullptr};
  const ExecContext cpp_ctx{ctx.num_threads, nullptr};

  const m3sa_status prepared = m3sa_prepare_workspace(&plan, workspace, &ctx);
  check_outcome(prepared);
  if (plan_mirrors)
    check_same(prepared, prepare_workspace(cpp_plan, cpp_workspace, cpp_ctx));
  else
    check_field_named(prepared,
                      in_list(plan.request.op, 6) ? m3sa_op_name(plan.request.op) : "unknown-op");

  // One op call with the input's views; its C++ mirror where the values have one.
  const int op = in.pick(6);
  m3sa_status status = M3SA_OK;
  Status want;
  bool mirrored = plan_mirrors;
  const bool null_plan = in.one_in(16), null_args = in.one_in(16); // no C++ mirror either
  const m3sa_plan* plan_arg = null_plan ? nullptr : &plan;
  switch (op) {
  case M3SA_OP_INSERT_INDEX_K: {
    const m3sa_insert_index_k_args a = {draw_view(in), draw_view(in), draw_view(in)};
    status = m3sa_insert_index_k(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
    InsertIndexKArgs c;
    mirrored = mirrored && mirror(a.index_k, &c.index_k) &&
               mirror(a.slot_mapping, &c.slot_mapping) && mirror(a.index_k_cache, &c.index_k_cache);
    if (mirrored) want = insert_index_k(cpp_plan, c, cpp_workspace, cpp_ctx);
    break;
  }
  case M3SA_OP_SCORE_BLOCKS:
  case M3SA_OP_INDEX_TOPK: {
    const m3sa_tensor_view q = draw_view(in), cache = draw_view(in);
    const m3sa_batch batch = draw_batch(in);
    const m3sa_tensor_view out = draw_view(in);
    BatchMetadata cpp_batch;
    TensorView cpp_q, cpp_cache, cpp_out;
    mirrored = mirrored && mirror(q, &cpp_q) && mirror(cache, &cpp_cache) &&
               mirror(batch, &cpp_batch) && mirror(out, &cpp_out);
    if (op == M3SA_OP_SCORE_BLOCKS) {
      const m3sa_score_blocks_args a = {q, cache, batch, out};
      status = m3sa_score_blocks(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
      if (mirrored)
        want =
            score_blocks(cpp_plan, {cpp_q, cpp_cache, cpp_batch, cpp_out}, cpp_workspace, cpp_ctx);
    } else {
      const m3sa_index_topk_args a = {q, cache, batch, out};
      status = m3sa_index_topk(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
      if (mirrored)
        want = index_topk(cpp_plan, {cpp_q, cpp_cache, cpp_batch, cpp_out}, cpp_workspace, cpp_ctx);
    }
    break;
  }
  case M3SA_OP_SELECT_TOPK_BLOCKS: {
    const m3sa_select_topk_blocks_args a = {draw_view(in), draw_batch(in), draw_view(in)};
    status = m3sa_select_topk_blocks(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
    SelectTopkBlocksArgs c;
    mirrored = mirrored && mirror(a.scores, &c.scores) && mirror(a.batch, &c.batch) &&
               mirror(a.topk, &c.topk);
    if (mirrored) want = select_topk_blocks(cpp_plan, c, cpp_workspace, cpp_ctx);
    break;
  }
  case M3SA_OP_SPARSE_ATTENTION: {
    m3sa_sparse_attention_args a;
    a.q = draw_view(in);
    a.k_cache = draw_view(in);
    a.v_cache = draw_view(in);
    a.k_scale = in.one_in(8) ? in.raw_float() : 1.f;
    a.v_scale = in.one_in(8) ? in.raw_float() : 1.f;
    a.topk = draw_view(in);
    a.batch = draw_batch(in);
    a.kv_block_table = draw_view(in);
    a.out = draw_view(in);
    a.lse = draw_view(in);
    status = m3sa_sparse_attention(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
    SparseAttentionArgs c;
    c.k_scale = a.k_scale;
    c.v_scale = a.v_scale;
    mirrored = mirrored && mirror(a.q, &c.q) && mirror(a.k_cache, &c.k_cache) &&
               mirror(a.v_cache, &c.v_cache) && mirror(a.topk, &c.topk) &&
               mirror(a.batch, &c.batch) && mirror(a.kv_block_table, &c.kv_block_table) &&
               mirror(a.out, &c.out) && mirror(a.lse, &c.lse);
    if (mirrored) want = sparse_attention(cpp_plan, c, cpp_workspace, cpp_ctx);
    break;
  }
  default: {
    m3sa_norm_rope_insert_args a;
    m3sa_tensor_view* views[] = {&a.q,
                                 &a.k,
                                 &a.v,
                                 &a.index_q,
                                 &a.index_k,
                                 &a.positions,
                                 &a.q_norm_weight,
                                 &a.k_norm_weight,
                                 &a.index_q_norm_weight,
                                 &a.index_k_norm_weight,
                                 &a.cos_sin_cache,
                                 &a.slot_mapping,
                                 &a.index_slot_mapping,
                                 &a.q_out,
                                 &a.k_cache,
                                 &a.v_cache,
                                 &a.index_q_out,
                                 &a.index_k_cache};
    for (m3sa_tensor_view* v : views) *v = draw_view(in);
    a.k_scale = 1.f;
    a.v_scale = 1.f;
    status = m3sa_norm_rope_insert(plan_arg, null_args ? nullptr : &a, workspace, &ctx);
    NormRopeInsertArgs c;
    TensorView* cpp_views[] = {&c.q,
                               &c.k,
                               &c.v,
                               &c.index_q,
                               &c.index_k,
                               &c.positions,
                               &c.q_norm_weight,
                               &c.k_norm_weight,
                               &c.index_q_norm_weight,
                               &c.index_k_norm_weight,
                               &c.cos_sin_cache,
                               &c.slot_mapping,
                               &c.index_slot_mapping,
                               &c.q_out,
                               &c.k_cache,
                               &c.v_cache,
                               &c.index_q_out,
                               &c.index_k_cache};
    for (int i = 0; i < 18 && mirrored; ++i) mirrored = mirror(*views[i], cpp_views[i]);
    if (mirrored) want = norm_rope_insert(cpp_plan, c, cpp_workspace, cpp_ctx);
    break;
  }
  }
  check_outcome(status);
  if (null_plan || null_args || !mirrored)
    check_field_named(status, m3sa_op_name(op)); // a value the C++ API has no form for
  else
    check_same(status, want);
  return 0;
}
