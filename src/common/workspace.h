#pragma once
// Carves a caller-owned workspace into named, 64-byte aligned regions. The same code sizes the
// workspace at plan time (base == nullptr) and hands out the regions at run time, so the two can
// never disagree.
#include <cstddef>
#include <cstdint>

#include "common/checked_math.h"

namespace m3sa::detail {

class WorkspaceCarver {
public:
  static constexpr size_t kAlignment = 64;
  explicit WorkspaceCarver(void* base = nullptr) : base_(static_cast<char*>(base)) {}

  template <typename T> T* take(size_t count) {
    offset_ = aligned(offset_);
    T* region = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    // Saturates: a plan whose sizes overflow asks for SIZE_MAX bytes, which no workspace has.
    offset_ = saturating_add(offset_, saturating_mul(count, sizeof(T)));
    return region;
  }
  size_t bytes_used() const { return aligned(offset_); }

private:
  static size_t aligned(size_t offset) {
    return saturating_add(offset, kAlignment - 1) / kAlignment * kAlignment;
  }
  char* base_;
  size_t offset_ = 0;
};

} // namespace m3sa::detail
