// The C API (m3sa/c_api.h) over the C++ one. Each C struct is converted field by field - every
// enum-typed int checked against its list first, so no value outside an enum is ever cast into
// one - and each call goes to the C++ entry point, whose Status becomes the return code and the
// calling thread's last message. No exception leaves this file: the only ones the C++ layer can
// raise are std::bad_alloc from message strings, reported as M3SA_INTERNAL.
#include "m3sa/c_api.h"

#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "common/check.h"
#include "m3sa/m3sa.h"

namespace m3sa {
namespace {

// The types the C structs mirror must keep the limits the C header states.
static_assert(TensorView::kMaxRank == M3SA_MAX_RANK);
static_assert(sizeof(OpPlan::plan_info) / sizeof(OpPlan::plan_info[0]) == M3SA_PLAN_INFO_SIZE);
static_assert(static_cast<int>(StatusCode::internal) == M3SA_INTERNAL);
static_assert(static_cast<int>(DType::i64) == M3SA_DTYPE_I64);
static_assert(static_cast<int>(Backend::cuda) == M3SA_BACKEND_CUDA);
static_assert(static_cast<int>(OpKind::norm_rope_insert) == M3SA_OP_NORM_ROPE_INSERT);
static_assert(static_cast<int>(DeviceKind::cuda) == M3SA_DEVICE_CUDA);

bool in_list(int32_t value, int32_t last) { return value >= 0 && value <= last; }

thread_local std::string last_error_text;
thread_local const char* last_error = "";

m3sa_status record(const Status& status) noexcept {
  if (status.ok()) {
    last_error = "";
    return M3SA_OK;
  }
  try {
    last_error_text = status.to_string();
    last_error = last_error_text.c_str();
  } catch (...) {
    last_error = "internal: out of host memory for the error message";
  }
  return static_cast<m3sa_status>(status.code());
}

// Runs `body` (returning a Status) with every exception turned into a code.
template <typename Body> m3sa_status guarded(Body&& body) noexcept {
  try {
    return record(body());
  } catch (const std::bad_alloc&) {
    last_error = "internal: out of host memory";
  } catch (...) {
    last_error = "internal: unexpected exception inside m3sa";
  }
  return M3SA_INTERNAL;
}

// Every message of an op's entry point starts "m3sa::<op>: ", as the C++ ones do (contract §9).
Status with_op(int32_t op, Status status) {
  if (status.ok()) return status;
  const char* name =
      in_list(op, M3SA_OP_NORM_ROPE_INSERT) ? to_string(static_cast<OpKind>(op)) : "unknown-op";
  return {status.code(), std::string("m3sa::") + name + ": " + status.message()};
}

Status null_argument(const char* name, const char* type) {
  return Status::invalid_argument(name, detail::concat("a non-null ", type), "NULL");
}

// An enum-typed int of the C structs: checked against [0, count) before the cast.
template <typename Enum>
Status to_enum(int32_t value, int32_t count, const std::string& field, Enum* out) {
  if (!in_list(value, count - 1))
    return Status::invalid_argument(field, detail::concat("one of 0..", count - 1),
                                    std::to_string(value));
  *out = static_cast<Enum>(value);
  return {};
}

Status to_dtype(int32_t value, const std::string& field, DType* out) {
  return to_enum(value, M3SA_DTYPE_I64 + 1, field, out);
}
Status to_backend(int32_t value, const std::string& field, Backend* out) {
  return to_enum(value, M3SA_BACKEND_CUDA + 1, field, out);
}
Status to_op(int32_t value, const std::string& field, OpKind* out) {
  return to_enum(value, M3SA_OP_NORM_ROPE_INSERT + 1, field, out);
}

Status to_view(const m3sa_tensor_view& view, const std::string& name, TensorView* out) {
  TensorView result;
  M3SA_RETURN_IF_ERROR(to_dtype(view.dtype, name + ".dtype", &result.dtype));
  if (view.rank < 0 || view.rank > M3SA_MAX_RANK)
    return Status::invalid_argument(name + ".rank", detail::concat("0..", M3SA_MAX_RANK),
                                    std::to_string(view.rank));
  M3SA_RETURN_IF_ERROR(
      to_enum(view.device_kind, M3SA_DEVICE_CUDA + 1, name + ".device_kind", &result.device.kind));
  result.data = view.data;
  result.rank = view.rank;
  result.device.ordinal = view.device_ordinal;
  for (int d = 0; d < M3SA_MAX_RANK; ++d) {
    result.shape[d] = view.shape[d];
    result.strides[d] = view.strides[d];
  }
  *out = result;
  return {};
}

Status to_batch(const m3sa_batch& batch, BatchMetadata* out) {
  M3SA_RETURN_IF_ERROR(to_view(batch.cu_q_lens, "batch.cu_q_lens", &out->cu_q_lens));
  M3SA_RETURN_IF_ERROR(to_view(batch.seq_lens, "batch.seq_lens", &out->seq_lens));
  M3SA_RETURN_IF_ERROR(to_view(batch.block_table, "batch.block_table", &out->block_table));
  out->num_requests = batch.num_requests;
  out->num_decode_requests = batch.num_decode_requests;
  out->decode_q_len = batch.decode_q_len;
  out->num_tokens = batch.num_tokens;
  return {};
}

Status to_config(const m3sa_config& config, const std::string& name, MsaConfig* out) {
  if (config.reduce_heads != 0 && config.reduce_heads != 1)
    return Status::invalid_argument(name + ".reduce_heads", "0 or 1",
                                    std::to_string(config.reduce_heads));
  out->top_k = config.top_k;
  out->local_blocks = config.local_blocks;
  out->init_blocks = config.init_blocks;
  out->num_index_heads = config.num_index_heads;
  out->score_scale = config.score_scale;
  out->reduce_heads = config.reduce_heads == 1;
  out->rms_norm_eps = config.rms_norm_eps;
  out->norm_weight_offset = config.norm_weight_offset;
  out->rope_theta = config.rope_theta;
  return {};
}

m3sa_config from_config(const MsaConfig& config) {
  m3sa_config out;
  out.top_k = config.top_k;
  out.local_blocks = config.local_blocks;
  out.init_blocks = config.init_blocks;
  out.num_index_heads = config.num_index_heads;
  out.score_scale = config.score_scale;
  out.reduce_heads = config.reduce_heads ? 1 : 0;
  out.rms_norm_eps = config.rms_norm_eps;
  out.norm_weight_offset = config.norm_weight_offset;
  out.rope_theta = config.rope_theta;
  return out;
}

// Fields named as the C++ make_plan names them ("backend", "config.top_k"), after `prefix`.
Status to_request(const m3sa_plan_request& request, const std::string& prefix, PlanRequest* out) {
  M3SA_RETURN_IF_ERROR(to_op(request.op, prefix + "op", &out->op));
  M3SA_RETURN_IF_ERROR(to_backend(request.backend, prefix + "backend", &out->backend));
  M3SA_RETURN_IF_ERROR(to_config(request.config, prefix + "config", &out->config));
  M3SA_RETURN_IF_ERROR(to_dtype(request.cache_dtype, prefix + "cache_dtype", &out->cache_dtype));
  out->capacities = {request.capacities.max_requests, request.capacities.max_tokens,
                     request.capacities.max_blocks_per_request};
  out->num_threads = request.num_threads;
  out->device_ordinal = request.device_ordinal;
  out->implementation = request.implementation;
  return {};
}

m3sa_plan_request from_request(const PlanRequest& request) {
  m3sa_plan_request out;
  out.op = static_cast<int32_t>(request.op);
  out.backend = static_cast<int32_t>(request.backend);
  out.config = from_config(request.config);
  out.capacities = {request.capacities.max_requests, request.capacities.max_tokens,
                    request.capacities.max_blocks_per_request};
  out.cache_dtype = static_cast<int32_t>(request.cache_dtype);
  out.num_threads = request.num_threads;
  out.device_ordinal = request.device_ordinal;
  out.implementation = request.implementation;
  return out;
}

// A C plan back into the OpPlan it was copied from: the C++ layer then checks its seal, so a plan
// edited on the C side is rejected as one edited in C++ is.
Status to_plan(const m3sa_plan* plan, OpPlan* out) {
  if (plan == nullptr) return null_argument("plan", "m3sa_plan*");
  M3SA_RETURN_IF_ERROR(to_request(plan->request, "plan.request.", &out->request));
  out->implementation = plan->implementation;
  out->num_threads = plan->num_threads;
  if (plan->workspace_bytes > SIZE_MAX)
    return Status::invalid_argument("plan.workspace_bytes", "a size this host can address",
                                    std::to_string(plan->workspace_bytes));
  out->workspace_bytes = static_cast<size_t>(plan->workspace_bytes);
  out->plan_info_version = plan->plan_info_version;
  for (int i = 0; i < M3SA_PLAN_INFO_SIZE; ++i) out->plan_info[i] = plan->plan_info[i];
  return {};
}

Status to_workspace(m3sa_workspace workspace, Workspace* out) {
  if (workspace.bytes > SIZE_MAX)
    return Status::invalid_argument("workspace.bytes", "a size this host can address",
                                    std::to_string(workspace.bytes));
  *out = {workspace.data, static_cast<size_t>(workspace.bytes)};
  return {};
}

ExecContext to_context(const m3sa_exec_context* ctx) {
  if (ctx == nullptr) return {};
  return {ctx->num_threads, ctx->stream};
}

// One `convert` per op's arguments, named as the C++ validation names them.
Status convert(const m3sa_norm_rope_insert_args& a, NormRopeInsertArgs* out) {
  M3SA_RETURN_IF_ERROR(to_view(a.q, "q", &out->q));
  M3SA_RETURN_IF_ERROR(to_view(a.k, "k", &out->k));
  M3SA_RETURN_IF_ERROR(to_view(a.v, "v", &out->v));
  M3SA_RETURN_IF_ERROR(to_view(a.index_q, "index_q", &out->index_q));
  M3SA_RETURN_IF_ERROR(to_view(a.index_k, "index_k", &out->index_k));
  M3SA_RETURN_IF_ERROR(to_view(a.positions, "positions", &out->positions));
  M3SA_RETURN_IF_ERROR(to_view(a.q_norm_weight, "q_norm_weight", &out->q_norm_weight));
  M3SA_RETURN_IF_ERROR(to_view(a.k_norm_weight, "k_norm_weight", &out->k_norm_weight));
  M3SA_RETURN_IF_ERROR(
      to_view(a.index_q_norm_weight, "index_q_norm_weight", &out->index_q_norm_weight));
  M3SA_RETURN_IF_ERROR(
      to_view(a.index_k_norm_weight, "index_k_norm_weight", &out->index_k_norm_weight));
  M3SA_RETURN_IF_ERROR(to_view(a.cos_sin_cache, "cos_sin_cache", &out->cos_sin_cache));
  M3SA_RETURN_IF_ERROR(to_view(a.slot_mapping, "slot_mapping", &out->slot_mapping));
  M3SA_RETURN_IF_ERROR(
      to_view(a.index_slot_mapping, "index_slot_mapping", &out->index_slot_mapping));
  M3SA_RETURN_IF_ERROR(to_view(a.q_out, "q_out", &out->q_out));
  M3SA_RETURN_IF_ERROR(to_view(a.k_cache, "k_cache", &out->k_cache));
  M3SA_RETURN_IF_ERROR(to_view(a.v_cache, "v_cache", &out->v_cache));
  out->k_scale = a.k_scale;
  out->v_scale = a.v_scale;
  M3SA_RETURN_IF_ERROR(to_view(a.index_q_out, "index_q_out", &out->index_q_out));
  return to_view(a.index_k_cache, "index_k_cache", &out->index_k_cache);
}

Status convert(const m3sa_insert_index_k_args& a, InsertIndexKArgs* out) {
  M3SA_RETURN_IF_ERROR(to_view(a.index_k, "index_k", &out->index_k));
  M3SA_RETURN_IF_ERROR(to_view(a.slot_mapping, "slot_mapping", &out->slot_mapping));
  return to_view(a.index_k_cache, "index_k_cache", &out->index_k_cache);
}

// score_blocks and index_topk read the same inputs; only their outputs differ.
template <typename CArgs, typename CppArgs>
Status convert_scoring_inputs(const CArgs& a, CppArgs* out) {
  M3SA_RETURN_IF_ERROR(to_view(a.index_q, "index_q", &out->index_q));
  M3SA_RETURN_IF_ERROR(to_view(a.index_k_cache, "index_k_cache", &out->index_k_cache));
  return to_batch(a.batch, &out->batch);
}

Status convert(const m3sa_score_blocks_args& a, ScoreBlocksArgs* out) {
  M3SA_RETURN_IF_ERROR(convert_scoring_inputs(a, out));
  return to_view(a.scores, "scores", &out->scores);
}

Status convert(const m3sa_select_topk_blocks_args& a, SelectTopkBlocksArgs* out) {
  M3SA_RETURN_IF_ERROR(to_view(a.scores, "scores", &out->scores));
  M3SA_RETURN_IF_ERROR(to_batch(a.batch, &out->batch));
  return to_view(a.topk, "topk", &out->topk);
}

Status convert(const m3sa_index_topk_args& a, IndexTopkArgs* out) {
  M3SA_RETURN_IF_ERROR(convert_scoring_inputs(a, out));
  return to_view(a.topk, "topk", &out->topk);
}

Status convert(const m3sa_sparse_attention_args& a, SparseAttentionArgs* out) {
  M3SA_RETURN_IF_ERROR(to_view(a.q, "q", &out->q));
  M3SA_RETURN_IF_ERROR(to_view(a.k_cache, "k_cache", &out->k_cache));
  M3SA_RETURN_IF_ERROR(to_view(a.v_cache, "v_cache", &out->v_cache));
  out->k_scale = a.k_scale;
  out->v_scale = a.v_scale;
  M3SA_RETURN_IF_ERROR(to_view(a.topk, "topk", &out->topk));
  M3SA_RETURN_IF_ERROR(to_batch(a.batch, &out->batch));
  M3SA_RETURN_IF_ERROR(to_view(a.kv_block_table, "kv_block_table", &out->kv_block_table));
  M3SA_RETURN_IF_ERROR(to_view(a.out, "out", &out->out));
  return to_view(a.lse, "lse", &out->lse);
}

// The six runs: plan, arguments and workspace converted, then the C++ op.
template <typename CArgs, typename CppArgs>
m3sa_status run_op(OpKind kind, const m3sa_plan* plan, const CArgs* args, const char* args_type,
                   m3sa_workspace workspace, const m3sa_exec_context* ctx,
                   Status (*op)(const OpPlan&, const CppArgs&, Workspace,
                                const ExecContext&)) noexcept {
  return guarded([&]() -> Status {
    OpPlan cpp_plan;
    CppArgs cpp_args;
    Workspace cpp_workspace;
    const Status converted = [&]() -> Status {
      M3SA_RETURN_IF_ERROR(to_plan(plan, &cpp_plan));
      if (args == nullptr) return null_argument("args", args_type);
      M3SA_RETURN_IF_ERROR(convert(*args, &cpp_args));
      return to_workspace(workspace, &cpp_workspace);
    }();
    M3SA_RETURN_IF_ERROR(with_op(static_cast<int32_t>(kind), converted));
    return op(cpp_plan, cpp_args, cpp_workspace, to_context(ctx)); // its messages carry the op
  });
}

// prepare_workspace and read_device_errors name the plan's op, as the C++ ones do.
Status plan_and_workspace(const m3sa_plan* plan, m3sa_workspace workspace, OpPlan* cpp_plan,
                          Workspace* cpp_workspace) {
  Status status = to_plan(plan, cpp_plan);
  if (status.ok()) status = to_workspace(workspace, cpp_workspace);
  return with_op(plan != nullptr ? plan->request.op : -1, status);
}

} // namespace
} // namespace m3sa

