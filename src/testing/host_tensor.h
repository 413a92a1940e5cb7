#pragma once
// Owning, 64-byte aligned host buffers with a TensorView over them, plus deterministic fills.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "m3sa/m3sa.h"

namespace m3sa::testing {

class HostTensor {
public:
  HostTensor() = default;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) { reset(dtype, shape); }
  void reset(DType dtype, std::initializer_list<int64_t> shape);
  // A contiguous tensor of `like`'s dtype and shape (any rank; its data and strides ignored).
  static HostTensor shaped_like(const TensorView& like);

  TensorView view() const { return view_; }
  template <typename T> T* data() const { return static_cast<T*>(view_.data); }
  size_t bytes() const { return bytes_; }
  // False when the allocation of a non-empty tensor failed (its data is then null).
  bool allocated() const { return bytes_ == 0 || storage_ != nullptr; }
  void fill_bytes(uint8_t byte) const {
    if (bytes_) std::memset(view_.data, byte, bytes_);
  }

private:
  void allocate(const TensorView& shape);
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> storage_;
  size_t bytes_ = 0;
  TensorView view_;
};

// OK when every tensor got its memory, else `what` with the size of the first that did not: large
// batches report this instead of crashing on the null data (issue 15).
Status check_allocated(std::initializer_list<const HostTensor*> tensors, const char* what);

// Equal sizes and equal bytes (an empty tensor equals only an empty one).
inline bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes() &&
         (a.bytes() == 0 || std::memcmp(a.view().data, b.view().data, a.bytes()) == 0);
}

// SplitMix64: a tiny, well-distributed generator whose stream is identical on every platform.
class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // One row's own stream, a function of (seed, stream, row) only: rows filled in parallel get the
  // same data whatever the number of threads.
  static Rng for_row(uint64_t seed, uint64_t stream, uint64_t row) {
    return Rng(mix(seed ^ mix(stream * 0x100000001b3ull + row)));
  }
  // splitmix64; inline, since test data draws one number an element.
  uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ull); }
  // [0, 1)
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  // [lo, hi]
  int uniform_int(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  float normal();

private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// Fresh seed per test run unless M3SA_TEST_SEED is set; tests print it on failure.
uint64_t test_seed();

// Stores `value` into element i of a bf16 / e4m3 / f32 buffer.
void store(DType dtype, void* base, int64_t i, float value);
// Elements [begin, begin + count) of a bf16 / e4m3 / f32 buffer: value(k) for the k-th, rounded
// with store's rounding; the dtype is dispatched once, not per element.
template <typename ValueFn>
void store_run(DType dtype, void* base, int64_t begin, int64_t count, ValueFn&& value) {
  const auto run = [&](auto* out, auto convert) {
    for (int64_t k = 0; k < count; ++k) out[begin + k] = convert(value(k));
  };
  switch (dtype) {
  case DType::bf16:
    run(static_cast<uint16_t*>(base), float_to_bf16_bits);
    break;
  case DType::fp8_e4m3:
    run(static_cast<uint8_t*>(base), float_to_e4m3_bits);
    break;
  case DType::f32:
    run(static_cast<float*>(base), [](float v) { return v; });
    break;
  default:
    break;
  }
}
// Every element of a bf16 / e4m3 / f32 buffer of `count` elements set to `value` (rounded once).
void fill_value(DType dtype, void* base, int64_t count, float value);
float load(DType dtype, const void* base, int64_t i);

} // namespace m3sa::testing
