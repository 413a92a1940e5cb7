#pragma once
// The index branch of a SyntheticBatch on the device.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

struct DeviceBatch {
  DeviceBuffer cu_q_lens, seq_lens, block_table, index_q, index_k_cache;
  int num_requests, num_decode, decode_q_len, num_tokens;
  explicit DeviceBatch(const SyntheticBatch& sb)
      : cu_q_lens(sb.cu_q_lens), seq_lens(sb.seq_lens), block_table(sb.block_table),
        index_q(sb.index_q), index_k_cache(sb.index_k_cache), num_requests(sb.batch().num_requests),
        num_decode(sb.spec().num_decode), decode_q_len(sb.spec().decode_q_len),
        num_tokens(sb.num_tokens()) {}
  BatchMetadata batch() const {
    return {cu_q_lens.view(), seq_lens.view(), block_table.view(), num_requests,
            num_decode,       decode_q_len,    num_tokens};
  }
};

// `calls` back-to-back calls `enqueue(i, out_i, stream)` (each a Status) captured in one CUDA
// graph, call i writing its own [topk_shape] output ([topk_shape_b] for odd i where given: batches
// of different sizes); after each of `replays` replays, output i must equal want_a (even i) or
// want_b (odd). A call that reads what the previous call left in a
// shared workspace or buffer before rewriting it - programmatic dependent launch starts each early
// - writes the other set's result.
template <typename Enqueue>
void expect_graph_of_alternating_results(Enqueue&& enqueue, const HostTensor& want_a,
                                         const HostTensor& want_b,
                                         std::initializer_list<int64_t> topk_shape, int calls,
                                         int replays = 5,
                                         std::initializer_list<int64_t> topk_shape_b = {}) {
  std::vector<DeviceBuffer> outputs;
  for (int i = 0; i < calls; ++i)
    outputs.emplace_back(DType::i32,
                         i % 2 == 1 && topk_shape_b.size() > 0 ? topk_shape_b : topk_shape, 0x5a);
  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  Status captured;
  for (int i = 0; i < calls && captured.ok(); ++i) captured = enqueue(i, outputs[i].view(), stream);
  M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  M3SA_ASSERT_OK(captured);
  M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < replays; ++replay) {
    for (DeviceBuffer& out : outputs) M3SA_ASSERT_OK(out.fill(0x5a));
    M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    for (int i = 0; i < calls; ++i)
      ASSERT_TRUE(same_bytes(i % 2 == 0 ? want_a : want_b, outputs[i].download()))
          << "replay " << replay << ", call " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The same for index_topk on run's one workspace, alternating the data sets `a` and `b` (b's
// output [topk_shape_b] where given); the device flags stay 0.
inline void expect_graph_of_alternating_calls(const CudaRun& run, const DeviceBatch& a,
                                              const DeviceBatch& b, const HostTensor& want_a,
                                              const HostTensor& want_b,
                                              std::initializer_list<int64_t> topk_shape, int calls,
                                              std::initializer_list<int64_t> topk_shape_b = {}) {
  expect_graph_of_alternating_results(
      [&](int i, const TensorView& out, cudaStream_t stream) {
        const DeviceBatch& d = i % 2 == 0 ? a : b;
        return index_topk(run.plan, {d.index_q.view(), d.index_k_cache.view(), d.batch(), out},
                          run.workspace.workspace(), {0, stream});
      },
      want_a, want_b, topk_shape, calls, 5, topk_shape_b);
  EXPECT_EQ(device_flags(run), 0);
}

} // namespace m3sa::testing
