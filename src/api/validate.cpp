#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/checked_math.h"
#include "common/host_batch.h"
#include "registry/registry.h"

namespace m3sa::detail {
namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string text;
  for (DType d : dtypes) text += (text.empty() ? "" : " or ") + std::string(to_string(d));
  return text;
}

// Offset in elements of a view's last element (all extents >= 1 and strides >= 0 here), saturated
// at INT64_MAX so that an absurd view reads as too large instead of wrapping.
int64_t last_offset(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d)
    last = saturating_add(last, saturating_mul(t.shape[d] - 1, t.strides[d]));
  return last;
}

// Bytes from a view's first to one past its last element, or INT64_MAX when that overflows.
int64_t byte_extent(const TensorView& t) {
  return saturating_mul(saturating_add(last_offset(t), 1),
                        static_cast<int64_t>(dtype_size(t.dtype)));
}

// Smallest and one-past-largest byte touched by a non-empty view.
void byte_range(const TensorView& t, uintptr_t* begin, uintptr_t* end) {
  *begin = reinterpret_cast<uintptr_t>(t.data);
  *end = *begin + static_cast<uintptr_t>(byte_extent(t));
}

// True when no two index tuples of the view address the same element (an empty view has none).
bool is_non_overlapping(const TensorView& t) {
  if (t.numel() == 0) return true;
  int order[TensorView::kMaxRank];
  int n = 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) order[n++] = d;
  for (int i = 1; i < n; ++i) // insertion sort by stride (at most 4 dims)
    for (int j = i; j > 0 && t.strides[order[j]] < t.strides[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  int64_t span = 1; // elements covered by the dims already placed
  for (int i = 0; i < n; ++i) {
    if (t.strides[order[i]] < span) return false;
    span = saturating_mul(t.strides[order[i]], t.shape[order[i]]);
  }
  return true;
}

} // namespace

DeviceKind device_of(Backend backend) {
  return backend == Backend::cuda ? DeviceKind::cuda : DeviceKind::cpu;
}
bool host_readable(DeviceKind device) { return device == DeviceKind::cpu; }

Status check_tensor(const TensorView& t, const TensorRule& rule, DeviceKind device) {
  const std::string expected = dtype_list(rule.dtypes) + " " + rule.shape_text;
  const auto fail = [&](const std::string& what) {
    return Status::invalid_argument(rule.name, expected + " (" + what + ")", t.describe());
  };
  if (t.rank != static_cast<int>(rule.shape.size())) // rule ranks are <= kMaxRank
    return fail(detail::concat("rank ", rule.shape.size()));
  if (std::find(rule.dtypes.begin(), rule.dtypes.end(), t.dtype) == rule.dtypes.end())
    return fail("dtype " + dtype_list(rule.dtypes));
  int d = 0;
  for (int64_t extent : rule.shape) {
    if (t.shape[d] < 0)
      return fail(detail::concat("non-negative extents; dim ", d, " is ", t.shape[d]));
    if (extent >= 0 && t.shape[d] != extent) return fail(detail::concat("dim ", d, " == ", extent));
    if (extent == kAtLeastOne && t.shape[d] < 1) return fail(detail::concat("dim ", d, " >= 1"));
    if (t.strides[d] < 0)
      return fail(detail::concat("non-negative strides; stride ", d, " is ", t.strides[d]));
    ++d;
  }
  if (t.device.kind != device)
    return fail(detail::concat("memory on ", to_string(device), " for this backend"));
  if (t.data == nullptr && t.numel() > 0) return fail("a non-null data pointer");
  // Backends read elements through typed pointers (an i64 slot, an f32 score): a pointer that
  // is not a multiple of the element size is undefined behaviour on every read.
  const size_t element_bytes = dtype_size(t.dtype);
  if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data) % element_bytes != 0)
    return fail(detail::concat("data aligned to its ", element_bytes, "-byte elements"));
  // Every later size computation (offsets, byte ranges, page and slot counts) then fits in int64.
  if (t.numel() > 0 && byte_extent(t) > kMaxTensorBytes)
    return fail(
        detail::concat("at most 2^", kMaxTensorBytesLog2, " bytes from first to last element"));
  if (rule.rows_contiguous && t.rank > 0 && t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1)
    return fail("stride 1 in the last dim");
  if (rule.is_output && !is_non_overlapping(t))
    return fail("strides that do not alias elements of an output");
  return {};
}