using namespace m3sa;

extern "C" {

int32_t m3sa_c_api_version(void) { return M3SA_C_API_VERSION; }
const char* m3sa_version_string(void) { return version_string(); }
const char* m3sa_build_commit(void) { return build_commit(); }
const char* m3sa_last_error_message(void) { return last_error; }

const char* m3sa_status_name(m3sa_status status) {
  return in_list(status, M3SA_INTERNAL) ? to_string(static_cast<StatusCode>(status)) : "unknown";
}
const char* m3sa_dtype_name(int32_t dtype) {
  return in_list(dtype, M3SA_DTYPE_I64) ? to_string(static_cast<DType>(dtype)) : "unknown";
}
const char* m3sa_backend_name(int32_t backend) {
  return in_list(backend, M3SA_BACKEND_CUDA) ? to_string(static_cast<Backend>(backend)) : "unknown";
}
const char* m3sa_op_name(int32_t op) {
  return in_list(op, M3SA_OP_NORM_ROPE_INSERT) ? to_string(static_cast<OpKind>(op)) : "unknown";
}
size_t m3sa_dtype_size(int32_t dtype) {
  return in_list(dtype, M3SA_DTYPE_I64) ? dtype_size(static_cast<DType>(dtype)) : 0;
}

void m3sa_config_init(m3sa_config* config) {
  if (config != nullptr) *config = from_config(MsaConfig{});
}

void m3sa_plan_request_init(m3sa_plan_request* request) {
  if (request != nullptr) *request = from_request(PlanRequest{});
}

m3sa_status m3sa_tensor_view_contiguous(void* data, int32_t dtype, int32_t rank,
                                        const int64_t* shape, m3sa_tensor_view* view) {
  return guarded([&]() -> Status {
    if (view == nullptr) return null_argument("view", "m3sa_tensor_view*");
    DType checked;
    M3SA_RETURN_IF_ERROR(to_dtype(dtype, "dtype", &checked));
    if (rank < 0 || rank > M3SA_MAX_RANK)
      return Status::invalid_argument("rank", detail::concat("0..", M3SA_MAX_RANK),
                                      std::to_string(rank));
    if (rank > 0 && shape == nullptr) return null_argument("shape", "int64_t array of rank dims");
    m3sa_tensor_view out = {};
    out.data = data;
    out.dtype = dtype;
    out.rank = rank;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (shape[d] < 0)
        return Status::invalid_argument(detail::concat("shape[", d, "]"), ">= 0",
                                        std::to_string(shape[d]));
      out.shape[d] = shape[d];
      out.strides[d] = stride;
      if (shape[d] > 0 && stride > INT64_MAX / shape[d])
        return Status::invalid_argument("shape", "a product of dims that fits int64",
                                        detail::concat("dims up to [", d, "] = ", shape[d]));
      stride *= shape[d];
    }
    *view = out;
    return {};
  });
}

