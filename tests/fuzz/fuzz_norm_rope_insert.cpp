// norm_rope_insert on the cpu backend against the reference: shapes, strides, dtypes (bf16 / f32
// gains and tables, bf16 / e4m3 caches), positions, slot mappings (shared, duplicate, out of
// range), in-place outputs, config (eps, offset, theta), KV scales, workspaces and plans from the
// input. Oracles (fuzz_support.h) plus, for an accepted call on finite data: every output element
// within one ulp of the reference's or 2^-12 where a rotation cancels (contract §7), and nothing
// but the outputs written.
#include <cmath>
#include <cstring>

#include "fuzz/fuzz_support.h"
#include "m3sa/numeric.h"

using namespace m3sa;
using namespace m3sa::fuzz;

namespace {

// Sign-magnitude code of a bf16 / e4m3 value: neighbours differ by one.
int64_t ordered(DType dtype, const void* p) {
  if (dtype == DType::bf16) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return (bits & 0x8000) ? -int64_t{bits & 0x7fff} : int64_t{bits & 0x7fff};
  }
  const uint8_t bits = *static_cast<const uint8_t*>(p);
  return (bits & 0x80) ? -int64_t{bits & 0x7f} : int64_t{bits & 0x7f};
}

double value(DType dtype, const void* p) {
  if (dtype == DType::bf16) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return bf16_bits_to_float(bits);
  }
  return e4m3_bits_to_float(*static_cast<const uint8_t*>(p));
}