Status check_optional_tensor(const TensorView& t, const TensorRule& rule, DeviceKind device) {
  return t.present() ? check_tensor(t, rule, device) : Status{};
}

Status check_disjoint(const TensorView& a, const char* a_name, const TensorView& b,
                      const char* b_name) {
  if (!a.present() || !b.present() || a.numel() == 0 || b.numel() == 0) return {};
  uintptr_t a0, a1, b0, b1;
  byte_range(a, &a0, &a1);
  byte_range(b, &b0, &b1);
  if (a0 < b1 && b0 < a1)
    return Status::invalid_argument(
        a_name, detail::concat("memory disjoint from ", b_name),
        detail::concat("overlapping byte ranges [", a0, ", ", a1, ") and [", b0, ", ", b1, ")"));
  return {};
}

Status check_aliasing(Operands outputs, Operands inputs, const BatchMetadata* batch,
                      const Workspace& workspace) {
  static const TensorView kAbsent;
  const Operand metadata[] = {{batch ? batch->cu_q_lens : kAbsent, "batch.cu_q_lens"},
                              {batch ? batch->seq_lens : kAbsent, "batch.seq_lens"},
                              {batch ? batch->block_table : kAbsent, "batch.block_table"}};
  // The workspace as a byte tensor of the size the plan uses (fp8_e4m3: a 1-byte dtype).
  const TensorView scratch = TensorView::contiguous(workspace.data, DType::fp8_e4m3,
                                                    {static_cast<int64_t>(workspace.bytes)});
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (auto other = out + 1; other != outputs.end(); ++other)
      M3SA_RETURN_IF_ERROR(check_disjoint(out->view, out->name, other->view, other->name));
    for (const Operand& in : metadata)
      M3SA_RETURN_IF_ERROR(check_disjoint(out->view, out->name, in.view, in.name));
    for (const Operand& in : inputs) {
      const bool in_place =
          out->in_place_of == &in.view && out->view.data == in.view.data &&
          out->view.dtype == in.view.dtype && out->view.rank == in.view.rank &&
          std::equal(in.view.shape, in.view.shape + in.view.rank, out->view.shape) &&
          std::equal(in.view.strides, in.view.strides + in.view.rank, out->view.strides);
      if (!in_place) M3SA_RETURN_IF_ERROR(check_disjoint(out->view, out->name, in.view, in.name));
    }
  }
  for (const std::span<const Operand> group :
       {std::span<const Operand>(outputs), std::span<const Operand>(inputs),
        std::span<const Operand>(metadata)})
    for (const Operand& t : group)
      M3SA_RETURN_IF_ERROR(check_disjoint(scratch, "workspace.data", t.view, t.name));
  return {};
}

Status check_vector_rows(const TensorView& t, const char* name, DeviceKind device) {
  if (device != DeviceKind::cuda || !t.present()) return {};
  const size_t elem = dtype_size(t.dtype);
  bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d + 1 < t.rank; ++d) aligned = aligned && (t.strides[d] * elem) % 16 == 0;
  if (!aligned)
    return Status::invalid_argument(
        name, "a 16-byte aligned pointer and row strides that are multiples of 16 bytes",
        t.describe());
  return {};
}