int32_t m3sa_implementation_count(void) { return implementation_count(); }

m3sa_status m3sa_implementation_info_at(int32_t index, m3sa_implementation_info* info) {
  return guarded([&]() -> Status {
    if (info == nullptr) return null_argument("info", "m3sa_implementation_info*");
    if (index < 0 || index >= implementation_count())
      return Status::invalid_argument(
          "index",
          detail::concat("0..", implementation_count() - 1, " (m3sa_implementation_count)"),
          std::to_string(index));
    const ImplementationInfo cpp = implementation_info(index);
    *info = {cpp.name, static_cast<int32_t>(cpp.backend), static_cast<int32_t>(cpp.op),
             cpp.description};
    return {};
  });
}

m3sa_status m3sa_supports(int32_t backend, int32_t op, const m3sa_config* config,
                          int32_t cache_dtype) {
  return guarded([&]() -> Status {
    PlanRequest request;
    M3SA_RETURN_IF_ERROR(to_backend(backend, "backend", &request.backend));
    M3SA_RETURN_IF_ERROR(to_op(op, "op", &request.op));
    M3SA_RETURN_IF_ERROR(to_dtype(cache_dtype, "cache_dtype", &request.cache_dtype));
    if (config == nullptr) return null_argument("config", "m3sa_config*");
    M3SA_RETURN_IF_ERROR(to_config(*config, "config", &request.config));
    return supports(request.backend, request.op, request.config, request.cache_dtype);
  });
}

