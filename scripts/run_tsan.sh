#!/usr/bin/env bash
# Builds the CPU suite under ThreadSanitizer (the tsan preset: clang, -fsanitize=thread, LLVM's
# libomp) and runs the tests labelled cpu with Archer loaded (OMP_TOOL_LIBRARIES): libomp's own
# barriers and fork/join are not instrumented, and Archer tells TSan about them through OMPT, so
# that what TSan reports is a race in m3sa, not inside the OpenMP runtime. Any report fails the
# test (halt_on_error). Extra arguments go to ctest, e.g. `-R CpuThreads`.
#   bash scripts/run_tsan.sh                 # every cpu-labelled test
#   bash scripts/run_tsan.sh -R 'CpuThreads|CpuMatchesReference'
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

{ cmake --preset tsan && cmake --build --preset tsan -j "$M3SA_JOBS"; } > build-tsan.log 2>&1 ||
  { cat build-tsan.log; exit 1; }
mv build-tsan.log build-tsan/build.log

# Archer ships with LLVM's OpenMP runtime, beside clang's own libraries.
archer="$(dirname "$(readlink -f "$(command -v clang++)")")/../lib/libarcher.so"
if [ ! -f "$archer" ]; then
  echo "run_tsan.sh: no libarcher.so next to clang ($archer): install libomp-dev for clang" >&2
  exit 1
fi
export OMP_TOOL_LIBRARIES="$archer"
# ignore_noninstrumented_modules: accesses inside libomp itself (its task queues) are not m3sa's.
export TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 second_deadlock_stack=1"
ctest --test-dir build-tsan -L cpu -j "$M3SA_JOBS" --output-on-failure "$@"