Status check_config(const MsaConfig& c) {
  if (c.top_k < 1 || c.top_k > kMaxTopK)
    return Status::invalid_argument("config.top_k", detail::concat("1..", kMaxTopK),
                                    std::to_string(c.top_k));
  if (c.local_blocks < 0)
    return Status::invalid_argument("config.local_blocks", ">= 0", std::to_string(c.local_blocks));
  if (c.init_blocks < 0)
    return Status::invalid_argument("config.init_blocks", ">= 0", std::to_string(c.init_blocks));
  if (int64_t{c.local_blocks} + c.init_blocks > c.top_k) // both up to INT_MAX: sum in int64
    return Status::invalid_argument("config.local_blocks + config.init_blocks",
                                    detail::concat("<= config.top_k (", c.top_k, ")"),
                                    detail::concat(c.local_blocks, " + ", c.init_blocks));
  if (c.num_index_heads < 1 || c.num_index_heads > kMaxIndexHeads)
    return Status::invalid_argument("config.num_index_heads", detail::concat("1..", kMaxIndexHeads),
                                    std::to_string(c.num_index_heads));
  if (!(c.score_scale > 0.f) || !std::isfinite(c.score_scale))
    return Status::invalid_argument("config.score_scale", "a finite value > 0",
                                    std::to_string(c.score_scale));
  return {};
}

Status check_cache_dtype(DType cache_dtype) {
  if (cache_dtype != DType::bf16 && cache_dtype != DType::fp8_e4m3)
    return Status::invalid_argument("cache_dtype", "bf16 or fp8_e4m3", to_string(cache_dtype));
  return {};
}

Status check_plan_request(const PlanRequest& request) {
  if (static_cast<int>(request.op) > static_cast<int>(OpKind::norm_rope_insert))
    return Status::invalid_argument("op", "an OpKind (0..5)",
                                    std::to_string(static_cast<int>(request.op)));
  if (static_cast<int>(request.backend) > static_cast<int>(Backend::cuda))
    return Status::invalid_argument("backend", "a Backend (0..2)",
                                    std::to_string(static_cast<int>(request.backend)));
  M3SA_RETURN_IF_ERROR(check_config(request.config));
  const Capacities& cap = request.capacities;
  if (cap.max_requests < 1 || cap.max_requests > INT32_MAX)
    return Status::invalid_argument("capacities.max_requests", "1..2^31-1",
                                    std::to_string(cap.max_requests));
  if (cap.max_tokens < 1 || cap.max_tokens > INT32_MAX)
    return Status::invalid_argument("capacities.max_tokens", "1..2^31-1",
                                    std::to_string(cap.max_tokens));
  if (cap.max_blocks_per_request < 1 || cap.max_blocks_per_request > (int64_t{1} << 20))
    return Status::invalid_argument("capacities.max_blocks_per_request", "1..2^20 (128M tokens)",
                                    std::to_string(cap.max_blocks_per_request));
  M3SA_RETURN_IF_ERROR(check_cache_dtype(request.cache_dtype));
  if (request.num_threads < 0 || request.num_threads > kMaxPlanThreads)
    return Status::invalid_argument("num_threads",
                                    detail::concat("0..", kMaxPlanThreads, " (0 = OpenMP default)"),
                                    std::to_string(request.num_threads));
  return {};
}

Status check_run_common(const OpPlan& plan, OpKind op, const Workspace& workspace,
                        const ExecContext& ctx) {
  if (plan.request.op != op)
    return Status::invalid_argument("plan", detail::concat("a plan made for ", to_string(op)),
                                    detail::concat("a plan for ", to_string(plan.request.op)));
  const Implementation* impl = nullptr;
  M3SA_RETURN_IF_ERROR(sealed_implementation_of(plan, op, &impl));
  M3SA_RETURN_IF_ERROR(check_workspace(workspace, plan.workspace_bytes));
  if (ctx.num_threads < 0)
    return Status::invalid_argument("ctx.num_threads", ">= 0", std::to_string(ctx.num_threads));
  return {};
}

Status check_workspace(const Workspace& workspace, size_t required_bytes) {
  if (workspace.bytes < required_bytes)
    return Status::invalid_argument("workspace.bytes",
                                    concat(">= the plan's workspace_bytes (", required_bytes, ")"),
                                    std::to_string(workspace.bytes));
  if (required_bytes > 0 && workspace.data == nullptr)
    return Status::invalid_argument("workspace.data", "a non-null pointer", "nullptr");
  if (reinterpret_cast<uintptr_t>(workspace.data) % 64 != 0)
    return Status::invalid_argument("workspace.data", "64-byte alignment",
                                    concat("address ", workspace.data));
  return {};
}

