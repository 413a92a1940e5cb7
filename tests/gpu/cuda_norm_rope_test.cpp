// norm_rope_insert on CUDA: bit-identical to the CPU backend on every output (they share the fp32
// operation order, common/norm_rope_math.h), in place or not, with computed or tabled cos/sin;
// device-side flags for positions and slots the host did not check; graph capture.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu/cuda_test_util.h"
#include "support/test_util.h"
#include "testing/norm_rope_batch.h"

namespace m3sa::testing {
namespace {

// A NormRopeBatch mirrored on the device (outputs poisoned like the host copy).
struct DeviceNormRope {
  DeviceBuffer q, k, v, index_q, index_k, positions, weights[4], cos_sin_cache, slot_mapping,
      index_slot_mapping, q_out, k_cache, v_cache, index_q_out, index_k_cache;
  const NormRopeBatch& host;
  explicit DeviceNormRope(const NormRopeBatch& b)
      : q(b.q), k(b.k), v(b.v), index_q(b.index_q), index_k(b.index_k),
        positions(b.positions), weights{DeviceBuffer(b.weights[0]), DeviceBuffer(b.weights[1]),
                                        DeviceBuffer(b.weights[2]), DeviceBuffer(b.weights[3])},
        slot_mapping(b.slot_mapping), index_slot_mapping(b.index_slot_mapping), q_out(b.q_out),
        k_cache(b.k_cache), v_cache(b.v_cache), index_q_out(b.index_q_out),
        index_k_cache(b.index_k_cache), host(b) {
    if (b.cos_sin_cache.bytes()) cos_sin_cache = DeviceBuffer(b.cos_sin_cache);
  }
  NormRopeInsertArgs args(bool in_place) const {
    NormRopeInsertArgs a = host.args(in_place); // scalars and shapes; pointers replaced below
    const auto on_device = [](TensorView view, const DeviceBuffer& d) {
      view.data = d.view().data;
      view.device = d.view().device;
      return view;
    };
    a.q = on_device(a.q, q), a.k = on_device(a.k, k), a.v = on_device(a.v, v);
    a.index_q = on_device(a.index_q, index_q), a.index_k = on_device(a.index_k, index_k);
    a.positions = on_device(a.positions, positions);
    a.q_norm_weight = on_device(a.q_norm_weight, weights[0]);
    a.k_norm_weight = on_device(a.k_norm_weight, weights[1]);
    a.index_q_norm_weight = on_device(a.index_q_norm_weight, weights[2]);
    a.index_k_norm_weight = on_device(a.index_k_norm_weight, weights[3]);
    if (a.cos_sin_cache.present()) a.cos_sin_cache = on_device(a.cos_sin_cache, cos_sin_cache);
    a.slot_mapping = on_device(a.slot_mapping, slot_mapping);
    a.index_slot_mapping = on_device(a.index_slot_mapping,
                                     host.spec().shared_slots ? slot_mapping : index_slot_mapping);
    a.q_out = in_place ? a.q : on_device(a.q_out, q_out);
    a.k_cache = on_device(a.k_cache, k_cache), a.v_cache = on_device(a.v_cache, v_cache);
    a.index_q_out = in_place ? a.index_q : on_device(a.index_q_out, index_q_out);
    a.index_k_cache = on_device(a.index_k_cache, index_k_cache);
    return a;
  }
};

CudaRun plan_norm_rope(const MsaConfig& config, const NormRopeSpec& spec) {
  PlanRequest request;
  request.op = OpKind::norm_rope_insert;
  request.backend = Backend::cuda;
  request.config = config;
  request.config.num_index_heads = spec.index_heads;
  request.capacities = {1, spec.tokens, 1};
  request.cache_dtype = spec.index_dtype;
  return cuda_run(request);
}

struct CudaNormRopeCase {
  const char* name;
  NormRopeSpec spec;
  bool in_place;
};
void PrintTo(const CudaNormRopeCase& c, std::ostream* os) { *os << c.name; }

std::vector<CudaNormRopeCase> cuda_cases() {
  NormRopeSpec m3; // MiniMax-M3 at TP1, 2000 tokens at positions up to 1M
  m3.q_heads = 64, m3.kv_heads = 4, m3.index_heads = 4, m3.tokens = 2000;
  m3.kv_pages = 20, m3.index_pages = 20;
  NormRopeSpec m3_fp8 = m3;
  m3_fp8.kv_dtype = DType::fp8_e4m3, m3_fp8.index_dtype = DType::fp8_e4m3;
  m3_fp8.k_scale = 0.25f, m3_fp8.v_scale = 3.f;
  NormRopeSpec table_bf16 = m3;
  table_bf16.table_rows = 70000, table_bf16.index_dtype = DType::fp8_e4m3;
  NormRopeSpec table_f32 = table_bf16;
  table_f32.table_dtype = DType::f32, table_f32.weight_dtype = DType::f32;
  table_f32.shared_slots = true, table_f32.index_dtype = DType::bf16;
  NormRopeSpec small; // odd head counts: rows of a warp's two halves differ in kind
  small.q_heads = 3, small.kv_heads = 1, small.index_heads = 1, small.tokens = 37;
  return {{"M3Bf16", m3, false},
          {"M3Fp8KvFp8Index", m3_fp8, false},
          {"M3InPlace", m3, true},
          {"Bf16TableFp8Index", table_bf16, false},
          {"F32TableF32Weights", table_f32, false},
          {"SmallOddHeads", small, false}};
}

class GpuNormRope : public ::testing::TestWithParam<CudaNormRopeCase> {};

TEST_P(GpuNormRope, BitIdenticalToTheCpuBackend) {
  M3SA_SKIP_WITHOUT_CUDA();
  const CudaNormRopeCase& c = GetParam();
  NormRopeSpec spec = c.spec;
  spec.seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(spec.seed));
  const MsaConfig config;
  const NormRopeBatch want(spec), input(spec);
  M3SA_ASSERT_OK(run_norm_rope_insert(config, want, Backend::cpu, 0, c.in_place));
  const DeviceNormRope d(input);
  CudaRun run = plan_norm_rope(config, spec);
  M3SA_ASSERT_OK(norm_rope_insert(run.plan, d.args(c.in_place), run.workspace.workspace()));
  M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(device_flags(run), 0);
  const HostTensor& want_q = c.in_place ? want.q : want.q_out;
  const HostTensor& want_iq = c.in_place ? want.index_q : want.index_q_out;
  EXPECT_TRUE(same_bytes(want_q, (c.in_place ? d.q : d.q_out).download())) << "q_out";
  EXPECT_TRUE(same_bytes(want_iq, (c.in_place ? d.index_q : d.index_q_out).download()))
      << "index_q_out";
  EXPECT_TRUE(same_bytes(want.k_cache, d.k_cache.download())) << "k_cache";
  EXPECT_TRUE(same_bytes(want.v_cache, d.v_cache.download())) << "v_cache";
  EXPECT_TRUE(same_bytes(want.index_k_cache, d.index_k_cache.download())) << "index_k_cache";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuNormRope, ::testing::ValuesIn(cuda_cases()),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(GpuNormRopeSmall, DevicePositionsAndSlotsOutOfRangeAreFlaggedNotWritten) {
  M3SA_SKIP_WITHOUT_CUDA();
  NormRopeSpec spec;
  spec.tokens = 8, spec.padding_every = 0;
  const NormRopeBatch b(spec);
  b.positions.data<int64_t>()[2] = int64_t{1} << 24;    // token 2: nothing written
  b.slot_mapping.data<int64_t>()[5] = 4 * kBlockTokens; // token 5: its KV rows skipped
  const DeviceNormRope d(b);
  CudaRun run = plan_norm_rope(MsaConfig{}, spec);
  M3SA_ASSERT_OK(norm_rope_insert(run.plan, d.args(false), run.workspace.workspace()));
  EXPECT_EQ(device_flags(run), 16 | 4);
  const HostTensor q_out = d.q_out.download();
  const uint8_t* row2 = q_out.data<uint8_t>() + 2 * spec.q_heads * kHeadDim * 2;
  EXPECT_TRUE(std::all_of(row2, row2 + spec.q_heads * kHeadDim * 2,
                          [](uint8_t byte) { return byte == 0x5a; }));
}

TEST(GpuNormRopeSmall, CapturedRunReplaysOnRewrittenPositionsAndSlots) {
  M3SA_SKIP_WITHOUT_CUDA();
  NormRopeSpec spec;
  spec.tokens = 300, spec.kv_pages = 3, spec.index_pages = 3;
  spec.seed = test_seed();
  const NormRopeBatch first(spec);
  spec.seed += 1;
  const NormRopeBatch second(spec);
  const DeviceNormRope d(first);
  CudaRun run = plan_norm_rope(MsaConfig{}, spec);
  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status captured =
      norm_rope_insert(run.plan, d.args(false), run.workspace.workspace(), {0, stream});
  M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  M3SA_ASSERT_OK(captured);
  M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  // Every input (weights too) rewritten in place with the second batch's values, then replayed.
  for (auto [dev, host] : {std::pair{&d.q, &second.q},
                           {&d.k, &second.k},
                           {&d.v, &second.v},
                           {&d.index_q, &second.index_q},
                           {&d.index_k, &second.index_k},
                           {&d.positions, &second.positions},
                           {&d.slot_mapping, &second.slot_mapping},
                           {&d.index_slot_mapping, &second.index_slot_mapping}})
    M3SA_EXPECT_OK(dev->upload(*host));
  for (int i = 0; i < 4; ++i) M3SA_EXPECT_OK(d.weights[i].upload(second.weights[i]));
  M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  M3SA_ASSERT_OK(run_norm_rope_insert(MsaConfig{}, second, Backend::cpu));
  EXPECT_TRUE(same_bytes(second.q_out, d.q_out.download()));
  EXPECT_TRUE(same_bytes(second.index_q_out, d.index_q_out.download()));
  // The caches too, whole: written at the second batch's slots, the rest still the sentinel that
  // both the device copy of `first` and `second`'s host caches start from.
  EXPECT_TRUE(same_bytes(second.k_cache, d.k_cache.download()));
  EXPECT_TRUE(same_bytes(second.v_cache, d.v_cache.download()));
  EXPECT_TRUE(same_bytes(second.index_k_cache, d.index_k_cache.download()));
  EXPECT_EQ(device_flags(run), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

} // namespace
} // namespace m3sa::testing
