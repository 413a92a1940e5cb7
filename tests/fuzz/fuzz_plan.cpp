// make_plan, prepare_workspace and read_device_errors with requests from the input: raw enum
// values, config fields, capacities, thread counts and implementation names (real, empty,
// unknown), then plans edited after make_plan. Oracles:
//   - make_plan either fails naming a request field with the op's prefix (or `unsupported`), or
//     gives a plan of an implementation of the request's op (and backend, unless named), the
//     same plan again for the same request, and a workspace size prepare_workspace accepts;
//   - prepare_workspace rejects a workspace one byte short, null or misaligned, naming it;
//   - an edited plan is rejected as `plan` by prepare_workspace, read_device_errors and its op.
#include <chrono>
#include <cstring>

#include "fuzz/fuzz_support.h"

using namespace m3sa;
using namespace m3sa::fuzz;

namespace {

constexpr size_t kMaxPreparedBytes = size_t{64} << 20;

Status run_with_empty_args(const OpPlan& plan, OpKind op) {
  switch (op) {
  case OpKind::insert_index_k:
    return insert_index_k(plan, {}, {});
  case OpKind::score_blocks:
    return score_blocks(plan, {}, {});
  case OpKind::select_topk_blocks:
    return select_topk_blocks(plan, {}, {});
  case OpKind::index_topk:
    return index_topk(plan, {}, {});
  case OpKind::sparse_attention:
    return sparse_attention(plan, {}, {});
  default:
    return norm_rope_insert(plan, {}, {});
  }
}

bool same_plan(const OpPlan& a, const OpPlan& b) {
  return a.implementation == b.implementation && a.num_threads == b.num_threads &&
         a.workspace_bytes == b.workspace_bytes && a.plan_info_version == b.plan_info_version &&
         std::memcmp(a.plan_info, b.plan_info, sizeof a.plan_info) == 0;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  PlanRequest r;
  r.op = static_cast<OpKind>(in.one_in(16) ? in.pick(256) : in.pick(6));
  r.backend = static_cast<Backend>(in.one_in(16) ? in.pick(256) : in.pick(2));
  MsaConfig& c = r.config;
  const auto maybe_hostile = [&](int valid) {
    return in.one_in(8) ? static_cast<int>(in.hostile_int()) : valid;
  };
  c.top_k = maybe_hostile(1 + in.pick(32));
  c.local_blocks = maybe_hostile(in.pick(3));
  c.init_blocks = maybe_hostile(in.pick(3));
  c.num_index_heads = maybe_hostile(1 + in.pick(16));
  if (in.one_in(8)) c.score_scale = in.raw_float();
  c.reduce_heads = in.pick(2);
  const auto capacity = [&]() -> int64_t {
    static constexpr int64_t kValues[] = {1, 7, 128, 8192, 1 << 20, (1 << 20) + 1,
                                          INT32_MAX, int64_t{INT32_MAX} + 1, 0, -1, INT64_MAX};
    return in.one_in(4) ? in.raw64() : kValues[in.pick(11)];
  };
  r.capacities = {capacity(), capacity(), capacity()};
  r.cache_dtype = static_cast<DType>(in.one_in(8) ? in.pick(256) : in.pick(2));
  r.num_threads = maybe_hostile(in.pick(5));
  std::string name;
  switch (in.pick(4)) {
  case 1:
    name = "";
    r.implementation = "";
    break;
  case 2:
    name = implementation_info(in.pick(implementation_count())).name;
    r.implementation = name.c_str();
    break;
  case 3:
    name = "cpu.nothing_" + std::to_string(in.pick(100));
    r.implementation = name.c_str();
    break;
  default:
    break;
  }

  OpPlan plan;
  const auto start = std::chrono::steady_clock::now();
  const Status status = make_plan(r, &plan);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  M3SA_FUZZ_CHECK(seconds < 1.0, "make_plan is quick: " + std::to_string(seconds) + " s");
  const Status null_plan = make_plan(r, nullptr);
  M3SA_FUZZ_CHECK(argument_of(null_plan, r.op) == "plan", "make_plan(nullptr): " + null_plan.message());
  if (!status.ok()) {
    check_plan_rejection(status, r.op);
    return 0;
  }
  // The plan names an implementation of the request's op; of its backend unless named.
  M3SA_FUZZ_CHECK(plan.implementation >= 0 && plan.implementation < implementation_count(),
                  "a planned implementation index");
  const ImplementationInfo info = implementation_info(plan.implementation);
  M3SA_FUZZ_CHECK(info.op == r.op, "the plan's implementation runs the request's op");
  const bool named = r.implementation != nullptr && r.implementation[0] != '\0';
  M3SA_FUZZ_CHECK(named ? name == info.name : info.backend == r.backend,
                  std::string("the implementation asked for: ") + info.name);
  M3SA_FUZZ_CHECK(plan.request.backend == info.backend, "the plan's backend is its implementation's");
  M3SA_FUZZ_CHECK(std::string(implementation_name(plan)) == info.name, "implementation_name");
  M3SA_FUZZ_CHECK(plan.num_threads >= 1 && plan.num_threads <= 1024, "1..1024 threads");
  OpPlan again;
  M3SA_FUZZ_CHECK(make_plan(r, &again).ok() && same_plan(plan, again), "a plan is a function of its request");

  if (plan.workspace_bytes <= kMaxPreparedBytes) {
    std::vector<uint8_t> storage(plan.workspace_bytes + 64);
    uint8_t* aligned = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    const Workspace exact{aligned, plan.workspace_bytes};
    const Status prepared = prepare_workspace(plan, exact);
    M3SA_FUZZ_CHECK(prepared.ok(), "the planned workspace is accepted: " + prepared.to_string());
    int32_t flags = -1;
    const Status read = read_device_errors(plan, exact, {}, &flags);
    M3SA_FUZZ_CHECK(read.ok() && flags == 0, "host backends report no device errors");
    if (plan.workspace_bytes > 0) {
      const Status small = prepare_workspace(plan, {aligned, plan.workspace_bytes - 1});
      M3SA_FUZZ_CHECK(argument_of(small, r.op) == "workspace.bytes", small.message());
      const Status null = prepare_workspace(plan, {nullptr, plan.workspace_bytes});
      M3SA_FUZZ_CHECK(argument_of(null, r.op) == "workspace.data", null.message());
      const Status misaligned =
          prepare_workspace(plan, {aligned + 1 + in.pick(63), plan.workspace_bytes});
      M3SA_FUZZ_CHECK(argument_of(misaligned, r.op) == "workspace.data", misaligned.message());
    }
  }

  OpPlan edited = plan;
  const PlanEdit edit = PlanEdit::apply(in, &edited);
  if (edit.edited.empty()) return 0;
  std::vector<uint8_t> storage(std::min(edited.workspace_bytes, kMaxPreparedBytes) + 64);
  uint8_t* aligned = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  const Status prepared = prepare_workspace(edited, {aligned, std::min(edited.workspace_bytes, kMaxPreparedBytes)});
  // The message names the op the (edited) plan claims.
  M3SA_FUZZ_CHECK(argument_of(prepared, edited.request.op) == "plan",
                  "prepare_workspace rejects a plan edited at " + edit.edited + ": " + prepared.to_string());
  int32_t flags = 0;
  const Status read = read_device_errors(edited, {aligned, 0}, {}, &flags);
  M3SA_FUZZ_CHECK(argument_of(read, edited.request.op) == "plan",
                  "read_device_errors rejects a plan edited at " + edit.edited + ": " + read.to_string());
  const Status run = run_with_empty_args(edited, r.op);
  M3SA_FUZZ_CHECK(argument_of(run, r.op) == "plan",
                  "the op rejects a plan edited at " + edit.edited + ": " + run.to_string());
  return 0;
}
