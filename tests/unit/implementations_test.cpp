// Every registered implementation against the reference, on one table of cases (the model is
// ggml's test-backend-ops): one test per (implementation, case), named
// Implementations/OpImplementation.MatchesTheReference/<implementation>__<case>. An implementation
// that cannot run here skips with its can_implement reason. The same source builds into
// m3sa_cpu_tests (host implementations; CUDA ones skip) and m3sa_gpu_tests
// (M3SA_TEST_GPU_BINARY: the CUDA implementations, on device copies of the same inputs).
// Cases named Small* carry the ctest label `small` (tests/CMakeLists.txt), the set the GPU
// sanitizer round runs. Adding an implementation to the registry adds its tests here.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "testing/norm_rope_batch.h"
#ifdef M3SA_TEST_DEVICE_MEMORY
#include "gpu/cuda_test_util.h"
#endif

namespace m3sa::testing {
namespace {

struct Case {
  const char* name;
  BatchSpec spec; // decode requests first; q_heads / kv_heads size the attention tensors
  int top_k, local_blocks, init_blocks;
};

BatchSpec spec_of(std::vector<int32_t> q_lens, std::vector<int32_t> seq_lens, int num_decode,
                  int decode_q_len, int heads, DType index_dtype, int q_heads, DType kv_dtype) {
  BatchSpec s;
  s.q_lens = std::move(q_lens);
  s.seq_lens = std::move(seq_lens);
  s.num_decode = num_decode;
  s.decode_q_len = decode_q_len;
  s.index_heads = heads;
  s.index_dtype = index_dtype;
  s.q_heads = q_heads;
  s.kv_heads = heads; // KV head g reads index head g's selection
  s.kv_dtype = kv_dtype;
  return s;
}

// Decode and prefill mixed, MTP, padding rows (seq_len 0), bf16 / e4m3, H 1 / 4, K 8 / 16 / 32,
// forced init and local blocks; one longer case for the split block ranges of the GPU kernels.
const std::vector<Case>& cases() {
  static const std::vector<Case> table = [] {
    const DType bf = DType::bf16, e4m3 = DType::fp8_e4m3;
    return std::vector<Case>{
        {"SmallMixedBf16H4K16", spec_of({1, 1, 1, 20}, {700, 129, 0, 600}, 3, 1, 4, bf, 8, bf), 16,
         1, 0},
        {"SmallMixedMtp2Fp8H1K8", spec_of({2, 2, 37}, {1500, 2, 300}, 2, 2, 1, e4m3, 4, e4m3), 8, 1,
         1},
        {"SmallPrefillBf16H4K32", spec_of({70, 5, 0}, {4200, 5, 0}, 0, 1, 4, bf, 4, bf), 32, 2, 1},
        {"SmallDecodeFp8H4K32", spec_of({1, 1, 1}, {4300, 0, 257}, 3, 1, 4, e4m3, 16, bf), 32, 1,
         0},
        {"LongDecodeAndPrefillH4K16", spec_of({1, 64}, {20000, 8064}, 1, 1, 4, bf, 4, bf), 16, 1,
         0},
    };
  }();
  return table;
}

struct Param {
  int implementation;
  int case_index;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << implementation_info(p.implementation).name << " on " << cases()[p.case_index].name;
}

MsaConfig config_of(const Case& c) {
  MsaConfig config;
  config.top_k = c.top_k;
  config.local_blocks = c.local_blocks;
  config.init_blocks = c.init_blocks;
  config.num_index_heads = c.spec.index_heads;
  return config;
}

// Where an implementation's arguments live: the host tensors themselves, or (CUDA
// implementations in the GPU binary) device copies, read back into the host tensors afterwards.
class Placement {
public:
  explicit Placement(Backend backend) : on_device_(backend == Backend::cuda) {}

