// The decode layer (index_topk -> sparse_attention) as an engine runs it: captured once in a CUDA
// graph and replayed thousands of times on inputs rewritten in place between replays, and run
// from two host threads at once on independent plans, workspaces and streams. Each result must
// equal, bit for bit, an eager run on the same inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"

namespace m3sa::testing {
namespace {

MsaConfig layer_config(int kv_heads) {
  MsaConfig c;
  c.num_index_heads = kv_heads, c.top_k = 16, c.local_blocks = 1;
  return c;
}

// Decode requests (q_len 1) with GQA q_heads / kv_heads, index and attention data from `seed`.
SyntheticBatch decode_layer_batch(std::vector<int32_t> seq_lens, int q_heads, int kv_heads,
                                  uint64_t seed) {
  BatchSpec s;
  s.seq_lens = std::move(seq_lens);
  s.q_lens.assign(s.seq_lens.size(), 1);
  s.num_decode = static_cast<int>(s.seq_lens.size());
  s.index_heads = kv_heads, s.q_heads = q_heads, s.kv_heads = kv_heads;
  s.seed = seed;
  SyntheticBatch sb(s);
  sb.fill_index_random(seed);
  sb.fill_attention_random(seed + 1);
  return sb;
}

// A batch's layer inputs and outputs on the device, with the two plans and their workspaces.
struct DeviceLayer {
  DeviceBatch index;
  DeviceBuffer q, k_cache, v_cache, kv_block_table, topk, out, lse;
  CudaRun index_run, attention_run;
  explicit DeviceLayer(const SyntheticBatch& sb)
      : index(sb), q(sb.q), k_cache(sb.k_cache), v_cache(sb.v_cache),
        kv_block_table(sb.kv_block_table),
        topk(DType::i32, {sb.spec().kv_heads, sb.num_tokens(), 16}, 0x5a),
        out(DType::bf16, {sb.num_tokens(), sb.spec().q_heads, kHeadDim}, 0xff),
        lse(DType::f32, {sb.num_tokens(), sb.spec().q_heads}, 0xff),
        index_run(cuda_run(plan_request(OpKind::index_topk, layer_config(sb.spec().kv_heads), sb,
                                        {Backend::cuda}))),
        attention_run(cuda_run(plan_request(
            OpKind::sparse_attention, layer_config(sb.spec().kv_heads), sb, {Backend::cuda}))) {}

  // The inputs a step rewrites: what changes between decode steps of an engine.
  std::vector<const DeviceBuffer*> inputs() const {
    return {&index.seq_lens, &index.block_table, &index.index_q, &index.index_k_cache, &q,
            &k_cache,        &v_cache,           &kv_block_table};
  }

  Status run(cudaStream_t stream) const {
    M3SA_RETURN_IF_ERROR(
        index_topk(index_run.plan,
                   {index.index_q.view(), index.index_k_cache.view(), index.batch(), topk.view()},
                   index_run.workspace.workspace(), {0, stream}));
    SparseAttentionArgs a;
    a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
    a.topk = topk.view(), a.batch = index.batch(), a.kv_block_table = kv_block_table.view();
    a.out = out.view(), a.lse = lse.view();
    return sparse_attention(attention_run.plan, a, attention_run.workspace.workspace(),
                            {0, stream});
  }

  // topk | out | lse, concatenated: one comparison per step.
  std::vector<uint8_t> outputs() const {
    std::vector<uint8_t> bytes(topk.bytes() + out.bytes() + lse.bytes());
    EXPECT_TRUE(topk.download(bytes.data(), topk.bytes()).ok());
    EXPECT_TRUE(out.download(bytes.data() + topk.bytes(), out.bytes()).ok());
    EXPECT_TRUE(lse.download(bytes.data() + topk.bytes() + out.bytes(), lse.bytes()).ok());
    return bytes;
  }

