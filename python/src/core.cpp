// m3sa._core: the nanobind extension under the m3sa Python package (python/m3sa/__init__.py).
// Arrays arrive as nb::ndarray (DLPack or the buffer protocol) and become TensorViews that borrow
// their memory: no copies, strides as given, the library validates them. Status values become
// exceptions here and only here: invalid_argument -> ValueError, unsupported -> UnsupportedError,
// a dtype with no m3sa equivalent -> TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "m3sa/m3sa.h"
#include "testing/compare.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace m3sa {
namespace {

// Any DLPack or buffer-protocol array; the stubs call both m3sa._typing.Array (the nb::sig of each
// function taking arrays below), as nanobind's numpy.typing.NDArray would reject torch tensors.
using InputArray = nb::ndarray<nb::ro>; // read-only arrays are fine where m3sa only reads
using OutputArray = nb::ndarray<>;      // written in place: must be writable
using OptionalInput = std::optional<InputArray>;

struct UnsupportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void raise_if_error(const Status& status) {
  switch (status.code()) {
  case StatusCode::ok: return;
  case StatusCode::invalid_argument: throw nb::value_error(status.to_string().c_str());
  case StatusCode::unsupported: throw UnsupportedError(status.to_string());
  default: throw std::runtime_error(status.to_string());
  }
}

// Enums cross as their to_string names ("cpu", "index_topk", "bf16").
template <typename Enum, size_t N>
Enum parse_enum(std::string_view name, const Enum (&values)[N], const char* what) {
  std::string names;
  for (Enum value : values) {
    if (name == to_string(value)) return value;
    names += names.empty() ? "" : ", ";
    names += to_string(value);
  }
  throw nb::value_error(
      (std::string(what) + ": expected one of " + names + ", got '" + std::string(name) + "'")
          .c_str());
}
constexpr OpKind kOps[] = {OpKind::insert_index_k,     OpKind::score_blocks,
                           OpKind::select_topk_blocks, OpKind::index_topk,
                           OpKind::sparse_attention,   OpKind::norm_rope_insert};
constexpr Backend kBackends[] = {Backend::reference, Backend::cpu, Backend::cuda};
constexpr DType kDTypes[] = {DType::bf16, DType::fp8_e4m3, DType::f32, DType::i32, DType::i64};
OpKind parse_op(std::string_view name) { return parse_enum(name, kOps, "op"); }
Backend parse_backend(std::string_view name) { return parse_enum(name, kBackends, "backend"); }
DType parse_dtype(std::string_view name) { return parse_enum(name, kDTypes, "dtype"); }

// DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn); nanobind 2.9's dtype_code stops before it.
constexpr uint8_t kDLPackFloat8E4M3FN = 10;

// The explicit dtype mapping (README.md, "Python"): numpy has no bf16 or e4m3, so their bit
// patterns travel as uint16 / uint8; frameworks that have them (torch) pass them as they are.
DType to_dtype(nb::dlpack::dtype t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Float && t.bits == 32) return DType::f32;
    if (code == Code::Int && t.bits == 32) return DType::i32;
    if (code == Code::Int && t.bits == 64) return DType::i64;
    if ((code == Code::Bfloat || code == Code::UInt) && t.bits == 16) return DType::bf16;
    if ((t.code == kDLPackFloat8E4M3FN || code == Code::UInt) && t.bits == 8)
      return DType::fp8_e4m3;
  }
  throw nb::type_error((std::string(name) + ": dtype (DLPack code " + std::to_string(t.code) +
                        ", " + std::to_string(t.bits) + " bits) has no m3sa equivalent; expected "
                        "float32, int32, int64, bf16 (bfloat16 or uint16 bits) or fp8_e4m3 "
                        "(float8_e4m3fn or uint8 bits)")
                           .c_str());
}

Device to_device(int device_type, int device_id, const char* name) {
  if (device_type == nb::device::cpu::value) return Device{DeviceKind::cpu, 0};
  if (device_type == nb::device::cuda::value) return Device{DeviceKind::cuda, device_id};
  throw nb::value_error((std::string(name) + ": expected an array on the CPU or a CUDA device, " +
                         "got DLPack device type " + std::to_string(device_type))
                            .c_str());
}

