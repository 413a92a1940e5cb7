#pragma once
// GPU-test plumbing over the shared device buffer (testing/device_buffer.h): the tests' CUDA
// check, and a CUDA plan with its prepared device workspace.
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda/cuda_status.h"
#include "support/test_util.h"
#include "testing/device_buffer.h"
#include "testing/synthetic_batch.h"

namespace m3sa::testing {

// The library's CUDA check (cuda/cuda_status.h) as a test assertion.
#define M3SA_CUDA_ASSERT(expr) M3SA_ASSERT_OK(::m3sa::cuda::cuda_status((expr), #expr))

// A CUDA plan with its prepared device workspace.
// Compute capability 9.0 exactly: the sm_90a implementations must run there.
inline bool on_hopper() {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess &&
         major == 9 && minor == 0;
}

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

// A plan of `request` by its named implementation (request.implementation), or false when that
// cannot run here (printed; on a Hopper GPU every CUDA implementation must run).
inline bool plan_named_implementation(const PlanRequest& request, CudaRun* run) {
  const Status s = make_plan(request, &run->plan);
  if (!s.ok()) {
    std::printf("[ skip %s ] %s\n", request.implementation, s.to_string().c_str());
    EXPECT_FALSE(on_hopper()) << request.implementation << " must run on compute capability 9.0";
    return false;
  }
  run->workspace = device_workspace(run->plan);
  EXPECT_TRUE(run->workspace.status().ok()) << run->workspace.status().to_string();
  return true;
}

// The run's device error flags (read_device_errors also clears them).
inline int32_t device_flags(const CudaRun& run) {
  int32_t flags = -1;
  const Status s = read_device_errors(run.plan, run.workspace.workspace(), {}, &flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return flags;
}

// The indexer oracle of a GPU test: fills sb's index data (integers: every sum exact, so results
// must match bit for bit; else random) and runs index_topk and score_blocks on the reference
// (small batches) or the CPU backend, which the cpu suite holds to the reference.
struct IndexerOracle {
  Backend backend;
  HostTensor topk, scores;
};
inline IndexerOracle indexer_oracle(const MsaConfig& config, SyntheticBatch& sb, uint64_t seed,
                                    bool integers, bool use_reference) {
  if (integers)
    sb.fill_index_integers(seed, -3, 3);
  else
    sb.fill_index_random(seed);
  IndexerOracle o{use_reference ? Backend::reference : Backend::cpu, {}, {}};
  const RunOptions options{o.backend};
  EXPECT_TRUE(run_index_topk(config, sb, options, &o.topk).ok());
  EXPECT_TRUE(run_score_blocks(config, sb, options, &o.scores).ok());
  return o;
}

} // namespace m3sa::testing
