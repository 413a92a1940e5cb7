#pragma once
// GPU-test plumbing over the shared device buffer (testing/device_buffer.h): the tests' CUDA
// check, and a CUDA plan with its prepared device workspace.
#include <gtest/gtest.h>

#include "cuda/cuda_status.h"
#include "support/test_util.h"
#include "testing/device_buffer.h"

namespace m3sa::testing {

// The library's CUDA check (cuda/cuda_status.h) as a test assertion.
#define M3SA_CUDA_ASSERT(expr) M3SA_ASSERT_OK(::m3sa::cuda::cuda_status((expr), #expr))

// A CUDA plan with its prepared device workspace.
struct CudaRun {
  OpPlan plan;
  DeviceBuffer workspace;
};

inline CudaRun cuda_run(const PlanRequest& request) {
  CudaRun run;
  const Status s = make_plan(request, &run.plan);
  EXPECT_TRUE(s.ok()) << s.to_string();
  run.workspace = device_workspace(run.plan);
  EXPECT_TRUE(run.workspace.status().ok()) << run.workspace.status().to_string();
  return run;
}

// The run's device error flags (read_device_errors also clears them).
inline int32_t device_flags(const CudaRun& run) {
  int32_t flags = -1;
  const Status s = read_device_errors(run.plan, run.workspace.workspace(), {}, &flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return flags;
}

} // namespace m3sa::testing