namespace {

// Contract §3: two tokens never share a non-negative slot (which row would land is a race between
// CPU threads or CUDA blocks). The slots are sorted with their rows to find a repeat.
Status check_distinct_slots(const TensorView& slots, const char* name) {
  std::vector<std::pair<int64_t, int64_t>> slot_rows; // (slot, row)
  try {
    slot_rows.reserve(static_cast<size_t>(slots.shape[0]));
  } catch (const std::bad_alloc&) {
    return Status::unsupported(concat(name, " of ", slots.shape[0], " rows"),
                               "no host memory to check that its slots are distinct");
  }
  for (int64_t t = 0; t < slots.shape[0]; ++t) {
    const int64_t slot = slots.ptr<const int64_t>()[t * slots.strides[0]];
    if (slot >= 0) slot_rows.emplace_back(slot, t);
  }
  std::sort(slot_rows.begin(), slot_rows.end());
  for (size_t i = 1; i < slot_rows.size(); ++i)
    if (slot_rows[i].first == slot_rows[i - 1].first)
      return Status::invalid_argument(
          name, "distinct non-negative slots (contract §3: one token per cache row)",
          concat("slot ", slot_rows[i].first, " at rows ", slot_rows[i - 1].second, " and ",
                 slot_rows[i].second));
  return {};
}

} // namespace

// Slots of a [T] i64 mapping below pages x 128 (or negative: skipped), each used once.
Status check_slots(const TensorView& slots, const char* name, int64_t pages) {
  for (int64_t t = 0; t < slots.shape[0]; ++t) {
    const int64_t slot = slots.ptr<const int64_t>()[t * slots.strides[0]];
    if (slot >= pages * kBlockTokens)
      return Status::invalid_argument(
          name, concat("slots < num_pages x 128 = ", pages * kBlockTokens, ", or < 0 to skip"),
          concat(slot, " at row ", t));
  }
  return check_distinct_slots(slots, name);
}

Status check_block_table_pages(const BatchMetadata& batch, const TensorView& table,
                               const char* name, int64_t num_pages) {
  const HostBatch host(batch);
  for (int r = 0; r < batch.num_requests; ++r) {
    const int64_t blocks = (int64_t{host.seq_len(r)} + kBlockTokens - 1) / kBlockTokens;
    if (blocks > table.shape[1])
      return Status::invalid_argument(name,
                                      detail::concat("at least ", blocks, " blocks for request ", r,
                                                     " (seq_len ", host.seq_len(r), ")"),
                                      detail::concat(table.shape[1], " columns"));
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t page = host.page(table, r, b);
      if (page < 0 || page >= num_pages)
        return Status::invalid_argument(name, detail::concat("page ids in [0, ", num_pages, ")"),
                                        detail::concat(page, " at [", r, "][", b, "]"));
    }
  }
  return {};
}