  TensorView place(const HostTensor& t) {
#ifdef M3SA_TEST_DEVICE_MEMORY
    if (on_device_ && t.view().present()) {
      const auto [it, fresh] = copies_.try_emplace(t.view().data, t);
      return it->second.view();
    }
#endif
    return t.view();
  }
  BatchMetadata place(const SyntheticBatch& sb) {
    BatchMetadata b = sb.batch();
    b.cu_q_lens = place(sb.cu_q_lens);
    b.seq_lens = place(sb.seq_lens);
    b.block_table = place(sb.block_table);
    return b;
  }
  // The placed copy's contents into `t` (host placement: already there).
  void fetch(const HostTensor& t) {
#ifdef M3SA_TEST_DEVICE_MEMORY
    if (on_device_) {
      const HostTensor got = copies_.at(t.view().data).download();
      std::memcpy(t.view().data, got.view().data, t.bytes());
    }
#else
    (void)t;
#endif
  }
  // A poisoned workspace for `plan`, prepared.
  Workspace workspace(const OpPlan& plan) {
#ifdef M3SA_TEST_DEVICE_MEMORY
    if (on_device_) {
      device_workspace_ = device_workspace(plan);
      EXPECT_TRUE(device_workspace_.status().ok()) << device_workspace_.status().to_string();
      return device_workspace_.workspace();
    }
#endif
    host_workspace_.reset(DType::i32, {static_cast<int64_t>(plan.workspace_bytes / 4 + 1)});
    host_workspace_.fill_bytes(0xcd);
    const Workspace ws{host_workspace_.view().data, plan.workspace_bytes};
    EXPECT_TRUE(prepare_workspace(plan, ws).ok());
    return ws;
  }

private:
  bool on_device_;
  HostTensor host_workspace_;
#ifdef M3SA_TEST_DEVICE_MEMORY
  std::map<const void*, DeviceBuffer> copies_;
  DeviceBuffer device_workspace_;
#endif
};

// One op run by the named implementation: plan, place, run, read back the outputs.
class Runner {
public:
  Runner(const char* implementation, Backend backend, OpKind op, const MsaConfig& config,
         Capacities capacities, DType cache_dtype)
      : placement(backend) {
    request.op = op;
    request.backend = backend;
    request.config = config;
    request.capacities = capacities;
    request.cache_dtype = cache_dtype;
    request.implementation = implementation;
    status = make_plan(request, &plan);
    if (status.ok()) workspace = placement.workspace(plan);
  }
  // Device errors the run flagged (0 on host implementations).
  int32_t device_errors() {
    int32_t flags = -1;
    EXPECT_TRUE(read_device_errors(plan, workspace, {}, &flags).ok());
    return flags;
  }

  PlanRequest request;
  OpPlan plan;
  Status status;
  Placement placement;
  Workspace workspace;
};

std::unique_ptr<Runner> runner(const std::string& implementation, OpKind op,
                               const MsaConfig& config, const SyntheticBatch& sb) {
  Backend backend = Backend::reference;
  for (int i = 0; i < implementation_count(); ++i)
    if (implementation_info(i).name == implementation) backend = implementation_info(i).backend;
  const PlanRequest defaults = plan_request(op, config, sb, {});
  return std::make_unique<Runner>(implementation.c_str(), backend, op, config, sb.capacities(),
                                  defaults.cache_dtype);
}

std::string reference_of(OpKind op) { return std::string("reference.") + to_string(op); }

// Distinct scattered slots (131 is prime to the cache's 128 x pages slots), a padding row every
// fifth token.
HostTensor insert_slots(const SyntheticBatch& sb, int64_t tokens) {
  HostTensor slots(DType::i64, {tokens});
  const int64_t capacity = int64_t{sb.num_pages()} * kBlockTokens;
  for (int64_t t = 0; t < tokens; ++t)
    slots.data<int64_t>()[t] = t % 5 == 4 ? -1 : t * 131 % capacity;
  return slots;
}

class OpImplementation : public ::testing::TestWithParam<Param> {
protected:
  const ImplementationInfo info = implementation_info(GetParam().implementation);
  const Case& test_case = cases()[GetParam().case_index];
  const MsaConfig config = config_of(test_case);

