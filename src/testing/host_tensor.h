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
  uint64_t next();
  double uniform();                // [0, 1)
  int uniform_int(int lo, int hi); // [lo, hi]
  float normal();

private:
  uint64_t state_;
};

// Fresh seed per test run unless M3SA_TEST_SEED is set; tests print it on failure.
uint64_t test_seed();

// Stores `value` into element i of a bf16 / e4m3 / f32 buffer.
void store(DType dtype, void* base, int64_t i, float value);
float load(DType dtype, const void* base, int64_t i);

} // namespace m3sa::testing
