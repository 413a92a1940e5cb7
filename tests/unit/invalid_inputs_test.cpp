// Every public entry point rejects bad input with a Status naming the argument, before touching
// memory. Table-driven: each case breaks one thing in an otherwise valid setup.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "support/test_util.h"
#include "testing/norm_rope_batch.h"

namespace m3sa::testing {
namespace {

// A valid setup for every op: 2 decode requests + 1 prefill request, 2 index heads.
struct ValidSetup {
  SyntheticBatch sb{
      BatchSpec{{1, 1, 20}, {300, 200, 400}, 2, 1, 2, DType::bf16, 4, 2, DType::bf16}};
  MsaConfig config;
  PlanRequest request;
  HostTensor topk, scores, out, lse, rows, slots;
  InsertIndexKArgs insert;
  ScoreBlocksArgs score;
  SelectTopkBlocksArgs select;
  IndexTopkArgs index;
  SparseAttentionArgs attention;
  NormRopeBatch norm_rope_batch{NormRopeSpec{}};
  NormRopeInsertArgs norm_rope;
  HostTensor workspace_buffer;
  HostTensor spare; // memory a case lays its own views over
  Workspace workspace;
  bool null_plan = false;
  int64_t workspace_offset = 0;
  int64_t workspace_shortfall = 0;
  bool plan_for_other_op = false;
  bool block_table_in_workspace = false;     // the batch's block table copied into the workspace
  std::function<void(OpPlan&)> edit_plan; // applied after make_plan

