#!/usr/bin/env bash
# Minimises what the fuzz runs found (build-fuzz/corpus/<harness>, plus the current seeds) with
# libFuzzer's -merge=1 and writes it to tests/fuzz/corpus/<harness>.b64, one base64 input per line,
# the seeds scripts/run_fuzz.sh starts from. Run after a long scripts/run_fuzz.sh run.
set -euo pipefail
cd "$(dirname "$0")/../.."
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(fuzz_insert_index_k fuzz_indexer fuzz_sparse_attention fuzz_norm_rope_insert fuzz_plan
             fuzz_c_api)
fi
mkdir -p tests/fuzz/corpus
for harness in "${harnesses[@]}"; do
  merged=$(mktemp -d)
  mkdir -p "build-fuzz/seeds/$harness" "build-fuzz/corpus/$harness" build-fuzz/logs
  LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0" OMP_WAIT_POLICY=passive \
    "build-fuzz/tests/fuzz/$harness" -merge=1 -timeout=10 "$merged" "build-fuzz/corpus/$harness" \
    "build-fuzz/seeds/$harness" > "build-fuzz/logs/$harness.merge.log" 2>&1
  for f in $(ls "$merged" | sort); do base64 -w0 "$merged/$f"; echo; done > "tests/fuzz/corpus/$harness.b64"
  echo "[m3sa fuzz] $harness: $(wc -l < "tests/fuzz/corpus/$harness.b64") seeds, $(wc -c < "tests/fuzz/corpus/$harness.b64") bytes"
  rm -rf "$merged"
done