  void check_insert_index_k(const SyntheticBatch& sb);
  void check_indexer(const SyntheticBatch& sb);
  void check_sparse_attention(SyntheticBatch& sb);
  void check_norm_rope_insert(const SyntheticBatch& sb);
};

void OpImplementation::check_insert_index_k(const SyntheticBatch& sb) {
  const int64_t tokens = sb.num_tokens();
  HostTensor rows(DType::bf16, {tokens, kHeadDim});
  Rng rng(11);
  for (int64_t i = 0; i < rows.view().numel(); ++i)
    store(DType::bf16, rows.view().data, i, static_cast<float>(rng.uniform() * 8 - 4));
  const HostTensor slots = insert_slots(sb, tokens);
  const int64_t pages = sb.num_pages();
  HostTensor want(sb.spec().index_dtype, {pages, kBlockTokens, kHeadDim});
  HostTensor got(sb.spec().index_dtype, {pages, kBlockTokens, kHeadDim});
  want.fill_bytes(0x5a);
  got.fill_bytes(0x5a);
  for (const auto& [name, cache] :
       {std::pair{reference_of(info.op), &want}, std::pair{std::string(info.name), &got}}) {
    auto run = runner(name, info.op, config, sb);
    M3SA_ASSERT_OK(run->status);
    Placement& m = run->placement;
    M3SA_ASSERT_OK(insert_index_k(run->plan, {m.place(rows), m.place(slots), m.place(*cache)},
                                  run->workspace));
    m.fetch(*cache);
    EXPECT_EQ(run->device_errors(), 0);
  }
  EXPECT_EQ(compare_ulps(want.view(), got.view()).differing, 0);
}

// score_blocks exactly (integer data: every partial sum exact), selections exactly.
void OpImplementation::check_indexer(const SyntheticBatch& sb) {
  HostTensor scores;
  M3SA_ASSERT_OK(run_score_blocks(config, sb, {Backend::reference}, &scores));
  HostTensor want_topk;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &want_topk));
  auto run = runner(info.name, info.op, config, sb);
  M3SA_ASSERT_OK(run->status);
  Placement& m = run->placement;
  const BatchMetadata batch = m.place(sb);
  HostTensor got(DType::f32, {config.num_index_heads, sb.num_tokens(), sb.width()});
  HostTensor got_topk(DType::i32, {config.num_index_heads, sb.num_tokens(), config.top_k});
  got.fill_bytes(0xff);
  got_topk.fill_bytes(0x5a);
  switch (info.op) {
  case OpKind::score_blocks:
    M3SA_ASSERT_OK(score_blocks(
        run->plan, {m.place(sb.index_q), m.place(sb.index_k_cache), batch, m.place(got)},
        run->workspace));
    m.fetch(got);
    EXPECT_EQ(std::memcmp(got.view().data, scores.view().data, got.bytes()), 0)
        << "scores differ from the reference's";
    break;
  case OpKind::select_topk_blocks:
    M3SA_ASSERT_OK(
        select_topk_blocks(run->plan, {m.place(scores), batch, m.place(got_topk)}, run->workspace));
    break;
  default:
    M3SA_ASSERT_OK(index_topk(
        run->plan, {m.place(sb.index_q), m.place(sb.index_k_cache), batch, m.place(got_topk)},
        run->workspace));
    break;
  }
  EXPECT_EQ(run->device_errors(), 0);
  if (info.op == OpKind::score_blocks) return;
  m.fetch(got_topk);
  const TopkComparison c =
      compare_topk(want_topk.view(), got_topk.view(), scores.view(), ExactTies::bind, 0);
  EXPECT_EQ(c.rows, int64_t{config.num_index_heads} * sb.num_tokens());
  EXPECT_TRUE(c.ok()) << describe(c);
}

void OpImplementation::check_sparse_attention(SyntheticBatch& sb) {
  sb.fill_attention_random(5);
  HostTensor topk, want_out, want_lse;
  M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &topk));
  M3SA_ASSERT_OK(
      run_sparse_attention(config, sb, topk, {Backend::reference}, &want_out, &want_lse));
  auto run = runner(info.name, info.op, config, sb);
  M3SA_ASSERT_OK(run->status);
  Placement& m = run->placement;
  HostTensor out(DType::bf16, {sb.num_tokens(), sb.spec().q_heads, kHeadDim});
  HostTensor lse(DType::f32, {sb.num_tokens(), sb.spec().q_heads});
  out.fill_bytes(0xff);
  lse.fill_bytes(0xff);
  SparseAttentionArgs args = attention_args(sb, topk, out, lse, true);
  args.q = m.place(sb.q), args.k_cache = m.place(sb.k_cache), args.v_cache = m.place(sb.v_cache);
  args.topk = m.place(topk), args.batch = m.place(sb);
  args.kv_block_table = m.place(sb.kv_block_table);
  args.out = m.place(out), args.lse = m.place(lse);
  M3SA_ASSERT_OK(sparse_attention(run->plan, args, run->workspace));
  m.fetch(out);
  m.fetch(lse);
  EXPECT_EQ(run->device_errors(), 0);
  const AttentionComparison c =
      compare_attention(want_out.view(), out.view(), want_lse.view(), lse.view());
  const bool gpu = implementation_info(GetParam().implementation).backend == Backend::cuda;
  EXPECT_TRUE(gpu ? c.ok(kGpuAttentionRelativeL2, kGpuAttentionLse) : c.ok()) << describe(c);
}