  explicit ValidSetup(OpKind op) {
    config.num_index_heads = 2;
    sb.fill_index_integers(1, -2, 2);
    sb.fill_attention_random(2);
    request = plan_request(op, config, sb, {Backend::cpu, 2});
    topk.reset(DType::i32, {2, sb.num_tokens(), 16});
    HostTensor tmp;
    EXPECT_TRUE(run_index_topk(config, sb, {Backend::cpu}, &tmp).ok());
    std::memcpy(topk.data<int32_t>(), tmp.data<int32_t>(), tmp.bytes());
    scores.reset(DType::f32, {2, sb.num_tokens(), sb.width()});
    out.reset(DType::bf16, {sb.num_tokens(), 4, kHeadDim});
    lse.reset(DType::f32, {sb.num_tokens(), 4});
    rows.reset(DType::bf16, {5, kHeadDim});
    rows.fill_bytes(0);
    slots.reset(DType::i64, {5});
    for (int i = 0; i < 5; ++i) slots.data<int64_t>()[i] = i * 3 - 1;
    insert = {rows.view(), slots.view(), sb.index_k_cache.view()};
    score = {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), scores.view()};
    select = {scores.view(), sb.batch(), topk.view()};
    HostTensor index_out_storage;
    index = {sb.index_q.view(), sb.index_k_cache.view(), sb.batch(), topk.view()};
    attention = attention_args(sb, topk, out, lse, true);
    norm_rope = norm_rope_batch.args();
    if (op == OpKind::norm_rope_insert) {
      request.capacities.max_tokens = norm_rope_batch.spec().tokens;
      request.config.num_index_heads = norm_rope_batch.spec().index_heads;
    }
  }
  // `outer` and `inner` (both contiguous) moved into `spare`, `inner` 64 bytes into `outer`: they
  // overlap each other and nothing else, whatever the allocator placed next to their buffers.
  void place_inside(TensorView& outer, TensorView& inner) {
    const int64_t outer_bytes = outer.numel() * static_cast<int64_t>(dtype_size(outer.dtype));
    spare.reset(DType::i64, {outer_bytes / 8});
    std::memcpy(spare.data<char>() + 64, inner.data, inner.numel() * dtype_size(inner.dtype));
    outer.data = spare.data<char>();
    inner.data = spare.data<char>() + 64;
  }
  // `view` (contiguous) copied into `spare`, `bytes` past a 64-byte boundary.
  TensorView shifted_copy(const TensorView& view, int64_t bytes) {
    const int64_t size = view.numel() * static_cast<int64_t>(dtype_size(view.dtype));
    spare.reset(DType::i64, {size / 8 + 2});
    std::memcpy(spare.data<char>() + bytes, view.data, size);
    TensorView shifted = view;
    shifted.data = spare.data<char>() + bytes;
    return shifted;
  }
  void set_batch(const std::function<void(BatchMetadata&)>& edit) {
    for (BatchMetadata* b : {&score.batch, &select.batch, &index.batch, &attention.batch}) edit(*b);
  }
};

struct InvalidCase {
  const char* name;
  OpKind op;
  std::function<void(ValidSetup&)> mutate;
  const char* message_part; // must appear in the Status message
  StatusCode code = StatusCode::invalid_argument;
  // The message starts "m3sa::<op>: " (contract: errors), make_plan(nullptr) included (the
  // request names the op); a request whose op is out of range has no op name to give.
  bool op_prefix = true;
};

Status run_case(ValidSetup& s, OpKind op) {
  OpPlan plan;
  PlanRequest request = s.request;
  if (s.plan_for_other_op)
    request.op = op == OpKind::index_topk ? OpKind::score_blocks : OpKind::index_topk;
  Status status = make_plan(request, s.null_plan ? nullptr : &plan);
  if (!status.ok()) return status;
  if (s.edit_plan) s.edit_plan(plan);
  s.workspace_buffer.reset(DType::i32, {static_cast<int64_t>(plan.workspace_bytes / 4 + 64)});
  char* base = s.workspace_buffer.data<char>();
  Workspace ws{base ? base + s.workspace_offset : nullptr,
               plan.workspace_bytes - s.workspace_shortfall};
  if (s.workspace.bytes == 1) ws = {nullptr, plan.workspace_bytes}; // "null workspace" marker
  if (s.block_table_in_workspace)
    s.set_batch([&](BatchMetadata& b) {
      std::memcpy(ws.data, b.block_table.data, b.block_table.numel() * sizeof(int32_t));
      b.block_table.data = ws.data;
    });
  switch (op) {
  case OpKind::insert_index_k:
    return insert_index_k(plan, s.insert, ws);
  case OpKind::score_blocks:
    return score_blocks(plan, s.score, ws);
  case OpKind::select_topk_blocks:
    return select_topk_blocks(plan, s.select, ws);
  case OpKind::index_topk:
    return index_topk(plan, s.index, ws);
  case OpKind::sparse_attention:
    return sparse_attention(plan, s.attention, ws);
  case OpKind::norm_rope_insert:
    return norm_rope_insert(plan, s.norm_rope, ws);
  }
  return {};
}

int32_t* i32(const TensorView& v) { return v.ptr<int32_t>(); }

const std::vector<InvalidCase>& cases() {
  using O = OpKind;
  static const std::vector<InvalidCase> all = {
      // Configuration and plan.
      {"TopKZero", O::index_topk, [](ValidSetup& s) { s.request.config.top_k = 0; },
       "config.top_k: expected 1..32, got 0"},
      {"TopKTooLarge", O::index_topk, [](ValidSetup& s) { s.request.config.top_k = 33; },
       "config.top_k"},
      {"LocalPlusInitAboveK", O::index_topk,
       [](ValidSetup& s) { s.request.config.local_blocks = 10, s.request.config.init_blocks = 7; },
       "config.local_blocks + config.init_blocks"},
      {"NegativeLocalBlocks", O::index_topk,
       [](ValidSetup& s) { s.request.config.local_blocks = -1; }, "config.local_blocks"},
      {"NegativeInitBlocks", O::score_blocks,
       [](ValidSetup& s) { s.request.config.init_blocks = -2; }, "config.init_blocks"},
      {"ZeroIndexHeads", O::index_topk, [](ValidSetup& s) { s.request.config.num_index_heads = 0; },
       "config.num_index_heads"},
      {"SeventeenIndexHeads", O::index_topk,
       [](ValidSetup& s) { s.request.config.num_index_heads = 17; }, "config.num_index_heads"},
      {"NanScoreScale", O::score_blocks,
       [](ValidSetup& s) {
         s.request.config.score_scale = std::numeric_limits<float>::quiet_NaN();
       },
       "config.score_scale"},
      {"ZeroTokenCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_tokens = 0; }, "capacities.max_tokens"},
      {"ZeroRequestCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_requests = 0; }, "capacities.max_requests"},
      {"F32CacheDtype", O::index_topk, [](ValidSetup& s) { s.request.cache_dtype = DType::f32; },
       "cache_dtype"},
      {"NegativeThreads", O::index_topk, [](ValidSetup& s) { s.request.num_threads = -3; },
       "num_threads"},
      {"ThreadCountOnePastLimit", O::index_topk, [](ValidSetup& s) { s.request.num_threads = 1025; },
       "num_threads: expected 0..1024 (0 = OpenMP default), got 1025"},
      {"BlocksPerRequestOnePast2To20", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_blocks_per_request = (int64_t{1} << 20) + 1; },
       "capacities.max_blocks_per_request: expected 1..2^20 (128M tokens), got 1048577"},
      {"NullPlanPointer", O::index_topk, [](ValidSetup& s) { s.null_plan = true; },
       "plan: expected a non-null OpPlan*"},
      {"CudaBackendWithoutDevice", O::sparse_attention,
       [](ValidSetup& s) { s.request.backend = Backend::cuda; }, "backend cuda",
       StatusCode::unsupported},
      {"PlanForAnotherOp", O::index_topk, [](ValidSetup& s) { s.plan_for_other_op = true; },
       "a plan made for index_topk"},
      // Workspace.
      {"WorkspaceTooSmall", O::index_topk, [](ValidSetup& s) { s.workspace_shortfall = 64; },
       "workspace.bytes"},
      {"WorkspaceNull", O::index_topk, [](ValidSetup& s) { s.workspace.bytes = 1; },
       "workspace.data: expected a non-null pointer"},
      {"WorkspaceMisaligned", O::index_topk, [](ValidSetup& s) { s.workspace_offset = 4; },
       "64-byte alignment"},
      // Tensors.
      {"IndexQWrongDtype", O::index_topk, [](ValidSetup& s) { s.index.index_q.dtype = DType::f32; },
       "index_q: expected bf16 or fp8_e4m3"},
      {"IndexQDtypeDiffersFromCache", O::index_topk,
       [](ValidSetup& s) { s.index.index_q.dtype = DType::fp8_e4m3; },
       "index-Q follows the index cache dtype"},
      {"IndexQWrongHeadCount", O::index_topk, [](ValidSetup& s) { s.index.index_q.shape[1] = 3; },
       "index_q"},
      {"IndexQStridedLastDim", O::index_topk, [](ValidSetup& s) { s.index.index_q.strides[2] = 2; },
       "stride 1 in the last dim"},
      {"IndexQNullData", O::index_topk, [](ValidSetup& s) { s.index.index_q.data = nullptr; },
       "non-null data pointer"},
      {"IndexQNegativeStride", O::index_topk,
       [](ValidSetup& s) { s.index.index_q.strides[0] = -256; }, "non-negative strides"},
      {"IndexQOnCudaForCpuBackend", O::index_topk,
       [](ValidSetup& s) {
         s.index.index_q.device = {DeviceKind::cuda, 0};
       },
       "memory on cpu"},
      {"CachePageNot128Tokens", O::index_topk,
       [](ValidSetup& s) { s.index.index_k_cache.shape[1] = 64; }, "index_k_cache"},
      {"CacheDtypeDiffersFromPlan", O::index_topk,
       [](ValidSetup& s) { s.request.cache_dtype = DType::fp8_e4m3; },
       "index_k_cache: expected dtype fp8_e4m3 (the plan's cache_dtype)"},
      {"TopkWrongK", O::index_topk, [](ValidSetup& s) { s.index.topk.shape[2] = 8; }, "topk"},
      {"TopkWrongDtype", O::index_topk, [](ValidSetup& s) { s.index.topk.dtype = DType::i64; },
       "topk: expected i32"},
      {"TopkAliasedRows", O::index_topk, [](ValidSetup& s) { s.index.topk.strides[1] = 0; },
       "do not alias"},
      {"TopkOverlapsIndexQ", O::index_topk,
       [](ValidSetup& s) { s.index.topk.data = s.index.index_q.data; },
       "memory disjoint from index_q"},
      {"ScoresNarrowerThanBlockTable", O::score_blocks,
       [](ValidSetup& s) {
         s.score.scores.shape[2] = 2;
         s.score.scores.strides[1] = 2;
         s.score.scores.strides[0] = 2 * s.sb.num_tokens();
       },
       "N >= block-table width"},
      {"ScoresOneColumnShortOfBlockTable", O::score_blocks, // the table is 4 wide
       [](ValidSetup& s) {
         s.score.scores.shape[2] = 3;
         s.score.scores.strides[1] = 3;
         s.score.scores.strides[0] = 3 * s.sb.num_tokens();
       },
       "scores: expected N >= block-table width 4"},
      // Session 62 (second batch of mutation rows): each case one past a bound or one dropped
      // rule of the indexer ops.
      {"IndexQOneTokenShort", O::index_topk, [](ValidSetup& s) { --s.index.index_q.shape[0]; },
       "index_q: expected bf16 or fp8_e4m3 [num_tokens, num_index_heads, 128] (dim 0 == 22)"},
      {"ScoresOverIndexKCache", O::score_blocks,
       [](ValidSetup& s) { s.score.scores.data = s.score.index_k_cache.data; },
       "scores: expected memory disjoint from index_k_cache"},
      {"SelectTopkOverScores", O::select_topk_blocks,
       [](ValidSetup& s) { s.place_inside(s.select.topk, s.select.scores); },
       "topk: expected memory disjoint from scores"},
      {"ScoresWrongDtype", O::select_topk_blocks,
       [](ValidSetup& s) { s.select.scores.dtype = DType::bf16; }, "scores: expected f32"},
      // Batch metadata.
      {"SeqLenBeyondBlockTable", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.seq_lens)[2] = 5000; }, "block-table capacity"},
      // The batch is q_lens {1, 1, 20}, seq_lens {300, 200, 400} over 9 pages, a 4-wide table:
      // the cases below sit one past each bound.
      {"SeqLenOneTokenPastBlockTable", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.seq_lens)[2] = 4 * 128 + 1; },
       "<= block-table capacity 4 x 128 = 512 tokens, got 513 for request 2"},
      {"PageIdEqualsNumPages", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.block_table)[0] = 9; },
       "page ids in [0, 9), got 9 at [0][0]"},
      {"QLenOnePastSeqLen", O::index_topk, [](ValidSetup& s) { i32(s.index.batch.seq_lens)[2] = 19; },
       "seq_len >= q_len (20) for request 2, got 19"},
      {"LastDecodeRequestQLenNotUniform", O::index_topk, // q_lens {1, 2, 19}
       [](ValidSetup& s) { i32(s.index.batch.cu_q_lens)[2] = 3; },
       "q_len == decode_q_len (1) for every decode request, got q_len 2 for request 1"},
      {"PageIdOutOfRange", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.block_table)[0] = 999; }, "page ids in [0,"},
      {"NegativePageId", O::score_blocks,
       [](ValidSetup& s) { i32(s.score.batch.block_table)[1] = -1; }, "page ids in [0,"},
      {"QLenAboveSeqLen", O::index_topk, [](ValidSetup& s) { i32(s.index.batch.seq_lens)[2] = 10; },
       "seq_len >= q_len (20)"},
      {"NegativeSeqLen", O::index_topk, [](ValidSetup& s) { i32(s.index.batch.seq_lens)[0] = -4; },
       "batch.seq_lens: expected >= 0"},
      {"DecodeQLenNotUniform", O::index_topk,
       [](ValidSetup& s) { s.set_batch([](BatchMetadata& b) { b.decode_q_len = 2; }); },
       "q_len == decode_q_len (2)"},
      {"DecodeQLenAbove16", O::index_topk,
       [](ValidSetup& s) { s.set_batch([](BatchMetadata& b) { b.decode_q_len = 17; }); },
       "batch.decode_q_len: expected 1..16"},
      {"MoreDecodeThanRequests", O::index_topk,
       [](ValidSetup& s) { s.set_batch([](BatchMetadata& b) { b.num_decode_requests = 4; }); },
       "batch.num_decode_requests"},
      {"CuQLensNotStartingAtZero", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.cu_q_lens)[0] = 1; }, "cu_q_lens[0] == 0"},
      {"CuQLensDecreasing", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.cu_q_lens)[2] = 0; }, "non-decreasing"},
      // Found by tests/fuzz/fuzz_indexer (UBSan): q_len = cu_q_lens[r + 1] - cu_q_lens[r] was
      // computed in int32, which overflows for INT32_MIN - 1 (and wrapped to a positive q_len).
      {"CuQLensDropToInt32Min", O::index_topk,
       [](ValidSetup& s) { i32(s.index.batch.cu_q_lens)[2] = INT32_MIN; },
       "batch.cu_q_lens: expected non-decreasing values, got cu_q_lens[2] = -2147483648"},
      {"CuQLensTotalNotTokens", O::select_topk_blocks,
       [](ValidSetup& s) { i32(s.select.batch.cu_q_lens)[3] = 21; },
       "cu_q_lens[num_requests] == num_tokens"},
      {"RequestsBeyondCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_requests = 2; }, "batch.num_requests"},
      {"TokensBeyondCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_tokens = 10; }, "batch.num_tokens"},
      {"BlockTableWiderThanCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_blocks_per_request = 2; }, "plan capacity"},
      {"BlockTableOneColumnPastCapacity", O::index_topk,
       [](ValidSetup& s) { s.request.capacities.max_blocks_per_request = 3; },
       "batch.block_table: expected at most 3 columns (plan capacity)"},
      {"SeqLensWrongLength", O::index_topk,
       [](ValidSetup& s) { s.index.batch.seq_lens.shape[0] = 2; }, "batch.seq_lens"},
      // Insert.
      {"InsertSlotBeyondCache", O::insert_index_k,
       [](ValidSetup& s) { s.slots.data<int64_t>()[3] = 1 << 20; },
       "slot_mapping: expected slots < num_pages x 128"},
      {"InsertSlotEqualsCacheRows", O::insert_index_k, // 9 pages
       [](ValidSetup& s) { s.slots.data<int64_t>()[3] = 9 * 128; },
       "slot_mapping: expected slots < num_pages x 128 = 1152, or < 0 to skip, got 1152 at row 3"},
      {"InsertRowsOnePastCapacity", O::insert_index_k, // 5 rows
       [](ValidSetup& s) { s.request.capacities.max_tokens = 4; },
       "index_k: expected at most 4 rows (plan capacity)"},
      {"InsertRowsNot128Wide", O::insert_index_k,
       [](ValidSetup& s) { s.insert.index_k.shape[1] = 64; }, "index_k"},
      {"InsertSlotsAsI32", O::insert_index_k,
       [](ValidSetup& s) { s.insert.slot_mapping.dtype = DType::i32; },
       "slot_mapping: expected i64"},
      {"InsertSlotMappingOneRowShort", O::insert_index_k, // 5 rows of index_k, 4 slots
       [](ValidSetup& s) { s.insert.slot_mapping.shape[0] = 4; },
       "slot_mapping: expected i64 [num_tokens] (dim 0 == 5)"},
      {"InsertCachePagesAliased", O::insert_index_k, // every page the same memory
       [](ValidSetup& s) { s.insert.index_k_cache.strides[0] = 0; },
       "index_k_cache: expected bf16 [num_pages, 128, 128] (strides that do not alias elements of "
       "an output)"},
      // Attention.
      {"AttentionOutOverlapsLse", O::sparse_attention,
       [](ValidSetup& s) { s.attention.lse.data = s.attention.out.data; },
       "out: expected memory disjoint from lse"},
      {"AttentionOutIsF32", O::sparse_attention,
       [](ValidSetup& s) { s.attention.out.dtype = DType::f32; }, "out: expected bf16"},
      {"AttentionHeadsNotMultipleOfKv", O::sparse_attention,
       [](ValidSetup& s) {
         s.attention.q.shape[1] = 3;
         s.attention.q.strides[0] = 3 * 128;
       },
       "a multiple of num_kv_heads"},
      {"AttentionKvHeadsNotIndexHeads", O::sparse_attention,
       [](ValidSetup& s) { s.request.config.num_index_heads = 1; },
       "k_cache: expected num_kv_heads == config.num_index_heads"},
      {"AttentionTopkNotAscending", O::sparse_attention,
       [](ValidSetup& s) {
         int32_t* t = i32(s.attention.topk) + 2 * 16;
         std::swap(t[0], t[1]);
       },
       "ascending unique block ids"},
      // Head 0, token 0 selects its 3 causal blocks, [0, 1, 2, -1, ...]: each case below breaks
      // one rule of contract §5 alone (a case breaking two let a check lose either unnoticed).
      {"AttentionTopkBeyondCausalBlocks", O::sparse_attention,
       [](ValidSetup& s) { i32(s.attention.topk)[3] = 3; }, // [0, 1, 2, 3, -1, ...]
       "ascending unique block ids in [0, 3) then -1 (contract §5) for head 0 token 0, got 3"},
      {"AttentionTopkRepeatedId", O::sparse_attention,
       [](ValidSetup& s) { i32(s.attention.topk)[3] = 2; }, // [0, 1, 2, 2, -1, ...]
       "for head 0 token 0, got 2 in slot 3"},
      {"AttentionTopkIdAfterPadding", O::sparse_attention,
       [](ValidSetup& s) { i32(s.attention.topk)[2] = -1, i32(s.attention.topk)[3] = 2; },
       "for head 0 token 0, got 2 in slot 3"}, // [0, 1, -1, 2, -1, ...]
      {"AttentionZeroKScale", O::sparse_attention, [](ValidSetup& s) { s.attention.k_scale = 0.f; },
       "k_scale"},
      {"AttentionInfiniteVScale", O::sparse_attention,
       [](ValidSetup& s) { s.attention.v_scale = std::numeric_limits<float>::infinity(); },
       "v_scale: expected a finite value > 0"},
      {"AttentionZeroVScale", O::sparse_attention, [](ValidSetup& s) { s.attention.v_scale = 0.f; },
       "v_scale: expected a finite value > 0, got 0"},
      {"AttentionLseOneHeadShort", O::sparse_attention, // q has 4 heads; lse's rows keep stride 4
       [](ValidSetup& s) { s.attention.lse.shape[1] = 3; },
       "lse: expected f32 [num_tokens, num_q_heads] (dim 1 == 4)"},
      {"AttentionGqaGroupOf32", O::sparse_attention,
       [](ValidSetup& s) { // 64 query heads over the 2 KV heads (the shape alone: never read)
         s.attention.q.shape[1] = 64;
         s.attention.q.strides[0] = 64 * 128;
       },
       "with at most 16 per KV head"},
      {"AttentionOutOverQ", O::sparse_attention,
       [](ValidSetup& s) { s.attention.out.data = s.attention.q.data; },
       "out: expected memory disjoint from q"},
      {"AttentionVCacheShape", O::sparse_attention,
       [](ValidSetup& s) { s.attention.v_cache.shape[2] = 1; }, "v_cache"},
      {"AttentionKvTablePageOutOfRange", O::sparse_attention,
       [](ValidSetup& s) { i32(s.attention.kv_block_table)[0] = 1000; },
       "kv_block_table: expected page ids"},
      {"AttentionInfiniteKScale", O::sparse_attention,
       [](ValidSetup& s) { s.attention.k_scale = std::numeric_limits<float>::infinity(); },
       "k_scale: expected a finite value > 0, got inf"},
      {"AttentionVCacheOnePageShort", O::sparse_attention,
       [](ValidSetup& s) { --s.attention.v_cache.shape[0]; },
       "v_cache: expected bf16 like k_cache (dim 0 == "},
      {"AttentionKvTableOneRowShort", O::sparse_attention, // 3 requests
       [](ValidSetup& s) { s.attention.kv_block_table.shape[0] = 2; },
       "kv_block_table: expected i32 [num_requests, max_blocks] (dim 0 == 3)"},
      // Token 5 is request 2's fourth (q_begin 2, positions 380..399): position 383 sees blocks
      // 0..2 only; a limit taken from t instead of t - q_begin (386) would let block 3 in.
      {"AttentionTopkPrefillTokenPastItsCausalBlocks", O::sparse_attention,
       [](ValidSetup& s) { i32(s.attention.topk)[5 * 16 + 3] = 3; }, // [0, 1, 2, 3, -1, ...]
       "ascending unique block ids in [0, 3) then -1 (contract §5) for head 0 token 5, got 3 in "
       "slot 3"},
      // norm_rope_insert.
      {"NormRopeNegativePosition", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.positions.ptr<int64_t>()[3] = -1; },
       "positions: expected values in [0, 16777216)"},
      {"NormRopePositionBeyond2To24", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.positions.ptr<int64_t>()[0] = int64_t{1} << 24; },
       "positions"},
      {"NormRopePositionBeyondTable", O::norm_rope_insert,
       [](ValidSetup& s) {
         s.norm_rope.cos_sin_cache = s.norm_rope.q_norm_weight; // 1 row is not enough
         s.norm_rope.cos_sin_cache.rank = 2;
         s.norm_rope.cos_sin_cache.shape[0] = 1, s.norm_rope.cos_sin_cache.shape[1] = 64;
         s.norm_rope.cos_sin_cache.strides[0] = 64, s.norm_rope.cos_sin_cache.strides[1] = 1;
       },
       "(cos_sin_cache rows)"},
      {"NormRopeF32Q", O::norm_rope_insert, [](ValidSetup& s) { s.norm_rope.q.dtype = DType::f32; },
       "q: expected bf16"},
      {"NormRopeVHeadsDifferFromK", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.v.shape[1] = 1; }, "v: expected bf16 [T, Hkv, 128]"},
      {"NormRopeIndexHeadsDifferFromConfig", O::norm_rope_insert,
       [](ValidSetup& s) { s.request.config.num_index_heads = 3; },
       "index_q: expected bf16 [T, num_index_heads, 128]"},
      {"NormRopeIndexQOutNotCacheDtype", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.index_q_out.dtype = DType::fp8_e4m3; },
       "index-Q follows the index cache dtype"},
      {"NormRopeKvCacheDtypesDiffer", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.k_cache.dtype = DType::fp8_e4m3; }, "v_cache"},
      {"NormRopeZeroVScale", O::norm_rope_insert, [](ValidSetup& s) { s.norm_rope.v_scale = 0.f; },
       "v_scale: expected a finite value > 0"},
      {"NormRopeSlotBeyondCache", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.slot_mapping.ptr<int64_t>()[2] = 4 * 128; },
       "norm_rope_insert: slot_mapping: expected slots < num_pages x 128 = 512"},
      {"NormRopeIndexSlotPastAShorterIndexCache", O::norm_rope_insert, // 2 of 4 index pages
       [](ValidSetup& s) {
         s.norm_rope.index_k_cache.shape[0] = 2;
         int64_t* slots = s.norm_rope.index_slot_mapping.ptr<int64_t>();
         for (int64_t t = 0; t < s.norm_rope.index_slot_mapping.shape[0]; ++t)
           if (slots[t] >= 2 * 128) slots[t] = -1;
         slots[0] = 2 * 128;
       },
       "index_slot_mapping: expected slots < num_pages x 128 = 256"},
      {"NormRopeVCacheOnePageShort", O::norm_rope_insert,
       [](ValidSetup& s) { --s.norm_rope.v_cache.shape[0]; },
       "v_cache: expected bf16 [num_pages, 128, Hkv, 128] like k_cache (dim 0 == 4)"},
      {"NormRopeInfiniteKScale", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.k_scale = std::numeric_limits<float>::infinity(); },
       "k_scale: expected a finite value > 0, got inf"},
      {"NormRopeInfiniteWeightOffset", O::norm_rope_insert,
       [](ValidSetup& s) {
         s.request.config.norm_weight_offset = std::numeric_limits<float>::infinity();
       },
       "config.norm_weight_offset: expected a finite value"},
      {"NormRopePosition2To24UnderALongerTable", O::norm_rope_insert,
       [](ValidSetup& s) { // 2^24 + 1 rows (all one row: stride 0), position 2^24
         s.norm_rope.cos_sin_cache = s.norm_rope.q_norm_weight;
         s.norm_rope.cos_sin_cache.rank = 2;
         s.norm_rope.cos_sin_cache.shape[0] = (int64_t{1} << 24) + 1;
         s.norm_rope.cos_sin_cache.shape[1] = 64;
         s.norm_rope.cos_sin_cache.strides[0] = 0, s.norm_rope.cos_sin_cache.strides[1] = 1;
         s.norm_rope.positions.ptr<int64_t>()[0] = int64_t{1} << 24;
       },
       "positions: expected values in [0, 16777216) (cos_sin_cache rows), got 16777216 at row 0"},
      {"NormRopeIndexSlotBeyondCache", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.index_slot_mapping.ptr<int64_t>()[0] = 1 << 20; },
       "index_slot_mapping"},
      {"NormRopeQOutOverlapsK", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.q_out.data = s.norm_rope.k.data; },
       "q_out: expected memory disjoint from"},
      {"NormRopeQOutShiftedOverQ", O::norm_rope_insert,
       [](ValidSetup& s) {
         // q and q_out one row apart in one buffer of their own: they overlap each other only
         // (shifting q_out within q's allocation would run past its end into whichever buffer
         // the allocator placed next, and the check would name that one).
         const int64_t elements = s.norm_rope.q.shape[0] * s.norm_rope.q.strides[0];
         s.spare.reset(DType::bf16, {elements + kHeadDim});
         s.spare.fill_bytes(0);
         s.norm_rope.q.data = s.spare.data<uint16_t>();
         s.norm_rope.q_out.data = s.spare.data<uint16_t>() + kHeadDim; // not in place
       },
       "q_out: expected memory disjoint from q"},
      {"NormRopeThetaNotAboveOne", O::norm_rope_insert,
       [](ValidSetup& s) { s.request.config.rope_theta = 1.0; }, "config.rope_theta"},
      {"NormRopeNanEps", O::norm_rope_insert,
       [](ValidSetup& s) {
         s.request.config.rms_norm_eps = std::numeric_limits<float>::quiet_NaN();
       },
       "config.rms_norm_eps"},
      {"NormRopeNegativeEps", O::norm_rope_insert,
       [](ValidSetup& s) { s.request.config.rms_norm_eps = -1e-6f; },
       "config.rms_norm_eps: expected a finite value >= 0"},
      {"NormRopeShortWeight", O::norm_rope_insert,
       [](ValidSetup& s) { s.norm_rope.k_norm_weight.shape[0] = 64; }, "k_norm_weight"},
      {"NormRopeTokensBeyondCapacity", O::norm_rope_insert,
       [](ValidSetup& s) { s.request.capacities.max_tokens = 10; }, "(plan capacity)"},
      {"NormRopeTokensOnePastCapacity", O::norm_rope_insert,
       [](ValidSetup& s) { --s.request.capacities.max_tokens; },
       "q: expected at most 63 tokens (plan capacity)"},
      // Issue 15: outputs and the workspace overlapping batch metadata or other inputs.
      {"TopkOverlapsCuQLens", O::index_topk,
       [](ValidSetup& s) { s.place_inside(s.index.topk, s.index.batch.cu_q_lens); },
       "topk: expected memory disjoint from batch.cu_q_lens"},
      {"ScoresOverlapSeqLens", O::score_blocks,
       [](ValidSetup& s) { s.place_inside(s.score.scores, s.score.batch.seq_lens); },
       "scores: expected memory disjoint from batch.seq_lens"},
      {"SelectTopkOverlapsBlockTable", O::select_topk_blocks,
       [](ValidSetup& s) { s.place_inside(s.select.topk, s.select.batch.block_table); },
       "topk: expected memory disjoint from batch.block_table"},
      {"AttentionOutOverlapsBlockTable", O::sparse_attention,
       [](ValidSetup& s) { s.place_inside(s.attention.out, s.attention.batch.block_table); },
       "out: expected memory disjoint from batch.block_table"},
      {"AttentionLseOverlapsKvBlockTable", O::sparse_attention,
       [](ValidSetup& s) { s.place_inside(s.attention.lse, s.attention.kv_block_table); },
       "lse: expected memory disjoint from kv_block_table"},
      {"BlockTableInsideWorkspace", O::index_topk,
       [](ValidSetup& s) { s.block_table_in_workspace = true; },
       "workspace.data: expected memory disjoint from batch.block_table"},
      {"InsertCacheOverlapsSlotMapping", O::insert_index_k,
       [](ValidSetup& s) { s.place_inside(s.insert.index_k_cache, s.insert.slot_mapping); },
       "index_k_cache: expected memory disjoint from slot_mapping"},
      {"NormRopeKCacheOverlapsPositions", O::norm_rope_insert,
       [](ValidSetup& s) { s.place_inside(s.norm_rope.k_cache, s.norm_rope.positions); },
       "k_cache: expected memory disjoint from positions"},
      // Issue 15: duplicate slots (contract §3).
      {"InsertDuplicateSlots", O::insert_index_k,
       [](ValidSetup& s) { s.slots.data<int64_t>()[4] = s.slots.data<int64_t>()[1]; },
       "slot_mapping: expected distinct non-negative slots"},
      {"NormRopeDuplicateIndexSlots", O::norm_rope_insert,
       [](ValidSetup& s) {
         int64_t* slots = s.norm_rope.index_slot_mapping.ptr<int64_t>();
         slots[3] = slots[1] >= 0 ? slots[1] : slots[2];
       },
       "index_slot_mapping: expected distinct non-negative slots"},
      // Issue 15: rank above TensorView::kMaxRank, sizes that overflow.
      {"RankAboveMaxRank", O::index_topk, [](ValidSetup& s) { s.index.index_q.rank = 5; },
       "rank 5 (at most 4)"},
      {"CacheOf2To52Pages", O::index_topk,
       [](ValidSetup& s) { s.index.index_k_cache.shape[0] = int64_t{1} << 52; },
       "at most 2^48 bytes"},
      // Found by tests/fuzz (UBSan): views whose data pointer is not a multiple of their element
      // size were accepted and then read through misaligned i64 / i32 / f32 pointers.
      {"SlotMappingMisaligned", O::insert_index_k,
       [](ValidSetup& s) { s.insert.slot_mapping = s.shifted_copy(s.insert.slot_mapping, 1); },
       "slot_mapping: expected i64 [num_tokens] (data aligned to its 8-byte elements)"},
      {"SeqLensMisaligned", O::index_topk,
       [](ValidSetup& s) {
         const TensorView shifted = s.shifted_copy(s.index.batch.seq_lens, 2);
         s.set_batch([&](BatchMetadata& b) { b.seq_lens = shifted; });
       },
       "batch.seq_lens: expected i32 [num_requests] (data aligned to its 4-byte elements)"},
      {"ScoresMisaligned", O::select_topk_blocks,
       [](ValidSetup& s) { s.select.scores = s.shifted_copy(s.select.scores, 3); },
       "scores: expected f32 [num_index_heads, num_tokens, N] (data aligned to its 4-byte elements)"},
      {"AttentionOutMisaligned", O::sparse_attention,
       [](ValidSetup& s) { s.attention.out = s.shifted_copy(s.attention.out, 1); },
       "out: expected bf16 [num_tokens, num_q_heads, 128] (data aligned to its 2-byte elements)"},
      // Issue 15: plans are range-checked and sealed.
      {"BackendOutOfRange", O::index_topk,
       [](ValidSetup& s) { s.request.backend = static_cast<Backend>(7); },
       "backend: expected a Backend (0..2), got 7"},
      {"OpOutOfRange", O::index_topk, [](ValidSetup& s) { s.request.op = static_cast<OpKind>(9); },
       "op: expected an OpKind (0..5), got 9", StatusCode::invalid_argument, false},
      {"AbsurdThreadCount", O::index_topk,
       [](ValidSetup& s) { s.request.num_threads = std::numeric_limits<int>::max(); },
       "num_threads: expected 0..1024"},
      {"PlanThreadsRaisedAfterMakePlan", O::index_topk,
       [](ValidSetup& s) { s.edit_plan = [](OpPlan& plan) { plan.num_threads += 8; }; },
       "plan: expected a plan as make_plan made it"},
      {"PlanTopKEditedAfterMakePlan", O::sparse_attention,
       [](ValidSetup& s) { s.edit_plan = [](OpPlan& plan) { plan.request.config.top_k = 200; }; },
       "plan: expected a plan as make_plan made it"},
      {"PlanWorkspaceShrunkAfterMakePlan", O::index_topk,
       [](ValidSetup& s) { s.edit_plan = [](OpPlan& plan) { plan.workspace_bytes = 64; }; },
       "plan: expected a plan as make_plan made it"},
  };
  return all;
}

