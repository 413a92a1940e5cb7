#pragma once
// The one place size arithmetic on caller-supplied extents happens: element counts, byte extents
// and workspace sizes saturate instead of overflowing (signed overflow is undefined behaviour), so
// an absurd extent becomes a too-large value that validation rejects, never a wrapped small one.
#include <cstddef>
#include <cstdint>
#include <limits>

namespace m3sa::detail {

// a * b, or the int64 limit of the product's sign when it does not fit.
inline int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t product;
  if (!__builtin_mul_overflow(a, b, &product)) return product;
  return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()
                            : std::numeric_limits<int64_t>::max();
}

// a + b, or the int64 limit in the direction of the overflow.
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
}

// Unsigned sizes (workspace bytes): SIZE_MAX when the result does not fit.
inline size_t saturating_mul(size_t a, size_t b) {
  size_t product;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<size_t>::max() : product;
}
inline size_t saturating_add(size_t a, size_t b) {
  size_t sum;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<size_t>::max() : sum;
}

} // namespace m3sa::detail
