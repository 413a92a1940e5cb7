#!/usr/bin/env bash
# Builds everything (every .cu included where nvcc exists, bench/micro's standalone programs too),
# checks that consumer projects (C++17, and C on the C API) build against the installed package and that the CUDA-free
# configuration builds, then runs all tests
# (the Python package's through scripts/run_python_tests.sh), and the CPU suite again under
# AddressSanitizer + UBSan (the asan preset; any report is fatal) and under ThreadSanitizer (the
# tsan preset), then every libFuzzer harness for M3SA_FUZZ_SECONDS (default 20) seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
source scripts/env.sh

cmake --preset default -DM3SA_WERROR=ON
cmake --build --preset default -j "$M3SA_JOBS"

echo "[m3sa] install + consumer smoke test" >&2
rm -rf build/_install build/consumer
cmake --install build --prefix build/_install >/dev/null
{ cmake -S tests/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/_install" && cmake --build build/consumer; } \
    > build/consumer.log 2>&1 || { cat build/consumer.log; exit 1; }
./build/consumer/m3sa_consumer
./build/consumer/m3sa_c_consumer

if command -v nvcc >/dev/null 2>&1; then
  echo "[m3sa] CUDA-free configuration (-DM3SA_ENABLE_CUDA=OFF)" >&2
  { cmake --preset cpu-only -DM3SA_WERROR=ON && cmake --build --preset cpu-only --target m3sa m3sa_cli -j "$M3SA_JOBS"; } \
      > build/cpu-only.log 2>&1 || { cat build/cpu-only.log; exit 1; }
  # The standalone GPU programs of bench/micro (sm_90a, into the git-ignored .gpu/) compile too.
  echo "[m3sa] bench/micro programs (bench/micro/build.sh)" >&2
  for program in bench/micro/*.cu; do
    bash bench/micro/build.sh "$(basename "$program" .cu)" > build/micro.log 2>&1 ||
      { cat build/micro.log; exit 1; }
  done
fi

echo "[m3sa] Python package: CPU-only wheel, installed into virtual environments, pytest" >&2
bash scripts/run_python_tests.sh

echo "[m3sa] tests: $(ctest --test-dir build -N -L cpu | tail -1 | sed 's/Total Tests: //') labelled cpu, $(ctest --test-dir build -N -L gpu | tail -1 | sed 's/Total Tests: //') labelled gpu" >&2
ctest --test-dir build --output-on-failure -j "$M3SA_JOBS"

# Memory errors on valid or hostile input (issue 15) only show under the sanitizers: the CPU suite
# again, built by the asan preset (-fno-sanitize-recover=all: a UBSan report fails its test).
echo "[m3sa] CPU tests under ASan + UBSan (asan preset)" >&2
{ cmake --preset asan -DM3SA_WERROR=ON && cmake --build --preset asan --target m3sa_cpu_tests -j "$M3SA_JOBS"; } \
    > build/asan.log 2>&1 || { cat build/asan.log; exit 1; }
ctest --test-dir build-asan --output-on-failure -L cpu -j "$M3SA_JOBS"

# Data races in the OpenMP CPU backend (clang + libomp, Archer: scripts/run_tsan.sh).
echo "[m3sa] CPU tests under ThreadSanitizer (tsan preset)" >&2
bash scripts/run_tsan.sh

# The libFuzzer harnesses (tests/fuzz), each for a short smoke run from the checked-in seeds, so a
# regression the seeds or a few thousand mutations reach fails CI (docs/testing.md has the long runs).
echo "[m3sa] libFuzzer smoke run: each harness ${M3SA_FUZZ_SECONDS:-20} s (scripts/run_fuzz.sh)" >&2
bash scripts/run_fuzz.sh "${M3SA_FUZZ_SECONDS:-20}"
