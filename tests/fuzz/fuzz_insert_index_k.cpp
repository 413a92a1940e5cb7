// insert_index_k on the cpu backend against the reference: shapes, strides, dtypes, slot
// mappings (duplicates, out of range, padding), workspaces and plans from the input.
// Oracles (fuzz_support.h): a rejection names an argument and writes nothing; an accepted call
// writes only the cache, and exactly the bytes the reference writes (one rounding, no tolerance).
#include "fuzz/fuzz_support.h"

using namespace m3sa;
using namespace m3sa::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr OpKind kOp = OpKind::insert_index_k;
  Input in(data, size);
  const int tokens = in.pick(9);
  const int pages = 1 + in.pick(3);
  const DType cache_dtype = in.pick(2) ? DType::fp8_e4m3 : DType::bf16;
  const DType k_dtype = in.pick(2) ? DType::f32 : DType::bf16;
  const RequestCase rc = RequestCase::draw(in, kOp, 1, tokens, 1, 4, cache_dtype);
  OpPlan plan;
  PlanEdit edit;
  if (!rc.plan(in, kOp, &plan, &edit)) return 0;

  Arena arena;
  const int k = arena.add(in, "index_k", k_dtype, {tokens, kHeadDim}, true);
  const int slots = arena.add(in, "slot_mapping", DType::i64, {tokens}, false);
  const int cache = arena.add(in, "index_k_cache", cache_dtype, {pages, kBlockTokens, kHeadDim}, true);
  const WorkspaceBuffer workspace(in, plan.workspace_bytes, &arena);
  arena.allocate(static_cast<uint8_t>(in.pick(256)));
  Rng rng(in.seed());
  arena.fill(k, rng, ValueMode::from(in, true));
  // Distinct slots below pages x 128, some -1 (padding); then the input's corruptions.
  std::vector<int64_t> used;
  for (int t = 0; t < tokens; ++t) {
    int64_t slot = in.one_in(5) ? -1 : static_cast<int64_t>(rng.next() % (pages * kBlockTokens));
    while (slot >= 0 && std::find(used.begin(), used.end(), slot) != used.end())
      slot = (slot + 1) % (pages * kBlockTokens);
    if (slot >= 0) used.push_back(slot);
    arena.set_int(slots, t, slot);
  }
  std::vector<std::string> blamed = arena.mutated();
  while (in.one_in(6)) {
    const int t = in.pick(std::max(tokens, 1));
    const int64_t values[] = {pages * int64_t{kBlockTokens}, used.empty() ? 0 : used[0],
                              INT64_MAX, INT64_MIN, in.raw64()};
    arena.set_int(slots, t, values[in.pick(5)]);
    blamed.push_back("slot_mapping");
  }
  const ExecContext ctx = draw_context(in, workspace, edit, rc, &blamed);

  const InsertIndexKArgs args{arena.view(k), arena.view(slots), arena.view(cache)};
  Arena reference = arena.clone();
  const Arena::Snapshot before = arena.snapshot();
  const std::vector<uint8_t> workspace_before = workspace.snapshot(arena);
  const Status status = insert_index_k(plan, args, workspace.get(arena), ctx);
  if (!check_outcome(status, kOp,
                     {"index_k", "slot_mapping", "index_k_cache", "workspace.bytes",
                      "workspace.data", "plan", "ctx.num_threads"},
                     blamed.empty(), blamed, arena, before, workspace, workspace_before))
    return 0;
  check_only_outputs_written(arena, before, {cache}, workspace.arena_id(), kOp);

  const ReferencePlan ref(rc.request);
  const InsertIndexKArgs ref_args{reference.view(k), reference.view(slots), reference.view(cache)};
  const Status ref_status = insert_index_k(ref.plan, ref_args, ref.workspace);
  M3SA_FUZZ_CHECK(ref_status.ok(), "the reference accepts what the cpu accepted: " +
                                       ref_status.to_string());
  check_same_bytes(arena, reference, {workspace.arena_id()}, kOp);
  return 0;
}
