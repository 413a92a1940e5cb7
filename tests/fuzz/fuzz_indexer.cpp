// The indexer ops (score_blocks, select_topk_blocks, index_topk) on the cpu backend against the
// reference: batch metadata (bad page ids, seq_lens, cu_q_lens, scalars), shapes, strides,
// dtypes, workspaces and plans from the input; scores and index data with NaN, +-inf and -0.
// Oracles (fuzz_support.h) plus, for an accepted call: the cpu's scores equal the reference's
// (index data are small integers, so fp32 and double sums are exact) and its selections are
// identical to the reference's and valid contract rows (§5).
#include <cmath>
#include <cstring>

#include "fuzz/fuzz_support.h"
#include "testing/compare.h"

using namespace m3sa;
using namespace m3sa::fuzz;

namespace {

void check_scores_equal(const Arena& cpu, const Arena& reference, int id) {
  const TensorView a = cpu.view(id), b = reference.view(id);
  for_each_element(a, [&](int64_t offset) {
    float x, y;
    std::memcpy(&x, static_cast<const float*>(a.data) + offset, 4);
    std::memcpy(&y, static_cast<const float*>(b.data) + offset, 4);
    if (!(x == y || (std::isnan(x) && std::isnan(y))))
      fail("score_blocks: cpu score " + std::to_string(x) + " != reference " + std::to_string(y) +
           " at element offset " + std::to_string(offset));
  });
}

// Every live row of the cpu's top-k is a contract row for its token's position.
void check_rows_valid(const Arena& cpu, int id, const BatchCase& b, const MsaConfig& config) {
  const TensorView topk = cpu.view(id);
  testing::SelectionRules rules;
  rules.local_blocks = config.local_blocks;
  rules.init_blocks = config.init_blocks;
  for (int64_t h = 0; h < topk.shape[0]; ++h)
    for (int64_t t = 0; t < topk.shape[1]; ++t) {
      std::vector<int32_t> row(topk.shape[2]);
      for (int64_t k = 0; k < topk.shape[2]; ++k)
        std::memcpy(&row[k], topk.ptr<const int32_t>() + topk.offset({h, t, k}), 4);
      const std::string why = testing::selection_row_error(row, b.positions[t], rules);
      if (!why.empty())
        fail("invalid selection row for head " + std::to_string(h) + " token " +
             std::to_string(t) + ": " + why);
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  static constexpr OpKind kOps[] = {OpKind::index_topk, OpKind::score_blocks,
                                    OpKind::select_topk_blocks};
  const OpKind op = kOps[in.pick(3)];
  BatchCase b = BatchCase::draw(in, 5, 4);
  const DType cache_dtype = in.pick(2) ? DType::fp8_e4m3 : DType::bf16;
  const RequestCase rc =
      RequestCase::draw(in, op, b.num_requests, b.num_tokens, b.width, 4, cache_dtype);
  OpPlan plan;
  PlanEdit edit;
  if (!rc.plan(in, op, &plan, &edit)) return 0;
  const MsaConfig& config = rc.request.config;
  const int heads = config.num_index_heads, tokens = b.num_tokens;

  Arena arena;
  b.add_tensors(in, &arena);
  int q = -1, cache = -1, scores = -1, topk = -1;
  if (op != OpKind::select_topk_blocks) {
    cache = arena.add(in, "index_k_cache", cache_dtype, {b.num_pages, kBlockTokens, kHeadDim}, true);
    q = arena.add(in, "index_q", cache_dtype, {tokens, heads, kHeadDim}, true);
  }
  if (op != OpKind::index_topk)
    scores = arena.add(in, "scores", DType::f32, {heads, tokens, b.width + in.pick(3)}, false);
  if (op != OpKind::score_blocks)
    topk = arena.add(in, "topk", DType::i32, {heads, tokens, config.top_k}, false);
  const WorkspaceBuffer workspace(in, plan.workspace_bytes, &arena);
  arena.allocate(static_cast<uint8_t>(in.pick(256)));
  Rng rng(in.seed());
  ValueMode mode = ValueMode::from(in, true);
  mode.allow_huge = false; // fp32 products of 2^100 overflow where double ones do not
  if (q >= 0) {
    arena.fill(cache, rng, mode);
    arena.fill(q, rng, mode);
  }
  if (op == OpKind::select_topk_blocks) arena.fill(scores, rng, ValueMode::from(in, true));
  b.write(in, &arena);

  std::vector<std::string> blamed = arena.mutated();
  if (b.corrupted) blamed.push_back("*");
  const ExecContext ctx = draw_context(in, workspace, edit, rc, &blamed);

  const auto run = [&](const OpPlan& p, const Arena& a, Workspace ws, const ExecContext& c) {
    const BatchMetadata batch = b.metadata(a);
    switch (op) {
    case OpKind::score_blocks:
      return score_blocks(p, {a.view(q), a.view(cache), batch, a.view(scores)}, ws, c);
    case OpKind::select_topk_blocks:
      return select_topk_blocks(p, {a.view(scores), batch, a.view(topk)}, ws, c);
    default:
      return index_topk(p, {a.view(q), a.view(cache), batch, a.view(topk)}, ws, c);
    }
  };
  Arena reference = arena.clone();
  const Arena::Snapshot before = arena.snapshot();
  const std::vector<uint8_t> workspace_before = workspace.snapshot(arena);
  const Status status = run(plan, arena, workspace.get(arena), ctx);
  if (!check_outcome(status, op,
                     {"index_q", "index_k_cache", "scores", "topk", "batch.cu_q_lens",
                      "batch.seq_lens", "batch.block_table", "batch.num_requests",
                      "batch.num_decode_requests", "batch.decode_q_len", "batch.num_tokens",
                      "workspace.bytes", "workspace.data", "plan", "ctx.num_threads"},
                     blamed.empty(), blamed, arena, before, workspace, workspace_before))
    return 0;
  const int output = op == OpKind::score_blocks ? scores : topk;
  check_only_outputs_written(arena, before, {output}, workspace.arena_id(), op);

  const ReferencePlan ref(rc.request);
  const Status ref_status = run(ref.plan, reference, ref.workspace, {});
  M3SA_FUZZ_CHECK(ref_status.ok(),
                  "the reference accepts what the cpu accepted: " + ref_status.to_string());
  // Scores are exact on the small integers the harness writes; overlapping inputs carry each
  // other's bytes (metadata read as bf16 can be 2^100, whose fp32 products overflow where double
  // ones do not), so the scoring ops are compared only on unbroken layouts. Selection is a pure
  // function of its scores: always identical.
  const bool exact_data = arena.mutated().empty();
  if (op == OpKind::score_blocks) {
    if (exact_data) check_scores_equal(arena, reference, scores);
    check_same_bytes(arena, reference, {workspace.arena_id(), scores}, op);
  } else {
    check_same_bytes(arena, reference, {workspace.arena_id(), op == OpKind::index_topk && !exact_data ? topk : -1}, op);
    if (!b.corrupted && exact_data) check_rows_valid(arena, topk, b, config);
  }
  return 0;
}