void compare_within_one_ulp(const Arena& cpu, const Arena& reference, int id) {
  const TensorView a = cpu.view(id), b = reference.view(id);
  const int64_t elem = static_cast<int64_t>(dtype_size(a.dtype));
  if (std::memcmp(a.data, b.data, span_bytes(a)) == 0) return; // most cache rows are unwritten
  for_each_element(a, [&](int64_t offset) {
    const char* x = static_cast<const char*>(a.data) + offset * elem;
    const char* y = static_cast<const char*>(b.data) + offset * elem;
    if (std::memcmp(x, y, elem) == 0) return;
    const double got = value(a.dtype, x), want = value(a.dtype, y);
    const bool one_ulp = std::abs(ordered(a.dtype, x) - ordered(a.dtype, y)) <= 1;
    if (!one_ulp && !(std::abs(got - want) <= 1.0 / 4096))
      fail(std::string("norm_rope_insert: ") + cpu.name(id) + " " + std::to_string(got) +
           " vs reference " + std::to_string(want) + " at element offset " +
           std::to_string(offset));
  });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr OpKind kOp = OpKind::norm_rope_insert;
  Input in(data, size);
  const int tokens = in.pick(7);
  const int q_heads = 1 + in.pick(4), kv_heads = 1 + in.pick(2);
  const int kv_pages = 1 + in.pick(2), index_pages = 1 + in.pick(2);
  const DType kv_dtype = in.pick(2) ? DType::fp8_e4m3 : DType::bf16;
  const DType index_dtype = in.pick(2) ? DType::fp8_e4m3 : DType::bf16;
  RequestCase rc = RequestCase::draw(in, kOp, 1, tokens, 1, 2, index_dtype);
  MsaConfig& config = rc.request.config;
  static constexpr float kEps[] = {1e-6f, 0.f, 1e-2f};
  config.rms_norm_eps = kEps[in.pick(3)];
  config.norm_weight_offset = in.pick(2) ? 0.f : 1.f;
  config.rope_theta = in.pick(2) ? 1e4 : 5e6;
  std::vector<std::string> blamed;
  if (in.one_in(24)) {
    const float hostile[] = {NAN, INFINITY, -1.f, -0.f, 1.f};
    const float x = hostile[in.pick(5)];
    switch (in.pick(3)) {
    case 0:
      config.rms_norm_eps = x;
      break;
    case 1:
      config.norm_weight_offset = x;
      break;
    default:
      config.rope_theta = x;
    }
    blamed.push_back("*");
  }
  OpPlan plan;
  PlanEdit edit;
  if (!rc.plan(in, kOp, &plan, &edit)) return 0;
  const int index_heads = config.num_index_heads;

  Arena arena;
  const int q = arena.add(in, "q", DType::bf16, {tokens, q_heads, kHeadDim}, true);
  const int k = arena.add(in, "k", DType::bf16, {tokens, kv_heads, kHeadDim}, true);
  const int v = arena.add(in, "v", DType::bf16, {tokens, kv_heads, kHeadDim}, true);
  const int iq = arena.add(in, "index_q", DType::bf16, {tokens, index_heads, kHeadDim}, true);
  const int ik = arena.add(in, "index_k", DType::bf16, {tokens, kHeadDim}, true);
  const int positions = arena.add(in, "positions", DType::i64, {tokens}, false);
  const char* weight_names[] = {"q_norm_weight", "k_norm_weight", "index_q_norm_weight",
                                "index_k_norm_weight"};
  int weights[4];
  for (int i = 0; i < 4; ++i)
    weights[i] = arena.add(in, weight_names[i], in.pick(2) ? DType::f32 : DType::bf16, {kHeadDim}, true);
  const int table_rows = in.pick(2) ? 1 + in.pick(16) : 0;
  const int table = table_rows > 0 ? arena.add(in, "cos_sin_cache", in.pick(2) ? DType::f32 : DType::bf16,
                                               {table_rows, kRotaryDim}, true)
                                   : arena.add_absent("cos_sin_cache");
  const int slots = arena.add(in, "slot_mapping", DType::i64, {tokens}, false);
  const bool shared_slots = in.one_in(3);
  const int index_slots =
      shared_slots ? slots : arena.add(in, "index_slot_mapping", DType::i64, {tokens}, false);
  const bool in_place_q = in.one_in(3);
  const bool in_place_iq = index_dtype == DType::bf16 && in.one_in(3);
  const int q_out = in_place_q ? q : arena.add(in, "q_out", DType::bf16, {tokens, q_heads, kHeadDim}, true);
  const int k_cache = arena.add(in, "k_cache", kv_dtype, {kv_pages, kBlockTokens, kv_heads, kHeadDim}, true);
  const int v_cache = arena.add(in, "v_cache", kv_dtype, {kv_pages, kBlockTokens, kv_heads, kHeadDim}, true);
  const int iq_out = in_place_iq ? iq : arena.add(in, "index_q_out", index_dtype, {tokens, index_heads, kHeadDim}, true);
  const int index_cache = arena.add(in, "index_k_cache", index_dtype, {index_pages, kBlockTokens, kHeadDim}, true);
  const WorkspaceBuffer workspace(in, plan.workspace_bytes, &arena);
  arena.allocate(static_cast<uint8_t>(in.pick(256)));

  Rng rng(in.seed());
  const ValueMode mode = ValueMode::from(in, true);
  for (int id : {q, k, v, iq, ik, weights[0], weights[1], weights[2], weights[3]})
    arena.fill(id, rng, mode);
  if (table_rows > 0) {
    ValueMode unit; // cos / sin-like values in [-1, 1]
    unit.magnitude = 4;
    unit.scale = 0.25f;
    arena.fill(table, rng, unit);
  }
  const int64_t max_position = table_rows > 0 ? table_rows : kMaxRopePosition;
  const bool small_positions = in.pick(2);
  for (int t = 0; t < tokens; ++t)
    arena.set_int(positions, t,
                  static_cast<int64_t>(rng.next() % (small_positions ? std::min<int64_t>(max_position, 4096)
                                                                     : max_position)));
  // Distinct slots (or -1) for each cache.
  const auto write_slots = [&](int id, int pages) {
    std::vector<int64_t> used;
    for (int t = 0; t < tokens; ++t) {
      int64_t slot = rng.next() % 5 == 0 ? -1 : static_cast<int64_t>(rng.next() % (pages * kBlockTokens));
      while (slot >= 0 && std::find(used.begin(), used.end(), slot) != used.end())
        slot = (slot + 1) % (pages * kBlockTokens);
      if (slot >= 0) used.push_back(slot);
      arena.set_int(id, t, slot);
    }
  };
  write_slots(slots, shared_slots ? std::min(kv_pages, index_pages) : kv_pages);
  if (!shared_slots) write_slots(index_slots, index_pages);
  for (const auto& [id, name] : {std::pair{positions, "positions"}, std::pair{slots, "slot_mapping"},
                                 std::pair{index_slots, "index_slot_mapping"}})
    while (in.one_in(10)) {
      const int64_t values[] = {-1, max_position, 2 * kBlockTokens, 0, INT64_MAX, INT64_MIN,
                                in.raw64()};
      arena.set_int(id, in.pick(std::max(tokens, 1)), values[in.pick(7)]);
      blamed.push_back(shared_slots && id == slots ? "*" : name);
    }
  const KvScales scales = draw_kv_scales(in, &blamed);
  for (const std::string& m : arena.mutated()) blamed.push_back(m);
  const ExecContext ctx = draw_context(in, workspace, edit, rc, &blamed);

  const auto args = [&](const Arena& a) {
    NormRopeInsertArgs x;
    x.q = a.view(q);
    x.k = a.view(k);
    x.v = a.view(v);
    x.index_q = a.view(iq);
    x.index_k = a.view(ik);
    x.positions = a.view(positions);
    x.q_norm_weight = a.view(weights[0]);
    x.k_norm_weight = a.view(weights[1]);
    x.index_q_norm_weight = a.view(weights[2]);
    x.index_k_norm_weight = a.view(weights[3]);
    x.cos_sin_cache = a.view(table);
    x.slot_mapping = a.view(slots);
    x.index_slot_mapping = a.view(index_slots);
    x.q_out = a.view(q_out);
    x.k_cache = a.view(k_cache);
    x.v_cache = a.view(v_cache);
    x.k_scale = scales.k;
    x.v_scale = scales.v;
    x.index_q_out = a.view(iq_out);
    x.index_k_cache = a.view(index_cache);
    return x;
  };
  Arena reference = arena.clone();
  const Arena::Snapshot before = arena.snapshot();
  const std::vector<uint8_t> workspace_before = workspace.snapshot(arena);
  const Status status = norm_rope_insert(plan, args(arena), workspace.get(arena), ctx);
  if (!check_outcome(status, kOp,
                     {"q", "k", "v", "index_q", "index_k", "positions", "q_norm_weight",
                      "k_norm_weight", "index_q_norm_weight", "index_k_norm_weight",
                      "cos_sin_cache", "slot_mapping", "index_slot_mapping", "q_out", "k_cache",
                      "v_cache", "index_q_out", "index_k_cache", "k_scale", "v_scale",
                      "config.rms_norm_eps", "config.norm_weight_offset", "config.rope_theta",
                      "workspace.bytes", "workspace.data", "plan", "ctx.num_threads"},
                     blamed.empty(), blamed, arena, before, workspace, workspace_before))
    return 0;
  check_only_outputs_written(arena, before, {q_out, k_cache, v_cache, iq_out, index_cache},
                             workspace.arena_id(), kOp);

  const ReferencePlan ref(rc.request);
  const Status ref_status = norm_rope_insert(ref.plan, args(reference), ref.workspace);
  M3SA_FUZZ_CHECK(ref_status.ok(),
                  "the reference accepts what the cpu accepted: " + ref_status.to_string());
  check_same_bytes(arena, reference, {workspace.arena_id(), q_out, k_cache, v_cache, iq_out, index_cache},
                   kOp);
  // With NaN, inf or 2^100 in the data, fp32 and double part ways legitimately (overflowing
  // sums of squares): only the absence of sanitizer reports and stray writes is checked then.
  // Inputs the input overlapped carry each other's bytes (an i64 position read as bf16 is 2^75),
  // so the same holds for any broken layout.
  if (mode.has_specials() || !arena.mutated().empty()) return 0;
  for (int id : {q_out, k_cache, v_cache, iq_out, index_cache})
    compare_within_one_ulp(arena, reference, id);
  return 0;
}