// Anything the CUDA backend refuses - a bad config included - is answered "cpu", as the C++
// best_available_backend answers for a config no CUDA implementation takes.
int32_t m3sa_best_available_backend(const m3sa_config* config, int32_t cache_dtype) {
  try {
    MsaConfig cpp_config;
    DType dtype;
    if (config == nullptr || !to_config(*config, "config", &cpp_config).ok() ||
        !to_dtype(cache_dtype, "cache_dtype", &dtype).ok())
      return M3SA_BACKEND_CPU;
    return static_cast<int32_t>(best_available_backend(cpp_config, dtype));
  } catch (...) {
    return M3SA_BACKEND_CPU;
  }
}

int32_t m3sa_cuda_device_count(void) { return cuda_device_count(); }
int32_t m3sa_cuda_backend_built(void) { return cuda_backend_built() ? 1 : 0; }

m3sa_status m3sa_make_plan(const m3sa_plan_request* request, m3sa_plan* plan) {
  return guarded([&]() -> Status {
    if (request == nullptr) return null_argument("request", "m3sa_plan_request*");
    if (plan == nullptr) return with_op(request->op, null_argument("plan", "m3sa_plan*"));
    PlanRequest cpp_request;
    M3SA_RETURN_IF_ERROR(with_op(request->op, to_request(*request, "", &cpp_request)));
    OpPlan cpp_plan;
    M3SA_RETURN_IF_ERROR(make_plan(cpp_request, &cpp_plan));
    m3sa_plan out;
    out.request = from_request(cpp_plan.request);
    out.implementation = cpp_plan.implementation;
    out.num_threads = cpp_plan.num_threads;
    out.workspace_bytes = cpp_plan.workspace_bytes;
    out.plan_info_version = cpp_plan.plan_info_version;
    for (int i = 0; i < M3SA_PLAN_INFO_SIZE; ++i) out.plan_info[i] = cpp_plan.plan_info[i];
    *plan = out;
    return {};
  });
}