template <typename Array> TensorView to_view(const Array& array, const char* name) {
  TensorView view;
  if (array.ndim() > static_cast<size_t>(TensorView::kMaxRank))
    throw nb::value_error((std::string(name) + ": expected at most " +
                           std::to_string(TensorView::kMaxRank) + " dimensions, got " +
                           std::to_string(array.ndim()))
                              .c_str());
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.dtype = to_dtype(array.dtype(), name);
  view.rank = static_cast<int>(array.ndim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = static_cast<int64_t>(array.shape(d));
    view.strides[d] = array.stride(d); // nanobind's strides are in elements, as TensorView's
  }
  view.device = to_device(array.device_type(), array.device_id(), name);
  return view;
}
TensorView to_view(const OptionalInput& array, const char* name) {
  return array ? to_view(*array, name) : TensorView{};
}

// BatchMetadata with the arrays it views kept alive.
struct Batch {
  InputArray cu_q_lens, seq_lens, block_table;
  int num_tokens = 0, num_decode_requests = 0, decode_q_len = 1;

  BatchMetadata view() const {
    BatchMetadata b;
    b.cu_q_lens = to_view(cu_q_lens, "batch.cu_q_lens");
    b.seq_lens = to_view(seq_lens, "batch.seq_lens");
    b.block_table = to_view(block_table, "batch.block_table");
    b.num_requests = seq_lens.ndim() == 1 ? static_cast<int>(seq_lens.shape(0)) : 0;
    b.num_decode_requests = num_decode_requests;
    b.decode_q_len = decode_q_len;
    b.num_tokens = num_tokens;
    return b;
  }
};

// vLLM's combined KV cache [pages, Hkv, 128, 2 x 128] (K then V in each token's row) as m3sa's K
// and V caches [pages, 128, Hkv, 128]: two strided views of the one array, no copy.
std::pair<TensorView, TensorView> split_combined_kv(const InputArray& kv_cache) {
  const TensorView kv = to_view(kv_cache, "kv_cache");
  if (kv.rank != 4 || kv.shape[2] != 128 || kv.shape[3] != 256)
    throw nb::value_error(("kv_cache: expected [num_blocks, num_kv_heads, 128, 256] (K then V "
                           "per row), got " +
                           kv.describe())
                              .c_str());
  TensorView k = kv;
  const int64_t shape[4] = {kv.shape[0], 128, kv.shape[1], 128};
  const int64_t strides[4] = {kv.strides[0], kv.strides[2], kv.strides[1], kv.strides[3]};
  std::copy(std::begin(shape), std::end(shape), k.shape);
  std::copy(std::begin(strides), std::end(strides), k.strides);
  TensorView v = k;
  v.data = static_cast<char*>(kv.data) +
           128 * kv.strides[3] * static_cast<int64_t>(dtype_size(kv.dtype));
  return {k, v};
}

// sparse_attention's arguments over vLLM's combined KV cache (split_combined_kv), without lse or a
// separate KV block table, as m3sa.vllm's attention functions pass them.
SparseAttentionArgs combined_kv_attention(const InputArray& q, const InputArray& kv_cache,
                                          const InputArray& topk, const BatchMetadata& batch,
                                          const OutputArray& out, float k_scale, float v_scale) {
  const auto [k_cache, v_cache] = split_combined_kv(kv_cache);
  return {to_view(q, "q"), k_cache, v_cache, k_scale, v_scale, to_view(topk, "topk"), batch,
          TensorView{},    to_view(out, "out"), TensorView{}};
}

// The tokens of a [tokens, heads, 128] array (0 for a scalar: the op then rejects its rank).
int leading_extent(const InputArray& array) {
  return array.ndim() > 0 ? static_cast<int>(array.shape(0)) : 0;
}

// The uniform decode batch of vLLM's decode ops: num_requests = len(seq_lens) requests of
// decode_q_len tokens, request-major (cu_q_lens: 0, q, 2 q, ...). The view borrows the arrays,
// which the caller's arguments keep alive.
BatchMetadata decode_batch(const InputArray& cu_q_lens, const InputArray& seq_lens,
                           const InputArray& block_table, int num_tokens, int decode_q_len) {
  const int num_requests = seq_lens.ndim() == 1 ? static_cast<int>(seq_lens.shape(0)) : 0;
  return Batch{cu_q_lens, seq_lens, block_table, num_tokens, num_requests, decode_q_len}.view();
}

