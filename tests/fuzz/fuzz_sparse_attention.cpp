// sparse_attention on the cpu backend against the reference: batch metadata, an optional KV
// block table, selections (valid contract rows, or broken ones), KV scales, shapes, strides,
// dtypes, workspaces and plans from the input. Oracles (fuzz_support.h) plus, for an accepted
// call: out and lse agree with the reference (non-finite values exactly; finite outputs within one
// bf16 ulp plus 1e-4 x max|v|, lse within 1e-4: q and k are bounded so that logits stay below 23
// and fp32 against double differs far less) and nothing but out and lse was written.
#include <cmath>
#include <cstring>

#include "fuzz/fuzz_support.h"
#include "m3sa/numeric.h"

using namespace m3sa;
using namespace m3sa::fuzz;

namespace {

bool same_class(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return true;
}

void compare_outputs(const Arena& cpu, const Arena& reference, int out, int lse, double v_max) {
  const TensorView a = cpu.view(out), b = reference.view(out);
  for_each_element(a, [&](int64_t offset) {
    const double got = bf16_bits_to_float(a.ptr<const uint16_t>()[offset]);
    const double want = bf16_bits_to_float(b.ptr<const uint16_t>()[offset]);
    if (!same_class(got, want) ||
        (std::isfinite(want) &&
         std::abs(got - want) >
             std::ldexp(1.0, std::ilogb(std::max(std::abs(want), 1e-30)) - 7) + 1e-4 * v_max))
      fail("sparse_attention: out " + std::to_string(got) + " vs reference " +
           std::to_string(want) + " at element offset " + std::to_string(offset));
  });
  if (!cpu.view(lse).present()) return;
  const TensorView c = cpu.view(lse), d = reference.view(lse);
  for_each_element(c, [&](int64_t offset) {
    const double got = c.ptr<const float>()[offset], want = d.ptr<const float>()[offset];
    if (!same_class(got, want) || (std::isfinite(want) && std::abs(got - want) > 1e-4))
      fail("sparse_attention: lse " + std::to_string(got) + " vs reference " +
           std::to_string(want) + " at element offset " + std::to_string(offset));
  });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr OpKind kOp = OpKind::sparse_attention;
  Input in(data, size);
  BatchCase b = BatchCase::draw(in, 4, 3);
  const DType kv_dtype = in.pick(2) ? DType::fp8_e4m3 : DType::bf16;
  const RequestCase rc = RequestCase::draw(in, kOp, b.num_requests, b.num_tokens, b.width, 2, kv_dtype);
  OpPlan plan;
  PlanEdit edit;
  if (!rc.plan(in, kOp, &plan, &edit)) return 0;
  const MsaConfig& config = rc.request.config;
  const int kv_heads = config.num_index_heads, group = 1 + in.pick(3);
  const int tokens = b.num_tokens, top_k = config.top_k;
  const bool separate_table = in.pick(2);
  const int kv_pages = separate_table ? 1 + in.pick(3) : b.num_pages;
  const int kv_width = b.width + (separate_table ? in.pick(2) : 0);

  Arena arena;
  b.add_tensors(in, &arena);
  const int q = arena.add(in, "q", DType::bf16, {tokens, kv_heads * group, kHeadDim}, true);
  const int k = arena.add(in, "k_cache", kv_dtype, {kv_pages, kBlockTokens, kv_heads, kHeadDim}, true);
  const int v = arena.add(in, "v_cache", kv_dtype, {kv_pages, kBlockTokens, kv_heads, kHeadDim}, true);
  const int topk = arena.add(in, "topk", DType::i32, {kv_heads, tokens, top_k}, false);
  const int table = separate_table
                        ? arena.add(in, "kv_block_table", DType::i32, {b.num_requests, kv_width}, false)
                        : arena.add_absent("kv_block_table");
  const int out = arena.add(in, "out", DType::bf16, {tokens, kv_heads * group, kHeadDim}, true);
  const int lse = in.pick(3) ? arena.add(in, "lse", DType::f32, {tokens, kv_heads * group}, false)
                             : arena.add_absent("lse");
  const WorkspaceBuffer workspace(in, plan.workspace_bytes, &arena);
  arena.allocate(static_cast<uint8_t>(in.pick(256)));
  Rng rng(in.seed());
  // Bounded data (|q|, |k|, |v| <= 1, k_scale <= 2: logits below 256 / sqrt(128)); NaN is the only special value
  // (an infinite logit or value meets fp32-vs-double underflow differences, not defects).
  ValueMode mode = ValueMode::from(in, true, 2);
  mode.scale = 1.f / static_cast<float>(mode.magnitude);
  mode.allow_huge = mode.allow_infinity = false;
  arena.fill(q, rng, mode);
  arena.fill(k, rng, mode);
  arena.fill(v, rng, mode);
  const double v_max = mode.magnitude * mode.scale;
  std::vector<std::string> blamed = arena.mutated();
  // Selections: for each (head, token) an ascending subset of its causal blocks, then -1.
  for (int g = 0; g < kv_heads; ++g)
    for (int t = 0; t < tokens; ++t) {
      const int64_t n = b.positions[t] < 0 ? 0 : b.positions[t] / kBlockTokens + 1;
      int slot = 0;
      for (int64_t block = 0; block < n && slot < top_k; ++block)
        if (rng.next() % 3 != 0) arena.set_int(topk, (int64_t{g} * tokens + t) * top_k + slot++, block);
      for (; slot < top_k; ++slot) arena.set_int(topk, (int64_t{g} * tokens + t) * top_k + slot, -1);
    }
  while (in.one_in(8)) {
    arena.set_int(topk, in.pick(std::max(kv_heads * tokens * top_k, 1)), in.hostile_int());
    blamed.push_back("topk");
  }
  if (separate_table) {
    for (int r = 0; r < b.num_requests; ++r)
      for (int c = 0; c < kv_width; ++c) arena.set_int(table, r * kv_width + c, in.pick(kv_pages));
    while (in.one_in(8)) {
      arena.set_int(table, in.pick(std::max(b.num_requests * kv_width, 1)), in.hostile_int());
      blamed.push_back("kv_block_table");
    }
  }
  b.write(in, &arena);
  const KvScales scales = draw_kv_scales(in, &blamed);
  if (b.corrupted) blamed.push_back("*");
  const ExecContext ctx = draw_context(in, workspace, edit, rc, &blamed);

  const auto args = [&](const Arena& a) {
    SparseAttentionArgs x;
    x.q = a.view(q);
    x.k_cache = a.view(k);
    x.v_cache = a.view(v);
    x.k_scale = scales.k;
    x.v_scale = scales.v;
    x.topk = a.view(topk);
    x.batch = b.metadata(a);
    x.kv_block_table = a.view(table);
    x.out = a.view(out);
    x.lse = a.view(lse);
    return x;
  };
  Arena reference = arena.clone();
  const Arena::Snapshot before = arena.snapshot();
  const std::vector<uint8_t> workspace_before = workspace.snapshot(arena);
  const Status status = sparse_attention(plan, args(arena), workspace.get(arena), ctx);
  if (!check_outcome(status, kOp,
                     {"q", "k_cache", "v_cache", "k_scale", "v_scale", "topk", "kv_block_table",
                      "out", "lse", "batch.cu_q_lens", "batch.seq_lens", "batch.block_table",
                      "batch.num_requests", "batch.num_decode_requests", "batch.decode_q_len",
                      "batch.num_tokens", "workspace.bytes", "workspace.data", "plan",
                      "ctx.num_threads"},
                     blamed.empty(), blamed, arena, before, workspace, workspace_before))
    return 0;
  check_only_outputs_written(arena, before, {out, lse}, workspace.arena_id(), kOp);

  const ReferencePlan ref(rc.request);
  const Status ref_status = sparse_attention(ref.plan, args(reference), ref.workspace);
  M3SA_FUZZ_CHECK(ref_status.ok(),
                  "the reference accepts what the cpu accepted: " + ref_status.to_string());
  // Overlapping inputs carry each other's bytes (metadata read as bf16 can be 2^100), and a raw
  // scale (1e38) makes fp32 sums of V overflow where double ones do not: the values are then no
  // longer the bounded ones the tolerance is made for.
  if (arena.mutated().empty() && scales.bounded)
    compare_outputs(arena, reference, out, lse, v_max);
  check_same_bytes(arena, reference, {workspace.arena_id(), out, lse}, kOp);
  return 0;
}
