#!/usr/bin/env bash
# Builds the libFuzzer harnesses (the fuzz preset: clang, ASan + UBSan) and runs each for
# <seconds-per-harness>, M3SA_FUZZ_PARALLEL (default 2) at a time, one core each:
#   bash scripts/run_fuzz.sh 20            # the smoke run scripts/run_tests.sh makes
#   bash scripts/run_fuzz.sh 600 fuzz_plan # one harness, ten minutes
# Inputs start from the checked-in seeds (tests/fuzz/corpus/<harness>.b64: one base64 input per
# line, a minimised corpus of the long runs; tests/fuzz/update_seeds.sh refreshes them) plus what
# earlier runs found (build-fuzz/corpus/<harness>); crashes land in build-fuzz/artifacts/<harness>/
# and fail the script. Each harness's log is build-fuzz/logs/<harness>.log; the summary prints executions,
# coverage and findings per harness. Reproduce a crash: build-fuzz/tests/fuzz/<harness> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:?usage: scripts/run_fuzz.sh <seconds-per-harness> [harness ...]}"
shift
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(fuzz_insert_index_k fuzz_indexer fuzz_sparse_attention fuzz_norm_rope_insert fuzz_plan
             fuzz_c_api)
fi
parallel="${M3SA_FUZZ_PARALLEL:-2}"
source scripts/env.sh

{ cmake --preset fuzz && cmake --build --preset fuzz -j "$M3SA_JOBS"; } > build-fuzz.log 2>&1 ||
  { cat build-fuzz.log; exit 1; }
mv build-fuzz.log build-fuzz/build.log

run_one() {
  local harness="$1" seconds="$2"
  local corpus="build-fuzz/corpus/$harness" seeds="build-fuzz/seeds/$harness"
  local artifacts="build-fuzz/artifacts/$harness/"
  mkdir -p "$corpus" "$artifacts" build-fuzz/logs "$seeds"
  local n=0 line
  if [ -f "tests/fuzz/corpus/$harness.b64" ]; then
    while IFS= read -r line; do
      [ -n "$line" ] && printf '%s' "$line" | base64 -d > "$seeds/seed-$((n++))"
    done < "tests/fuzz/corpus/$harness.b64"
  fi
  # One OpenMP thread pool per process that sleeps when idle: the harness plans 0..2 threads.
  # LeakSanitizer: libomp keeps its thread pool's descriptors past a unit (tests/fuzz/lsan.supp).
  LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0" \
  OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2 \
    "build-fuzz/tests/fuzz/$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" "$seeds" \
    > "build-fuzz/logs/$harness.log" 2>&1 || true
}
export -f run_one
printf '%s\n' "${harnesses[@]}" | xargs -P "$parallel" -I{} bash -c "run_one {} $seconds"

status=0
for harness in "${harnesses[@]}"; do
  log="build-fuzz/logs/$harness.log"
  runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  findings=$(find "build-fuzz/artifacts/$harness" -type f | wc -l)
  echo "[m3sa fuzz] $harness: ${seconds} s, $runs executions, ${cov:-no coverage line}, $findings finding(s)"
  if ((findings > 0)) || grep -qE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|\[m3sa fuzz\]' "$log"; then
    grep -m3 -E 'runtime error|ERROR:|\[m3sa fuzz\]' "$log" | sed 's/^/    /'
    find "build-fuzz/artifacts/$harness" -type f | sed 's/^/    artifact: /'
    status=1
  fi
done
exit $status