// Every buffer a call could write, as bytes: a rejected call leaves them all as they were
// (contract: validation before touching memory).
std::vector<std::vector<uint8_t>> writable_bytes(const ValidSetup& s) {
  const NormRopeBatch& n = s.norm_rope_batch;
  std::vector<std::vector<uint8_t>> bytes;
  for (const HostTensor* t : {&s.topk, &s.scores, &s.out, &s.lse, &s.sb.index_k_cache, &n.q,
                              &n.index_q, &n.q_out, &n.k_cache, &n.v_cache, &n.index_q_out,
                              &n.index_k_cache})
    bytes.emplace_back(t->data<uint8_t>(), t->data<uint8_t>() + t->bytes());
  return bytes;
}

class InvalidInputs : public ::testing::TestWithParam<size_t> {};

TEST_P(InvalidInputs, RejectedWithANamedArgument) {
  const InvalidCase& c = cases()[GetParam()];
  ValidSetup setup(c.op);
  setup.scores.fill_bytes(0x5a); // defined bytes to compare
  c.mutate(setup);
  const auto before = writable_bytes(setup);
  const Status status = run_case(setup, c.op);
  ASSERT_FALSE(status.ok()) << c.name << " was accepted";
  EXPECT_TRUE(writable_bytes(setup) == before) << c.name << ": a rejected call wrote memory";
  EXPECT_EQ(status.code(), c.code) << status.to_string();
  EXPECT_NE(status.message().find(c.message_part), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << c.message_part;
  if (c.op_prefix) {
    const std::string prefix = std::string("m3sa::") + to_string(c.op) + ": ";
    EXPECT_EQ(status.message().rfind(prefix, 0), 0u)
        << "message: " << status.message() << "\nexpected to start with: " << prefix;
  }
}

TEST(InvalidInputs, TheValidSetupIsAccepted) {
  for (OpKind op : {OpKind::insert_index_k, OpKind::score_blocks, OpKind::select_topk_blocks,
                    OpKind::index_topk, OpKind::sparse_attention}) {
    ValidSetup setup(op);
    if (op == OpKind::select_topk_blocks) { // valid scores
      for (int64_t i = 0; i < setup.scores.view().numel(); ++i) setup.scores.data<float>()[i] = 0.f;
    }
    const Status status = run_case(setup, op);
    EXPECT_TRUE(status.ok()) << to_string(op) << ": " << status.to_string();
  }
}

// A view with no tokens: extent 0 in `token_dim`, the contiguous strides of that empty shape
// (issue 15: [H, 0, K] has stride 0 in its first dim, which the alias check once mistook for
// overlapping rows).
TensorView without_tokens(TensorView t, int token_dim) {
  t.shape[token_dim] = 0;
  const int64_t* e = t.shape;
  switch (t.rank) {
  case 1:
    return TensorView::contiguous(t.data, t.dtype, {e[0]});
  case 2:
    return TensorView::contiguous(t.data, t.dtype, {e[0], e[1]});
  case 3:
    return TensorView::contiguous(t.data, t.dtype, {e[0], e[1], e[2]});
  default:
    return TensorView::contiguous(t.data, t.dtype, {e[0], e[1], e[2], e[3]});
  }
}

// Every op's arguments for a valid empty batch: T = 0, no requests.
void make_batches_empty(ValidSetup& s) {
  s.set_batch([](BatchMetadata& b) {
    b.num_requests = b.num_decode_requests = b.num_tokens = 0;
    b.cu_q_lens = without_tokens(b.cu_q_lens, 0);
    b.cu_q_lens.shape[0] = 1; // [num_requests + 1]; cu_q_lens[0] is already 0
    b.seq_lens = without_tokens(b.seq_lens, 0);
    b.block_table = without_tokens(b.block_table, 0);
  });
  s.insert.index_k = without_tokens(s.insert.index_k, 0);
  s.insert.slot_mapping = without_tokens(s.insert.slot_mapping, 0);
  s.score.index_q = s.index.index_q = without_tokens(s.index.index_q, 0);
  s.score.scores = s.select.scores = without_tokens(s.score.scores, 1);
  s.select.topk = s.index.topk = without_tokens(s.index.topk, 1);
  SparseAttentionArgs& a = s.attention;
  a.q = without_tokens(a.q, 0);
  a.topk = without_tokens(a.topk, 1);
  a.out = without_tokens(a.out, 0);
  a.lse = without_tokens(a.lse, 0);
  a.kv_block_table = without_tokens(a.kv_block_table, 0);
  NormRopeInsertArgs& n = s.norm_rope;
  for (TensorView* t : {&n.q, &n.k, &n.v, &n.index_q, &n.index_k, &n.positions, &n.slot_mapping,
                        &n.index_slot_mapping, &n.q_out, &n.index_q_out})
    *t = without_tokens(*t, 0);
}

TEST(InvalidInputs, EmptyBatchIsAcceptedAsANoOpOnEveryOp) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (OpKind op : kEveryOp) {
      ValidSetup setup(op);
      setup.scores.fill_bytes(0x5a);
      setup.request.backend = backend;
      make_batches_empty(setup);
      const auto before = writable_bytes(setup);
      const Status status = run_case(setup, op);
      EXPECT_TRUE(status.ok()) << to_string(backend) << " " << to_string(op) << ": "
                               << status.to_string();
      EXPECT_TRUE(writable_bytes(setup) == before)
          << to_string(backend) << " " << to_string(op) << ": an empty batch wrote memory";
    }
}

