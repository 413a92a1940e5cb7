#pragma once
// Small helpers for building Status messages and propagating them.
#include <sstream>
#include <string>

#include "m3sa/status.h"

namespace m3sa::detail {

template <typename... Parts> std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

} // namespace m3sa::detail

#define M3SA_RETURN_IF_ERROR(expr)                                                                 \
  do {                                                                                             \
    ::m3sa::Status m3sa_status_ = (expr);                                                          \
    if (!m3sa_status_.ok()) return m3sa_status_;                                                   \
  } while (0)