  int32_t flags() const { return device_flags(index_run) | device_flags(attention_run); }
};

// Copies `from`'s inputs into `to`'s (same shapes) on `stream`.
Status rewrite_inputs(const DeviceLayer& to, const DeviceLayer& from, cudaStream_t stream) {
  const auto dst = to.inputs(), src = from.inputs();
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i]->bytes() != src[i]->bytes())
      return Status::invalid_argument("rewrite_inputs", "data sets of one shape", "another");
    M3SA_RETURN_IF_ERROR(
        cuda::cuda_status(cudaMemcpyAsync(dst[i]->data(), src[i]->data(), src[i]->bytes(),
                                          cudaMemcpyDeviceToDevice, stream),
                          "cudaMemcpyAsync"));
  }
  return {};
}

// Four data sets of one shape: other keys, queries, pages and, within a block, lengths (each
// seq_len below stays in its last block, so every set has the same pages and table width).
std::vector<SyntheticBatch> decode_data_sets(uint64_t seed) {
  std::vector<SyntheticBatch> sets;
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> lens = {5000, 1000, 140, 7000, 300, 4100, 2500, 70};
    for (int32_t& len : lens) len -= s;
    sets.push_back(decode_layer_batch(lens, 16, 1, seed + 10 * s));
  }
  return sets;
}

TEST(GpuRobustness, TenThousandGraphReplaysOnRewrittenInputsEqualEagerRuns) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<SyntheticBatch> sets = decode_data_sets(seed);
  std::vector<std::unique_ptr<DeviceLayer>> staged;
  for (const SyntheticBatch& sb : sets) staged.push_back(std::make_unique<DeviceLayer>(sb));
  const DeviceLayer live(sets[0]); // the buffers the graph reads and writes
  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<std::vector<uint8_t>> eager;
  for (const auto& set : staged) {
    M3SA_ASSERT_OK(rewrite_inputs(live, *set, stream));
    M3SA_ASSERT_OK(live.run(stream));
    M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    eager.push_back(live.outputs());
  }
  ASSERT_NE(eager[0], eager[1]) << "the data sets must give different results";

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status captured = live.run(stream);
  M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  M3SA_ASSERT_OK(captured);
  M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  int mismatched = 0, first_mismatch = -1;
  for (int i = 0; i < 10000; ++i) {
    const int s = (i * 7 + i / 4) % 4; // every set follows every other one
    M3SA_ASSERT_OK(rewrite_inputs(live, *staged[s], stream));
    M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    if (live.outputs() != eager[s]) {
      ++mismatched;
      if (first_mismatch < 0) first_mismatch = i;
    }
  }
  EXPECT_EQ(mismatched, 0) << "first at replay " << first_mismatch;
  EXPECT_EQ(live.flags(), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuRobustness, TwoHostThreadsOnIndependentPlansEqualSequentialRuns) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Different shapes and head configurations (TP1 64/4 and TP4 16/1), so the plans differ too.
  const SyntheticBatch batches[2] = {
      decode_layer_batch({9000, 300, 33000, 128}, 64, 4, seed),
      decode_layer_batch({70000, 5, 2000, 12000, 640, 1}, 16, 1, seed + 1)};
  std::vector<std::unique_ptr<DeviceLayer>> layers;
  std::vector<std::vector<uint8_t>> sequential;
  for (const SyntheticBatch& sb : batches) {
    layers.push_back(std::make_unique<DeviceLayer>(sb));
    M3SA_ASSERT_OK(layers.back()->run(nullptr));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    sequential.push_back(layers.back()->outputs());
  }
  int mismatched[2] = {0, 0};
  Status failed[2];
  const auto worker = [&](int w) {
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      failed[w] = Status::invalid_argument("stream", "created", "an error");
      return;
    }
    for (int i = 0; i < 200 && failed[w].ok(); ++i) {
      failed[w] = layers[w]->run(stream);
      if (failed[w].ok())
        failed[w] = cuda::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (failed[w].ok() && layers[w]->outputs() != sequential[w]) ++mismatched[w];
    }
    cudaStreamDestroy(stream);
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join(), b.join();
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(failed[w].ok()) << "thread " << w << ": " << failed[w].to_string();
    EXPECT_EQ(mismatched[w], 0) << "thread " << w;
    EXPECT_EQ(layers[w]->flags(), 0) << "thread " << w;
  }
}

} // namespace
} // namespace m3sa::testing
