#pragma once
// A non-owning view of caller memory: pointer, dtype, shape and strides (in elements).
#include <cstdint>
#include <initializer_list>
#include <string>

#include "m3sa/types.h"

namespace m3sa {

struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0; // 0 with data == nullptr means "absent" for optional arguments
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {}; // in elements, not bytes
  Device device = {};

  // Row-major contiguous view.
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});

  bool present() const { return data != nullptr || rank != 0; }
  int64_t numel() const;
  bool is_contiguous() const;
  // "bf16 [7, 64, 128] strides [8192, 128, 1] on cpu": used in every error message.
  std::string describe() const;

  template <typename T> T* ptr() const { return static_cast<T*>(data); }
  // Offset in elements of index (i0, i1, ...); unspecified trailing indices are zero.
  int64_t offset(std::initializer_list<int64_t> index) const {
    int64_t off = 0;
    int d = 0;
    for (int64_t i : index) off += i * strides[d++];
    return off;
  }
};

} // namespace m3sa
