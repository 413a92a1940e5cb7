#include "testing/device_buffer.h"

#include <algorithm>

namespace m3sa::testing {
namespace {

// cudaMemset and a cudaMemcpy from pageable memory may return before the device has written the
// buffer, ordered only on the legacy default stream, which a cudaStreamNonBlocking stream does not
// wait for: a test's graph on such a stream could run before (or under) the fill. Every write here
// has landed when the call returns.
Status landed(cudaError_t issued, const char* what) {
  if (issued != cudaSuccess) return cuda::cuda_status(issued, what);
  return cuda::cuda_status(cudaStreamSynchronize(cudaStreamLegacy), what);
}

} // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) { allocate(bytes); }

DeviceBuffer::DeviceBuffer(const TensorView& host) {
  allocate(static_cast<size_t>(host.numel()) * dtype_size(host.dtype));
  view_ = host;
  view_.data = data_;
  view_.device = {DeviceKind::cuda, 0};
  if (status_.ok()) status_ = upload(host.data, bytes_);
}

DeviceBuffer::DeviceBuffer(DType dtype, std::initializer_list<int64_t> shape, uint8_t fill_byte) {
  view_ = TensorView::contiguous(nullptr, dtype, shape, {DeviceKind::cuda, 0});
  allocate(static_cast<size_t>(view_.numel()) * dtype_size(dtype));
  view_.data = data_;
  if (status_.ok()) status_ = fill(fill_byte);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_, bytes_ = other.bytes_, view_ = other.view_, status_ = other.status_;
    other.data_ = nullptr, other.bytes_ = 0, other.view_ = {};
  }
  return *this;
}

void DeviceBuffer::allocate(size_t bytes) {
  bytes_ = bytes;
  status_ = cuda::cuda_status(cudaMalloc(&data_, std::max<size_t>(bytes, 64)), "cudaMalloc");
  if (!status_.ok()) data_ = nullptr, bytes_ = 0;
}

void DeviceBuffer::release() {
  if (data_) cudaFree(data_);
  data_ = nullptr;
}

TensorView DeviceBuffer::view(DType dtype, std::initializer_list<int64_t> shape,
                              size_t byte_offset) const {
  return TensorView::contiguous(static_cast<char*>(data_) + byte_offset, dtype, shape,
                                {DeviceKind::cuda, 0});
}

Status DeviceBuffer::upload(const void* host, size_t bytes, size_t byte_offset) const {
  if (byte_offset + bytes > bytes_)
    return Status::invalid_argument("upload", "at most the buffer's bytes",
                                    std::to_string(byte_offset + bytes));
  return landed(
      cudaMemcpy(static_cast<char*>(data_) + byte_offset, host, bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy (host to device)");
}

Status DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_)
    return Status::invalid_argument("download", "at most the buffer's bytes",
                                    std::to_string(bytes));
  return cuda::cuda_status(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost),
                           "cudaMemcpy (device to host)");
}

HostTensor DeviceBuffer::download() const {
  HostTensor h = HostTensor::shaped_like(view_);
  if (h.bytes() != bytes_ || !download(h.view().data, bytes_).ok()) return HostTensor{};
  return h;
}

Status DeviceBuffer::usable() const {
  if (data_ != nullptr || !status_.ok()) return status_;
  return Status::invalid_argument("device buffer", "an allocation", "an empty buffer");
}

Status DeviceBuffer::fill(uint8_t byte) const {
  M3SA_RETURN_IF_ERROR(usable());
  return landed(cudaMemset(data_, byte, bytes_), "cudaMemset");
}

Status DeviceBuffer::fill_random(DType dtype, uint64_t seed) const {
  M3SA_RETURN_IF_ERROR(usable());
  const size_t block = std::min<size_t>(bytes_, 16u << 20);
  HostTensor host(DType::i32, {static_cast<int64_t>((block + 3) / 4)});
  Rng rng(seed);
  const int64_t elems = static_cast<int64_t>(block / dtype_size(dtype));
  for (int64_t i = 0; i < elems; ++i)
    store(dtype, host.view().data, i, static_cast<float>(rng.uniform() * 4 - 2));
  for (size_t off = 0; off < bytes_; off += block)
    M3SA_RETURN_IF_ERROR(upload(host.view().data, std::min(block, bytes_ - off), off));
  return {};
}

DeviceBuffer device_workspace(const OpPlan& plan, bool prepare, ExecContext ctx) {
  DeviceBuffer ws(plan.workspace_bytes);
  Status s = ws.status();
  if (s.ok()) // on the stream the preparation runs on, so that it lands first
    s = cuda::cuda_status(cudaMemsetAsync(ws.data(), 0xcd, std::max<size_t>(ws.bytes(), 64),
                                          static_cast<cudaStream_t>(ctx.stream)),
                          "cudaMemsetAsync");
  if (s.ok() && prepare) s = prepare_workspace(plan, ws.workspace(), ctx);
  ws.status_ = s;
  return ws;
}

} // namespace m3sa::testing