TEST(InvalidInputs, SelectTopkScoresWiderThanThePlanCapacityAreReadUpToTheBlockTable) {
  // scores may be wider than the block table (contract §5: columns past it are never causal),
  // wider even than the plan's max_blocks_per_request that sized the workspace (issue 15: the
  // reference copied every column into it). Both host backends select the same blocks.
  HostTensor results[2];
  int i = 0;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ValidSetup setup(OpKind::select_topk_blocks);
    setup.request.backend = backend;
    const int64_t wide = setup.request.capacities.max_blocks_per_request + 300;
    const int64_t heads = setup.scores.view().shape[0], tokens = setup.sb.num_tokens();
    setup.spare.reset(DType::f32, {heads, tokens, wide});
    for (int64_t e = 0; e < setup.spare.view().numel(); ++e)
      setup.spare.data<float>()[e] = static_cast<float>((e * 7919) % 113);
    setup.select.scores = setup.spare.view();
    ASSERT_TRUE(run_case(setup, OpKind::select_topk_blocks).ok()) << to_string(backend);
    results[i++] = std::move(setup.topk);
  }
  EXPECT_TRUE(same_bytes(results[0], results[1]));
}

// The aliasing rules cover the bytes of the workspace the plan uses (plan.workspace_bytes), not
// the caller's whole buffer: metadata in a larger buffer's unused tail is no conflict.
TEST(InvalidInputs, BlockTableInTheWorkspacesUnusedTailIsAccepted) {
  ValidSetup setup(OpKind::index_topk);
  OpPlan plan;
  M3SA_ASSERT_OK(make_plan(setup.request, &plan));
  const int64_t used = static_cast<int64_t>((plan.workspace_bytes + 63) / 64 * 64);
  const TensorView table = setup.index.batch.block_table;
  const int64_t table_bytes = table.numel() * static_cast<int64_t>(sizeof(int32_t));
  setup.workspace_buffer.reset(DType::i32, {(used + table_bytes) / 4 + 64});
  char* base = setup.workspace_buffer.data<char>();
  std::memcpy(base + used, table.data, static_cast<size_t>(table_bytes));
  setup.index.batch.block_table.data = base + used;
  const Workspace whole{base, static_cast<size_t>(used + table_bytes)};
  M3SA_EXPECT_OK(index_topk(plan, setup.index, whole));
}

