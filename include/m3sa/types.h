#pragma once
#include <cstddef>
#include <cstdint>

namespace m3sa {

enum class DType : uint8_t { bf16, fp8_e4m3, f32, i32, i64 };
const char* to_string(DType dtype);
size_t dtype_size(DType dtype);

enum class DeviceKind : uint8_t { cpu, cuda };
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int ordinal = 0;
  // Spelled out rather than defaulted: defaulted comparisons are C++20, the headers C++17.
  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.ordinal == b.ordinal;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};
const char* to_string(DeviceKind kind);

// Which implementation runs an op. `reference` is the slow, double-accumulating oracle: it can be
// chosen explicitly (tests, the CLI) but is never a silent fallback.
enum class Backend : uint8_t { reference, cpu, cuda };
const char* to_string(Backend backend);

} // namespace m3sa
