#pragma once

namespace m3sa {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
const char* version_string(); // "0.1.0"
const char* build_commit();   // git commit the library was configured from, or "unknown"
} // namespace m3sa
