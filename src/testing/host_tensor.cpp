#include "testing/host_tensor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/checked_math.h"

namespace m3sa::testing {

void HostTensor::reset(DType dtype, std::initializer_list<int64_t> shape) {
  allocate(TensorView::contiguous(nullptr, dtype, shape));
}

HostTensor HostTensor::shaped_like(const TensorView& like) {
  TensorView shape;
  shape.dtype = like.dtype;
  shape.rank = like.rank;
  int64_t stride = 1;
  for (int d = like.rank - 1; d >= 0; --d) {
    shape.shape[d] = like.shape[d];
    shape.strides[d] = stride;
    stride *= like.shape[d];
  }
  HostTensor h;
  h.allocate(shape);
  return h;
}

void HostTensor::allocate(const TensorView& shape) {
  view_ = shape;
  bytes_ = detail::saturating_mul(static_cast<size_t>(view_.numel()), dtype_size(view_.dtype));
  const size_t rounded = detail::saturating_add(bytes_, 63) / 64 * 64;
  storage_.reset(rounded ? std::aligned_alloc(64, rounded) : nullptr);
  view_.data = storage_.get();
}

Status check_allocated(std::initializer_list<const HostTensor*> tensors, const char* what) {
  for (const HostTensor* t : tensors)
    if (!t->allocated())
      return Status::unsupported(what,
                                 detail::concat("host memory: allocating ", t->bytes(),
                                                " bytes for ", t->view().describe(), " failed"));
  return {};
}

float Rng::normal() { // Box-Muller
  const double u1 = uniform() + 0x1p-60, u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("M3SA_TEST_SEED")) return std::stoull(env);
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  return seed;
}

void store(DType dtype, void* base, int64_t i, float value) {
  switch (dtype) {
  case DType::bf16:
    static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(value);
    break;
  case DType::fp8_e4m3:
    static_cast<uint8_t*>(base)[i] = float_to_e4m3_bits(value);
    break;
  case DType::f32:
    static_cast<float*>(base)[i] = value;
    break;
  default:
    break;
  }
}

void fill_value(DType dtype, void* base, int64_t count, float value) {
  switch (dtype) {
  case DType::bf16:
    std::fill_n(static_cast<uint16_t*>(base), count, float_to_bf16_bits(value));
    break;
  case DType::fp8_e4m3:
    std::fill_n(static_cast<uint8_t*>(base), count, float_to_e4m3_bits(value));
    break;
  case DType::f32:
    std::fill_n(static_cast<float*>(base), count, value);
    break;
  default:
    break;
  }
}

float load(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
  case DType::bf16:
    return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
  case DType::fp8_e4m3:
    return e4m3_bits_to_float(static_cast<const uint8_t*>(base)[i]);
  case DType::f32:
    return static_cast<const float*>(base)[i];
  default:
    return 0.f;
  }
}

} // namespace m3sa::testing