const char* m3sa_plan_implementation_name(const m3sa_plan* plan) {
  try {
    OpPlan cpp_plan;
    return to_plan(plan, &cpp_plan).ok() ? implementation_name(cpp_plan) : "";
  } catch (...) {
    return "";
  }
}

m3sa_status m3sa_prepare_workspace(const m3sa_plan* plan, m3sa_workspace workspace,
                                   const m3sa_exec_context* ctx) {
  return guarded([&]() -> Status {
    OpPlan cpp_plan;
    Workspace cpp_workspace;
    M3SA_RETURN_IF_ERROR(plan_and_workspace(plan, workspace, &cpp_plan, &cpp_workspace));
    return prepare_workspace(cpp_plan, cpp_workspace, to_context(ctx));
  });
}

// The six runs, each m3sa_<op>(plan, args, workspace, ctx) over run_op.
#define M3SA_C_RUN(op)                                                                             \
  m3sa_status m3sa_##op(const m3sa_plan* plan, const m3sa_##op##_args* args,                       \
                        m3sa_workspace workspace, const m3sa_exec_context* ctx) {                  \
    return run_op(OpKind::op, plan, args, "m3sa_" #op "_args*", workspace, ctx, &op);              \
  }
M3SA_C_RUN(norm_rope_insert)
M3SA_C_RUN(insert_index_k)
M3SA_C_RUN(score_blocks)
M3SA_C_RUN(select_topk_blocks)
M3SA_C_RUN(index_topk)
M3SA_C_RUN(sparse_attention)
#undef M3SA_C_RUN

m3sa_status m3sa_read_device_errors(const m3sa_plan* plan, m3sa_workspace workspace,
                                    const m3sa_exec_context* ctx, int32_t* flags) {
  return guarded([&]() -> Status {
    OpPlan cpp_plan;
    Workspace cpp_workspace;
    M3SA_RETURN_IF_ERROR(plan_and_workspace(plan, workspace, &cpp_plan, &cpp_workspace));
    return read_device_errors(cpp_plan, cpp_workspace, to_context(ctx), flags);
  });
}

uint16_t m3sa_float_to_bf16_bits(float value) { return float_to_bf16_bits(value); }
float m3sa_bf16_bits_to_float(uint16_t bits) { return bf16_bits_to_float(bits); }
uint8_t m3sa_float_to_e4m3_bits(float value) { return float_to_e4m3_bits(value); }
float m3sa_e4m3_bits_to_float(uint8_t bits) { return e4m3_bits_to_float(bits); }

} // extern "C"