Workspace to_workspace(const OpPlan& plan, const std::optional<OutputArray>& buffer) {
  if (!buffer) return {};
  const OutputArray& b = *buffer;
  const Device device = to_device(b.device_type(), b.device_id(), "workspace");
  const bool want_cuda = plan.request.backend == Backend::cuda;
  if ((device.kind == DeviceKind::cuda) != want_cuda)
    throw nb::value_error((std::string("workspace: expected memory on ") +
                           (want_cuda ? "the CUDA device" : "the CPU") + " for a " +
                           to_string(plan.request.backend) + " plan, got " + to_string(device.kind))
                              .c_str());
  int64_t expected_stride = 1;
  for (size_t d = b.ndim(); d-- > 0;) {
    if (b.shape(d) != 1 && b.stride(d) != expected_stride)
      throw nb::value_error("workspace: expected a contiguous buffer");
    expected_stride *= static_cast<int64_t>(b.shape(d));
  }
  // An empty buffer is no memory: its pointer (numpy's, or DLPack's of size 0) says nothing.
  if (b.nbytes() == 0) return {};
  return Workspace{b.data(), b.nbytes()};
}

// Every op's run: the workspace and context, the GIL released while m3sa works.
template <typename Args>
void run_op(Status (*op)(const OpPlan&, const Args&, Workspace, const ExecContext&),
            const OpPlan& plan, const Args& args, const std::optional<OutputArray>& workspace,
            int num_threads, uintptr_t stream) {
  const Workspace ws = to_workspace(plan, workspace);
  const ExecContext ctx{num_threads, reinterpret_cast<void*>(stream)};
  Status status;
  {
    nb::gil_scoped_release released;
    status = op(plan, args, ws, ctx);
  }
  raise_if_error(status);
}

std::string implementation_of(const OpPlan& plan) { return implementation_name(plan); }

// Host seconds of `iterations` calls of the op from C++ (arguments converted once, no
// synchronisation): what a call costs without Python, for bench/python_overhead.py.
template <typename Args>
double time_calls(Status (*op)(const OpPlan&, const Args&, Workspace, const ExecContext&),
                  const OpPlan& plan, const Args& args, const std::optional<OutputArray>& workspace,
                  uintptr_t stream, int iterations) {
  const Workspace ws = to_workspace(plan, workspace);
  const ExecContext ctx{0, reinterpret_cast<void*>(stream)};
  Status status;
  std::chrono::steady_clock::time_point start, end;
  {
    nb::gil_scoped_release released;
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations && status.ok(); ++i) status = op(plan, args, ws, ctx);
    end = std::chrono::steady_clock::now();
  }
  raise_if_error(status);
  return std::chrono::duration<double>(end - start).count();
}

} // namespace
} // namespace m3sa

