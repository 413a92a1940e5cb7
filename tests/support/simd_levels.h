#pragma once
// The CPU row kernels' instruction-set levels (src/cpu/simd.h) a test can run on this machine, and
// a scope that runs them at one level.
#include <vector>

#include "cpu/simd.h"

namespace m3sa::testing {

// portable always; avx2 and avx512 where the CPU has them.
inline std::vector<cpu::SimdLevel> runnable_simd_levels() {
  std::vector<cpu::SimdLevel> levels;
  for (cpu::SimdLevel level :
       {cpu::SimdLevel::portable, cpu::SimdLevel::avx2, cpu::SimdLevel::avx512})
    if (level <= cpu::detected_simd_level()) levels.push_back(level);
  return levels;
}

// The kernels run at `level` (at most the detected one) until the scope ends, then at the level
// before it.
class ScopedSimdLevel {
public:
  explicit ScopedSimdLevel(cpu::SimdLevel level) : previous_(cpu::simd_level()) {
    cpu::set_simd_level_cap(level);
  }
  ~ScopedSimdLevel() { cpu::set_simd_level_cap(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

private:
  cpu::SimdLevel previous_;
};

} // namespace m3sa::testing
