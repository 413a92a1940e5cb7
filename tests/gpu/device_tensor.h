#pragma once
// Device copies of host test tensors (cudaMalloc; freed on destruction) and checked CUDA calls.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "m3sa/ops.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {

#define M3SA_CUDA_ASSERT(expr)                                                                     \
  do {                                                                                             \
    const cudaError_t m3sa_cuda_error_ = (expr);                                                   \
    ASSERT_EQ(m3sa_cuda_error_, cudaSuccess)                                                       \
        << #expr << ": " << cudaGetErrorString(m3sa_cuda_error_);                                  \
  } while (0)

class DeviceTensor {
public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host) { upload_new(host); }
  DeviceTensor(DType dtype, std::initializer_list<int64_t> shape, uint8_t fill_byte) {
    HostTensor h(dtype, shape);
    h.fill_bytes(fill_byte);
    upload_new(h);
  }
  TensorView view() const { return view_; }
  size_t bytes() const { return bytes_; }
  void upload(const HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(view_.data, host.view().data, bytes_, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void fill(uint8_t byte) const { EXPECT_EQ(cudaMemset(view_.data, byte, bytes_), cudaSuccess); }
  HostTensor download() const {
    HostTensor h;
    h = shaped_like();
    EXPECT_EQ(cudaMemcpy(h.view().data, view_.data, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

private:
  struct Free {
    void operator()(void* p) const { cudaFree(p); }
  };
  void upload_new(const HostTensor& host) {
    view_ = host.view();
    bytes_ = host.bytes();
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes_ ? bytes_ : 16), cudaSuccess);
    storage_ = std::shared_ptr<void>(p, Free{});
    view_.data = p;
    view_.device = {DeviceKind::cuda, 0};
    upload(host);
  }
  HostTensor shaped_like() const {
    HostTensor h;
    switch (view_.rank) {
    case 1:
      h.reset(view_.dtype, {view_.shape[0]});
      break;
    case 2:
      h.reset(view_.dtype, {view_.shape[0], view_.shape[1]});
      break;
    case 3:
      h.reset(view_.dtype, {view_.shape[0], view_.shape[1], view_.shape[2]});
      break;
    default:
      h.reset(view_.dtype, {view_.shape[0], view_.shape[1], view_.shape[2], view_.shape[3]});
      break;
    }
    return h;
  }
  std::shared_ptr<void> storage_{nullptr, Free{}};
  size_t bytes_ = 0;
  TensorView view_;
};

// A device workspace for a plan: poisoned, then prepared as the API asks (`prepare` false: left
// unprepared, for the test that checks this is reported).
class DeviceWorkspace {
public:
  explicit DeviceWorkspace(const OpPlan& plan, bool prepare = true) : bytes_(plan.workspace_bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes_ ? bytes_ : 64), cudaSuccess);
    storage_.reset(p);
    EXPECT_EQ(cudaMemset(p, 0xcd, bytes_ ? bytes_ : 64), cudaSuccess);
    if (prepare) {
      const Status s = prepare_workspace(plan, get());
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
  }
  Workspace get() const { return {storage_.get(), bytes_}; }

private:
  struct Free {
    void operator()(void* p) const { cudaFree(p); }
  };

  std::unique_ptr<void, Free> storage_;
  size_t bytes_;
};

// A CUDA plan with its prepared device workspace.
struct CudaRun {
  OpPlan plan;
  std::unique_ptr<DeviceWorkspace> workspace;
};

inline CudaRun cuda_run(const PlanRequest& request) {
  CudaRun run;
  const Status s = make_plan(request, &run.plan);
  EXPECT_TRUE(s.ok()) << s.to_string();
  run.workspace = std::make_unique<DeviceWorkspace>(run.plan);
  return run;
}

// The run's device error flags (read_device_errors also clears them).
inline int32_t device_flags(const CudaRun& run) {
  int32_t flags = -1;
  const Status s = read_device_errors(run.plan, run.workspace->get(), {}, &flags);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return flags;
}

} // namespace m3sa::testing