TEST(InvalidInputs, RankAboveMaxRankIsDescribedWithoutReadingPastTheShape) {
  const float data[1] = {};
  const TensorView five = TensorView::contiguous(data, DType::f32, {1, 1, 1, 1, 1});
  EXPECT_EQ(five.rank, 5);
  EXPECT_NE(five.describe().find("rank 5 (at most 4)"), std::string::npos) << five.describe();
  EXPECT_EQ(five.numel(), 1);
}

INSTANTIATE_TEST_SUITE_P(Table, InvalidInputs, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& param_info) {
                           return std::string(cases()[param_info.param].name);
                         });

} // namespace
} // namespace m3sa::testing

namespace m3sa::testing {
namespace {

TEST(InvalidInputs, SyntheticBatchBeyondHostMemoryReportsAnAllocationFailure) {
  // Issue 15: `m3sa demo --decode-requests 4096 --decode-context 1048576` crashed on the null data
  // of an unchecked aligned_alloc. Two requests of 2^31 - 128 tokens need a 1 TiB index cache.
  constexpr int32_t kLongest = INT32_MAX - 127;
  const SyntheticBatch sb(BatchSpec{{1, 1}, {kLongest, kLongest}, 0, 1, 1});
  ASSERT_FALSE(sb.status().ok());
  EXPECT_NE(sb.status().message().find("host memory: allocating"), std::string::npos)
      << sb.status().to_string();
}

} // namespace
} // namespace m3sa::testing

// The test above needs a failed allocation to come back as null under ASan and TSan too (their
// default is to abort), as it does from the plain allocator.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