Status check_batch(const OpPlan& plan, const BatchMetadata& batch, DeviceKind device,
                   int64_t num_pages) {
  const Capacities& cap = plan.request.capacities;
  const int64_t r_count = batch.num_requests;
  if (r_count < 0 || r_count > cap.max_requests)
    return Status::invalid_argument(
        "batch.num_requests",
        detail::concat("0..", cap.max_requests, " (plan capacity; re-plan outside graph capture)"),
        std::to_string(r_count));
  if (batch.num_decode_requests < 0 || batch.num_decode_requests > r_count)
    return Status::invalid_argument("batch.num_decode_requests",
                                    detail::concat("0..num_requests (", r_count, ")"),
                                    std::to_string(batch.num_decode_requests));
  if (batch.decode_q_len < 1 || batch.decode_q_len > kMaxDecodeQLen)
    return Status::invalid_argument("batch.decode_q_len", detail::concat("1..", kMaxDecodeQLen),
                                    std::to_string(batch.decode_q_len));
  if (batch.num_tokens < 0 || batch.num_tokens > cap.max_tokens)
    return Status::invalid_argument("batch.num_tokens",
                                    detail::concat("0..", cap.max_tokens, " (plan capacity)"),
                                    std::to_string(batch.num_tokens));
  if (int64_t{batch.num_decode_requests} * batch.decode_q_len > batch.num_tokens)
    return Status::invalid_argument(
        "batch.num_decode_requests",
        detail::concat("num_decode_requests x decode_q_len <= num_tokens (", batch.num_tokens, ")"),
        detail::concat(batch.num_decode_requests, " x ", batch.decode_q_len));
  M3SA_RETURN_IF_ERROR(check_tensor(
      batch.cu_q_lens,
      {"batch.cu_q_lens", {DType::i32}, {r_count + 1}, "[num_requests + 1]", false}, device));
  M3SA_RETURN_IF_ERROR(
      check_tensor(batch.seq_lens,
                   {"batch.seq_lens", {DType::i32}, {r_count}, "[num_requests]", false}, device));
  M3SA_RETURN_IF_ERROR(check_tensor(batch.block_table,
                                    {"batch.block_table",
                                     {DType::i32},
                                     {r_count, kAtLeastOne},
                                     "[num_requests, max_blocks]",
                                     false},
                                    device));
  if (batch.block_table.shape[1] > cap.max_blocks_per_request)
    return Status::invalid_argument(
        "batch.block_table",
        detail::concat("at most ", cap.max_blocks_per_request, " columns (plan capacity)"),
        batch.block_table.describe());
  if (!host_readable(device)) return {}; // device-side checks report through the error flag

  const HostBatch host(batch);
  if (host.q_begin(0) != 0)
    return Status::invalid_argument("batch.cu_q_lens", "cu_q_lens[0] == 0",
                                    std::to_string(host.q_begin(0)));
  for (int r = 0; r < r_count; ++r) {
    const int64_t q_len = host.q_len(r);
    const int32_t seq_len = host.seq_len(r);
    if (q_len < 0)
      return Status::invalid_argument("batch.cu_q_lens", "non-decreasing values",
                                      detail::concat("cu_q_lens[", r + 1,
                                                     "] = ", host.q_begin(r + 1), " < cu_q_lens[",
                                                     r, "] = ", host.q_begin(r)));
    if (r < batch.num_decode_requests && q_len != batch.decode_q_len)
      return Status::invalid_argument("batch.cu_q_lens",
                                      detail::concat("q_len == decode_q_len (", batch.decode_q_len,
                                                     ") for every decode request"),
                                      detail::concat("q_len ", q_len, " for request ", r));
    if (seq_len < 0)
      return Status::invalid_argument("batch.seq_lens", ">= 0 (0 marks a padding row)",
                                      detail::concat(seq_len, " for request ", r));
    if (seq_len > 0 && q_len > seq_len)
      return Status::invalid_argument(
          "batch.seq_lens", detail::concat("seq_len >= q_len (", q_len, ") for request ", r),
          std::to_string(seq_len));
    if (int64_t{seq_len} > batch.block_table.shape[1] * kBlockTokens)
      return Status::invalid_argument(
          "batch.seq_lens",
          detail::concat("<= block-table capacity ", batch.block_table.shape[1],
                         " x 128 = ", batch.block_table.shape[1] * kBlockTokens, " tokens"),
          detail::concat(seq_len, " for request ", r));
  }
  if (host.q_begin(static_cast<int>(r_count)) != batch.num_tokens)
    return Status::invalid_argument(
        "batch.cu_q_lens",
        detail::concat("cu_q_lens[num_requests] == num_tokens (", batch.num_tokens, ")"),
        std::to_string(host.q_begin(static_cast<int>(r_count))));
  if (num_pages >= 0)
    M3SA_RETURN_IF_ERROR(
        check_block_table_pages(batch, batch.block_table, "batch.block_table", num_pages));
  return {};
}

} // namespace m3sa::detail
