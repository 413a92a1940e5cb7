// GPU suite: runs on a machine with a CUDA device and the CUDA backend; skips with the reason
// elsewhere.
#include <gtest/gtest.h>

#include "support/test_util.h"

namespace m3sa::testing {
namespace {

TEST(GpuCudaBackend, CapabilityQueryMatchesTheDeviceAndBuild) {
  M3SA_SKIP_WITHOUT_CUDA();
  // With a device present, the answer comes from the capability table.
  for (OpKind op : {OpKind::insert_index_k, OpKind::score_blocks, OpKind::select_topk_blocks,
                    OpKind::index_topk})
    EXPECT_TRUE(supports(Backend::cuda, op, MsaConfig{}).ok()) << to_string(op);
  const Status s = supports(Backend::cuda, OpKind::sparse_attention, MsaConfig{});
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
}

} // namespace
} // namespace m3sa::testing