NB_MODULE(_core, m) {
  using namespace m3sa;
  m.doc() = "m3sa's C++ library (use the m3sa package, which re-exports it)";
  nb::exception<UnsupportedError>(m, "UnsupportedError", PyExc_RuntimeError);

  m.def("version", [] { return std::string(version_string()); });
  m.def("build_commit", [] { return std::string(build_commit()); });
  m.def("cuda_backend_built", &cuda_backend_built);
  m.def("cuda_device_count", &cuda_device_count);

  nb::class_<MsaConfig>(m, "Config", "The MSA knobs (m3sa/config.h); keyword arguments only.")
      .def(
          "__init__",
          [](MsaConfig* self, int top_k, int local_blocks, int init_blocks, int num_index_heads,
             float score_scale, bool reduce_heads, float rms_norm_eps, float norm_weight_offset,
             double rope_theta) {
            new (self) MsaConfig{top_k,       local_blocks, init_blocks,
                                 num_index_heads, score_scale, reduce_heads,
                                 rms_norm_eps, norm_weight_offset, rope_theta};
          },
          nb::kw_only(), "top_k"_a = MsaConfig{}.top_k, "local_blocks"_a = MsaConfig{}.local_blocks,
          "init_blocks"_a = MsaConfig{}.init_blocks,
          "num_index_heads"_a = MsaConfig{}.num_index_heads,
          "score_scale"_a = MsaConfig{}.score_scale, "reduce_heads"_a = MsaConfig{}.reduce_heads,
          "rms_norm_eps"_a = MsaConfig{}.rms_norm_eps,
          "norm_weight_offset"_a = MsaConfig{}.norm_weight_offset,
          "rope_theta"_a = MsaConfig{}.rope_theta)
      .def_rw("top_k", &MsaConfig::top_k)
      .def_rw("local_blocks", &MsaConfig::local_blocks)
      .def_rw("init_blocks", &MsaConfig::init_blocks)
      .def_rw("num_index_heads", &MsaConfig::num_index_heads)
      .def_rw("score_scale", &MsaConfig::score_scale)
      .def_rw("reduce_heads", &MsaConfig::reduce_heads)
      .def_rw("rms_norm_eps", &MsaConfig::rms_norm_eps)
      .def_rw("norm_weight_offset", &MsaConfig::norm_weight_offset)
      .def_rw("rope_theta", &MsaConfig::rope_theta);

  nb::class_<Capacities>(m, "Capacities", "Upper bounds a plan is sized for (m3sa/batch.h).")
      .def(
          "__init__",
          [](Capacities* self, int64_t requests, int64_t tokens, int64_t blocks) {
            new (self) Capacities{requests, tokens, blocks};
          },
          "max_requests"_a, "max_tokens"_a, "max_blocks_per_request"_a)
      .def_rw("max_requests", &Capacities::max_requests)
      .def_rw("max_tokens", &Capacities::max_tokens)
      .def_rw("max_blocks_per_request", &Capacities::max_blocks_per_request);

  nb::class_<Batch>(m, "Batch",
                    "The varlen paged batch (m3sa/batch.h): num_requests is len(seq_lens).")
      .def(nb::init<InputArray, InputArray, InputArray, int, int, int>(),
           nb::sig("def __init__(self, cu_q_lens: Array, seq_lens: Array, block_table: Array, *, "
                   "num_tokens: int, num_decode_requests: int = 0, decode_q_len: int = 1) -> None"),
           "cu_q_lens"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_tokens"_a,
           "num_decode_requests"_a = 0, "decode_q_len"_a = 1)
      .def_ro("num_tokens", &Batch::num_tokens)
      .def_ro("num_decode_requests", &Batch::num_decode_requests)
      .def_ro("decode_q_len", &Batch::decode_q_len);

  nb::class_<OpPlan>(m, "Plan", "A planned op (m3sa::OpPlan): make it once, run it many times.")
      .def_prop_ro("op", [](const OpPlan& p) { return std::string(to_string(p.request.op)); })
      .def_prop_ro("backend",
                   [](const OpPlan& p) { return std::string(to_string(p.request.backend)); })
      .def_prop_ro("implementation", &implementation_of)
      .def_prop_ro("cache_dtype",
                   [](const OpPlan& p) { return std::string(to_string(p.request.cache_dtype)); })
      .def_prop_ro("config", [](const OpPlan& p) { return p.request.config; })
      .def_prop_ro("capacities", [](const OpPlan& p) { return p.request.capacities; })
      .def_ro("workspace_bytes", &OpPlan::workspace_bytes)
      .def_ro("num_threads", &OpPlan::num_threads)
      .def_ro("plan_info_version", &OpPlan::plan_info_version)
      .def_prop_ro("plan_info",
                   [](const OpPlan& p) {
                     return std::vector<int64_t>(std::begin(p.plan_info), std::end(p.plan_info));
                   })
      .def("__repr__", [](const OpPlan& p) {
        return "m3sa.Plan(" + implementation_of(p) + ", workspace_bytes=" +
               std::to_string(p.workspace_bytes) + ")";
      });

  m.def(
      "make_plan",
      [](std::string_view op, std::string_view backend, const MsaConfig& config,
         const Capacities& capacities, std::string_view cache_dtype, int num_threads,
         int device_ordinal, std::optional<std::string> implementation) {
        PlanRequest request{parse_op(op), parse_backend(backend), config, capacities,
                            parse_dtype(cache_dtype), num_threads, device_ordinal,
                            implementation ? implementation->c_str() : nullptr};
        OpPlan plan;
        raise_if_error(make_plan(request, &plan));
        return plan;
      },
      "op"_a, "backend"_a, "config"_a, "capacities"_a, "cache_dtype"_a = "bf16", nb::kw_only(),
      "num_threads"_a = 0, "device_ordinal"_a = 0, "implementation"_a = nb::none());

  m.def(
      "prepare_workspace",
      [](const OpPlan& plan, std::optional<OutputArray> workspace, uintptr_t stream) {
        raise_if_error(prepare_workspace(plan, to_workspace(plan, workspace),
                                         ExecContext{0, reinterpret_cast<void*>(stream)}));
      },
      nb::sig("def prepare_workspace(plan: Plan, workspace: Array | None, stream: int = 0) "
              "-> None"),
      "plan"_a, "workspace"_a.none(), "stream"_a = 0);

  // The device error flags a CUDA plan's runs left in this workspace (m3sa/ops.h: bits 1 page
  // id, 2 seq_len, 4 slot, 8 decode q_len, 16 position); reading clears them. Synchronises the
  // stream: not inside a CUDA graph capture. Host plans: always 0.
  m.def(
      "read_device_errors",
      [](const OpPlan& plan, std::optional<OutputArray> workspace, uintptr_t stream) {
        int32_t flags = 0;
        const Workspace ws = to_workspace(plan, workspace);
        Status status;
        {
          nb::gil_scoped_release released;
          status = read_device_errors(plan, ws, ExecContext{0, reinterpret_cast<void*>(stream)},
                                      &flags);
        }
        raise_if_error(status);
        return flags;
      },
      nb::sig("def read_device_errors(plan: Plan, workspace: Array | None, stream: int = 0) "
              "-> int"),
      "plan"_a, "workspace"_a.none(), "stream"_a = 0);

  m.def("implementations", [] {
    std::vector<nb::dict> list;
    for (int i = 0; i < implementation_count(); ++i) {
      const ImplementationInfo info = implementation_info(i);
      nb::dict entry;
      entry["name"] = info.name;
      entry["backend"] = to_string(info.backend);
      entry["op"] = to_string(info.op);
      entry["description"] = info.description;
      list.push_back(entry);
    }
    return list;
  });

  // "" when supported, else the library's reason.
  m.def(
      "unsupported_reason",
      [](std::string_view backend, std::optional<std::string_view> op, const MsaConfig& config,
         std::string_view cache_dtype) {
        const Backend b = parse_backend(backend);
        const DType dtype = parse_dtype(cache_dtype);
        const Status s =
            op ? supports(b, parse_op(*op), config, dtype) : supports(b, config, dtype);
        return s.ok() ? std::string() : s.to_string();
      },
      "backend"_a, "op"_a.none(), "config"_a, "cache_dtype"_a);

  // The C++ tests' tolerances (src/testing/compare.h), so that the Python tests cannot drift.
  m.def("testing_bounds", [] {
    nb::dict bounds;
    bounds["near_tie_relative"] = testing::kNearTieRelative;
    bounds["attention_relative_l2"] = testing::kAttentionRelativeL2;
    bounds["attention_lse"] = testing::kAttentionLse;
    bounds["gpu_attention_relative_l2"] = testing::kGpuAttentionRelativeL2;
    bounds["gpu_attention_lse"] = testing::kGpuAttentionLse;
    return bounds;
  });

  // The six ops: arrays named as in m3sa/ops.h's argument structs; then workspace, num_threads
  // (CPU), stream (CUDA, a cudaStream_t as an integer).
  m.def(
      "insert_index_k",
      [](const OpPlan& plan, InputArray index_k, InputArray slot_mapping, OutputArray index_k_cache,
         std::optional<OutputArray> workspace, int num_threads, uintptr_t stream) {
        InsertIndexKArgs args{to_view(index_k, "index_k"), to_view(slot_mapping, "slot_mapping"),
                              to_view(index_k_cache, "index_k_cache")};
        run_op(&insert_index_k, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def insert_index_k(plan: Plan, index_k: Array, slot_mapping: Array, "
              "index_k_cache: Array, *, workspace: Array | None = None, num_threads: int = 0, "
              "stream: int = 0) -> None"),
      "plan"_a, "index_k"_a, "slot_mapping"_a, "index_k_cache"_a, nb::kw_only(),
      "workspace"_a = nb::none(), "num_threads"_a = 0, "stream"_a = 0);

  m.def(
      "score_blocks",
      [](const OpPlan& plan, InputArray index_q, InputArray index_k_cache, const Batch& batch,
         OutputArray scores, std::optional<OutputArray> workspace, int num_threads,
         uintptr_t stream) {
        ScoreBlocksArgs args{to_view(index_q, "index_q"), to_view(index_k_cache, "index_k_cache"),
                             batch.view(), to_view(scores, "scores")};
        run_op(&score_blocks, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def score_blocks(plan: Plan, index_q: Array, index_k_cache: Array, batch: Batch, "
              "scores: Array, *, workspace: Array | None = None, num_threads: int = 0, "
              "stream: int = 0) -> None"),
      "plan"_a, "index_q"_a, "index_k_cache"_a, "batch"_a, "scores"_a, nb::kw_only(),
      "workspace"_a = nb::none(), "num_threads"_a = 0, "stream"_a = 0);

  m.def(
      "select_topk_blocks",
      [](const OpPlan& plan, InputArray scores, const Batch& batch, OutputArray topk,
         std::optional<OutputArray> workspace, int num_threads, uintptr_t stream) {
        SelectTopkBlocksArgs args{to_view(scores, "scores"), batch.view(), to_view(topk, "topk")};
        run_op(&select_topk_blocks, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def select_topk_blocks(plan: Plan, scores: Array, batch: Batch, topk: Array, *, "
              "workspace: Array | None = None, num_threads: int = 0, stream: int = 0) -> None"),
      "plan"_a, "scores"_a, "batch"_a, "topk"_a, nb::kw_only(), "workspace"_a = nb::none(),
      "num_threads"_a = 0, "stream"_a = 0);

  m.def(
      "index_topk",
      [](const OpPlan& plan, InputArray index_q, InputArray index_k_cache, const Batch& batch,
         OutputArray topk, std::optional<OutputArray> workspace, int num_threads,
         uintptr_t stream) {
        IndexTopkArgs args{to_view(index_q, "index_q"), to_view(index_k_cache, "index_k_cache"),
                           batch.view(), to_view(topk, "topk")};
        run_op(&index_topk, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def index_topk(plan: Plan, index_q: Array, index_k_cache: Array, batch: Batch, "
              "topk: Array, *, workspace: Array | None = None, num_threads: int = 0, "
              "stream: int = 0) -> None"),
      "plan"_a, "index_q"_a, "index_k_cache"_a, "batch"_a, "topk"_a, nb::kw_only(),
      "workspace"_a = nb::none(), "num_threads"_a = 0, "stream"_a = 0);

  m.def(
      "sparse_attention",
      [](const OpPlan& plan, InputArray q, InputArray k_cache, InputArray v_cache,
         InputArray topk, const Batch& batch, OutputArray out, std::optional<OutputArray> lse,
         OptionalInput kv_block_table, float k_scale, float v_scale,
         std::optional<OutputArray> workspace, int num_threads, uintptr_t stream) {
        SparseAttentionArgs args{to_view(q, "q"),
                                 to_view(k_cache, "k_cache"),
                                 to_view(v_cache, "v_cache"),
                                 k_scale,
                                 v_scale,
                                 to_view(topk, "topk"),
                                 batch.view(),
                                 to_view(kv_block_table, "kv_block_table"),
                                 to_view(out, "out"),
                                 lse ? to_view(*lse, "lse") : TensorView{}};
        run_op(&sparse_attention, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def sparse_attention(plan: Plan, q: Array, k_cache: Array, v_cache: Array, "
              "topk: Array, batch: Batch, out: Array, *, lse: Array | None = None, "
              "kv_block_table: Array | None = None, k_scale: float = 1.0, v_scale: float = 1.0, "
              "workspace: Array | None = None, num_threads: int = 0, stream: int = 0) -> None"),
      "plan"_a, "q"_a, "k_cache"_a, "v_cache"_a, "topk"_a, "batch"_a, "out"_a, nb::kw_only(),
      "lse"_a = nb::none(), "kv_block_table"_a = nb::none(), "k_scale"_a = 1.f,
      "v_scale"_a = 1.f, "workspace"_a = nb::none(), "num_threads"_a = 0, "stream"_a = 0);

  // m3sa.vllm's attention over vLLM's combined KV cache, split here (two torch views made in
  // Python cost ~5 us a call): the batch as a Batch (prefill and ragged decode calls).
  m.def(
      "vllm_sparse_attn",
      [](const OpPlan& plan, InputArray q, InputArray kv_cache, InputArray topk, const Batch& batch,
         OutputArray out, float k_scale, float v_scale, OutputArray workspace, uintptr_t stream) {
        run_op(&sparse_attention, plan,
               combined_kv_attention(q, kv_cache, topk, batch.view(), out, k_scale, v_scale),
               workspace, 0, stream);
      },
      nb::sig("def vllm_sparse_attn(plan: Plan, q: Array, kv_cache: Array, topk: Array, "
              "batch: Batch, out: Array, k_scale: float, v_scale: float, workspace: Array, "
              "stream: int, /) -> None"));
  // m3sa.vllm's hot path (an engine's eager decode step): vLLM's decode arguments in one call,
  // positional, the combined KV cache split and the batch built here - each torch view or Batch
  // made in Python costs microseconds (bench/python_overhead.py). Validation is the op's own; the
  // Python layer falls back to its checks, which name vLLM's arguments, when this raises.
  m.def(
      "vllm_index_decode",
      [](const OpPlan& plan, InputArray idx_q, InputArray index_kv_cache, InputArray block_table,
         InputArray seq_lens, InputArray cu_q_lens, OutputArray topk, int decode_q_len,
         OutputArray workspace, uintptr_t stream) {
        const IndexTopkArgs args{
            to_view(idx_q, "idx_q"), to_view(index_kv_cache, "index_kv_cache"),
            decode_batch(cu_q_lens, seq_lens, block_table, leading_extent(idx_q), decode_q_len),
            to_view(topk, "topk")};
        run_op(&index_topk, plan, args, workspace, 0, stream);
      },
      nb::sig("def vllm_index_decode(plan: Plan, idx_q: Array, index_kv_cache: Array, "
              "block_table: Array, seq_lens: Array, cu_q_lens: Array, topk: Array, "
              "decode_q_len: int, workspace: Array, stream: int, /) -> None"));
  m.def(
      "vllm_sparse_attn_decode",
      [](const OpPlan& plan, InputArray q, InputArray kv_cache, InputArray topk,
         InputArray block_table, InputArray seq_lens, InputArray cu_q_lens, OutputArray out,
         int decode_q_len, float k_scale, float v_scale, OutputArray workspace, uintptr_t stream) {
        const BatchMetadata batch =
            decode_batch(cu_q_lens, seq_lens, block_table, leading_extent(q), decode_q_len);
        run_op(&sparse_attention, plan,
               combined_kv_attention(q, kv_cache, topk, batch, out, k_scale, v_scale), workspace, 0,
               stream);
      },
      nb::sig("def vllm_sparse_attn_decode(plan: Plan, q: Array, kv_cache: Array, topk: Array, "
              "block_table: Array, seq_lens: Array, cu_q_lens: Array, out: Array, "
              "decode_q_len: int, k_scale: float, v_scale: float, workspace: Array, "
              "stream: int, /) -> None"));

  // The C++ loops of bench/python_overhead.py (time_calls above).
  m.def(
      "time_index_topk",
      [](const OpPlan& plan, InputArray index_q, InputArray index_k_cache, const Batch& batch,
         OutputArray topk, std::optional<OutputArray> workspace, uintptr_t stream, int iterations) {
        IndexTopkArgs args{to_view(index_q, "index_q"), to_view(index_k_cache, "index_k_cache"),
                           batch.view(), to_view(topk, "topk")};
        return time_calls(&index_topk, plan, args, workspace, stream, iterations);
      },
      nb::sig("def time_index_topk(plan: Plan, index_q: Array, index_k_cache: Array, batch: Batch, "
              "topk: Array, workspace: Array | None, stream: int, iterations: int) -> float"),
      "plan"_a, "index_q"_a, "index_k_cache"_a, "batch"_a, "topk"_a, "workspace"_a.none(),
      "stream"_a, "iterations"_a);
  m.def(
      "time_sparse_attention",
      [](const OpPlan& plan, InputArray q, InputArray k_cache, InputArray v_cache, InputArray topk,
         const Batch& batch, OutputArray out, std::optional<OutputArray> workspace, uintptr_t stream,
         int iterations) {
        SparseAttentionArgs args{to_view(q, "q"),          to_view(k_cache, "k_cache"),
                                 to_view(v_cache, "v_cache"), 1.f, 1.f, to_view(topk, "topk"),
                                 batch.view(),               TensorView{}, to_view(out, "out"),
                                 TensorView{}};
        return time_calls(&sparse_attention, plan, args, workspace, stream, iterations);
      },
      nb::sig("def time_sparse_attention(plan: Plan, q: Array, k_cache: Array, v_cache: Array, "
              "topk: Array, batch: Batch, out: Array, workspace: Array | None, stream: int, "
              "iterations: int) -> float"),
      "plan"_a, "q"_a, "k_cache"_a, "v_cache"_a, "topk"_a, "batch"_a, "out"_a, "workspace"_a.none(),
      "stream"_a, "iterations"_a);

  m.def(
      "norm_rope_insert",
      [](const OpPlan& plan, InputArray q, InputArray k, InputArray v, InputArray index_q,
         InputArray index_k, InputArray positions, InputArray q_norm_weight,
         InputArray k_norm_weight, InputArray index_q_norm_weight, InputArray index_k_norm_weight,
         InputArray slot_mapping, InputArray index_slot_mapping, OutputArray q_out,
         OutputArray k_cache, OutputArray v_cache, OutputArray index_q_out,
         OutputArray index_k_cache, OptionalInput cos_sin_cache, float k_scale, float v_scale,
         std::optional<OutputArray> workspace, int num_threads, uintptr_t stream) {
        NormRopeInsertArgs args;
        args.q = to_view(q, "q");
        args.k = to_view(k, "k");
        args.v = to_view(v, "v");
        args.index_q = to_view(index_q, "index_q");
        args.index_k = to_view(index_k, "index_k");
        args.positions = to_view(positions, "positions");
        args.q_norm_weight = to_view(q_norm_weight, "q_norm_weight");
        args.k_norm_weight = to_view(k_norm_weight, "k_norm_weight");
        args.index_q_norm_weight = to_view(index_q_norm_weight, "index_q_norm_weight");
        args.index_k_norm_weight = to_view(index_k_norm_weight, "index_k_norm_weight");
        args.cos_sin_cache = to_view(cos_sin_cache, "cos_sin_cache");
        args.slot_mapping = to_view(slot_mapping, "slot_mapping");
        args.index_slot_mapping = to_view(index_slot_mapping, "index_slot_mapping");
        args.q_out = to_view(q_out, "q_out");
        args.k_cache = to_view(k_cache, "k_cache");
        args.v_cache = to_view(v_cache, "v_cache");
        args.k_scale = k_scale;
        args.v_scale = v_scale;
        args.index_q_out = to_view(index_q_out, "index_q_out");
        args.index_k_cache = to_view(index_k_cache, "index_k_cache");
        run_op(&norm_rope_insert, plan, args, workspace, num_threads, stream);
      },
      nb::sig("def norm_rope_insert(plan: Plan, *, q: Array, k: Array, v: Array, index_q: Array, "
              "index_k: Array, positions: Array, q_norm_weight: Array, k_norm_weight: Array, "
              "index_q_norm_weight: Array, index_k_norm_weight: Array, slot_mapping: Array, "
              "index_slot_mapping: Array, q_out: Array, k_cache: Array, v_cache: Array, "
              "index_q_out: Array, index_k_cache: Array, cos_sin_cache: Array | None = None, "
              "k_scale: float = 1.0, v_scale: float = 1.0, workspace: Array | None = None, "
              "num_threads: int = 0, stream: int = 0) -> None"),
      "plan"_a, nb::kw_only(), "q"_a, "k"_a, "v"_a, "index_q"_a, "index_k"_a, "positions"_a,
      "q_norm_weight"_a, "k_norm_weight"_a, "index_q_norm_weight"_a, "index_k_norm_weight"_a,
      "slot_mapping"_a, "index_slot_mapping"_a, "q_out"_a, "k_cache"_a, "v_cache"_a,
      "index_q_out"_a, "index_k_cache"_a, "cos_sin_cache"_a = nb::none(), "k_scale"_a = 1.f,
      "v_scale"_a = 1.f, "workspace"_a = nb::none(), "num_threads"_a = 0, "stream"_a = 0);
}
