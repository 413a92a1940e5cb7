// GPU suite: runs on a machine with a CUDA device and the CUDA backend; skips with the reason
// elsewhere.
#include <gtest/gtest.h>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

TEST(GpuCudaBackend, CapabilityQueryMatchesTheDeviceAndBuild) {
  M3SA_SKIP_WITHOUT_CUDA();
  // With a device present, every op of the pipeline has a CUDA implementation; reduce_heads
  // (HuggingFace parity) has none.
  for (OpKind op : kEveryOp)
    EXPECT_TRUE(supports(Backend::cuda, op, MsaConfig{}).ok()) << to_string(op);
  EXPECT_TRUE(supports(Backend::cuda, MsaConfig{}, DType::fp8_e4m3).ok());
  MsaConfig reduce;
  reduce.reduce_heads = true;
  const Status s = supports(Backend::cuda, OpKind::index_topk, reduce);
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
}

} // namespace
} // namespace m3sa::testing