void OpImplementation::check_norm_rope_insert(const SyntheticBatch& sb) {
  NormRopeSpec spec;
  spec.tokens = sb.num_tokens();
  spec.q_heads = sb.spec().q_heads;
  spec.kv_heads = sb.spec().kv_heads;
  spec.index_heads = sb.spec().index_heads;
  spec.kv_dtype = sb.spec().kv_dtype;
  spec.index_dtype = sb.spec().index_dtype;
  spec.kv_pages = spec.index_pages = (spec.tokens + kBlockTokens - 1) / kBlockTokens;
  const NormRopeBatch want(spec), got(spec);
  want.poison_outputs(); // both start from the same poisoned caches
  got.poison_outputs();
  M3SA_ASSERT_OK(run_norm_rope_insert(config, want, Backend::reference));
  auto run = std::make_unique<Runner>(info.name, info.backend, info.op, config,
                                      Capacities{1, spec.tokens, 1}, spec.index_dtype);
  M3SA_ASSERT_OK(run->status);
  Placement& m = run->placement;
  NormRopeInsertArgs a = got.args();
  a.q = m.place(got.q), a.k = m.place(got.k), a.v = m.place(got.v);
  a.index_q = m.place(got.index_q), a.index_k = m.place(got.index_k);
  a.positions = m.place(got.positions);
  a.q_norm_weight = m.place(got.weights[0]), a.k_norm_weight = m.place(got.weights[1]);
  a.index_q_norm_weight = m.place(got.weights[2]);
  a.index_k_norm_weight = m.place(got.weights[3]);
  a.cos_sin_cache = m.place(got.cos_sin_cache);
  a.slot_mapping = m.place(got.slot_mapping);
  a.index_slot_mapping = m.place(got.index_slot_mapping);
  const HostTensor* outputs[] = {&got.q_out, &got.k_cache, &got.v_cache, &got.index_q_out,
                                 &got.index_k_cache};
  a.q_out = m.place(got.q_out), a.k_cache = m.place(got.k_cache);
  a.v_cache = m.place(got.v_cache), a.index_q_out = m.place(got.index_q_out);
  a.index_k_cache = m.place(got.index_k_cache);
  M3SA_ASSERT_OK(norm_rope_insert(run->plan, a, run->workspace));
  for (const HostTensor* t : outputs) m.fetch(*t);
  EXPECT_EQ(run->device_errors(), 0);
  const HostTensor* wanted[] = {&want.q_out, &want.k_cache, &want.v_cache, &want.index_q_out,
                                &want.index_k_cache};
  for (int i = 0; i < 5; ++i) {
    const UlpComparison c = compare_ulps(wanted[i]->view(), outputs[i]->view(), 0x1p-12);
    EXPECT_EQ(c.outside, 0) << "output " << i << ": " << c.to_string();
  }
}

TEST_P(OpImplementation, MatchesTheReference) {
  PlanRequest request;
  request.op = info.op;
  request.config = config;
  request.cache_dtype =
      info.op == OpKind::sparse_attention ? test_case.spec.kv_dtype : test_case.spec.index_dtype;
  if (const Status s = implementation_supports(GetParam().implementation, request); !s.ok())
    GTEST_SKIP() << s.message();
  SyntheticBatch sb(test_case.spec);
  sb.fill_index_integers(3, -4, 4);
  switch (info.op) {
  case OpKind::insert_index_k:
    return check_insert_index_k(sb);
  case OpKind::score_blocks:
  case OpKind::select_topk_blocks:
  case OpKind::index_topk:
    return check_indexer(sb);
  case OpKind::sparse_attention:
    return check_sparse_attention(sb);
  case OpKind::norm_rope_insert:
    return check_norm_rope_insert(sb);
  }
}

// The CPU binary runs every implementation (CUDA ones skip there); the GPU binary the CUDA ones.
std::vector<Param> params() {
  std::vector<Param> all;
  for (int i = 0; i < implementation_count(); ++i) {
#ifdef M3SA_TEST_GPU_BINARY
    if (implementation_info(i).backend != Backend::cuda) continue;
#endif
    for (int c = 0; c < static_cast<int>(cases().size()); ++c) all.push_back({i, c});
  }
  return all;
}

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  std::string name = implementation_info(p.param.implementation).name;
  for (char& ch : name)
    if (ch == '.') ch = '_';
  return name + "__" + cases()[p.param.case_index].name;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OpImplementation); // a build without CUDA
INSTANTIATE_TEST_SUITE_P(Implementations, OpImplementation, ::testing::ValuesIn(params()),
                         param_name);

} // namespace
} // namespace m3sa::testing
