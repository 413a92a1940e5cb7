#pragma once
// The one device buffer of the tests, the demo and the bench (CUDA builds only: compiled into
// m3sa_testing where M3SA_HAVE_CUDA): move-only, owns one cudaMalloc allocation, remembers the
// tensor it was made from, and copies in and out with checked calls. Every fallible call returns
// a Status (cuda/cuda_status.h: the one CUDA check); construction keeps its Status in status().
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cuda/cuda_status.h"
#include "m3sa/m3sa.h"
#include "testing/host_tensor.h"

namespace m3sa::testing {

class DeviceBuffer;
// A poisoned (0xcd) device workspace for `plan`, prepared as the API asks unless `prepare` is
// false (for the test that checks this is reported); the first failure is in status().
DeviceBuffer device_workspace(const OpPlan& plan, bool prepare = true, ExecContext ctx = {});

class DeviceBuffer {
public:
  DeviceBuffer() = default;
  // `bytes` of uninitialised device memory (at least 64 are allocated, so a zero-byte buffer
  // still has an address); view() is absent, views come from view(dtype, shape).
  explicit DeviceBuffer(size_t bytes);
  // A device copy of a contiguous host tensor; view() has its dtype and shape.
  explicit DeviceBuffer(const TensorView& host);
  explicit DeviceBuffer(const HostTensor& host) : DeviceBuffer(host.view()) {}
  // A contiguous device tensor with every byte set to `fill_byte`.
  DeviceBuffer(DType dtype, std::initializer_list<int64_t> shape, uint8_t fill_byte);
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The allocation's (and the constructor's copy or fill's) outcome.
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok() && data_ != nullptr; }
  void* data() const { return data_; }
  template <typename T> T* data_as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

  // The tensor it was made from, on the device (absent for a buffer made from a size).
  TensorView view() const { return view_; }
  // A contiguous device view of `dtype` and `shape` starting `byte_offset` bytes in.
  TensorView view(DType dtype, std::initializer_list<int64_t> shape, size_t byte_offset = 0) const;
  // The buffer as an op workspace.
  Workspace workspace() const { return {data_, bytes_}; }

  Status upload(const void* host, size_t bytes, size_t byte_offset = 0) const;
  Status upload(const HostTensor& host) const { return upload(host.view().data, host.bytes()); }
  Status download(void* host, size_t bytes) const;
  // Into the contiguous host tensor `host` (bytes() of it).
  Status download(const TensorView& host) const { return download(host.data, bytes_); }
  // A host copy shaped like view(); an empty tensor (bytes() 0) where the copy fails.
  HostTensor download() const;
  // Every byte set to `byte` (a poison, or zeroes).
  Status fill(uint8_t byte) const;
  // Random bytes that decode to finite bf16 / e4m3 values in [-2, 2): a block of at most 16 MiB
  // drawn from `seed`, repeated over the buffer.
  Status fill_random(DType dtype, uint64_t seed) const;

private:
  friend DeviceBuffer device_workspace(const OpPlan&, bool, ExecContext);
  void allocate(size_t bytes);
  void release();
  Status usable() const; // status(), or an error for a buffer that holds no allocation
  void* data_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_;
  Status status_;
};

} // namespace m3sa::testing
