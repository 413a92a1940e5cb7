#!/usr/bin/env bash
# One GPU round on the device machine (binaries built on the build machine, carried in .gpu/ with
# build/src/libm3sa_c.so.0.1, which the test binaries load from beside them):
# the gpu suite, compute-sanitizer on its small cases (label `small`), the demo, the benchmark and,
# where ../shared/peer was copied into .peer/ (and carried), vLLM's Triton kernels in the same call
# with the side-by-side table. QUICK=1 leaves out the sanitizer and the demo; BENCH_SET /
# BENCH_FILTER pick the bench cases, PEER_ARGS the peer's (e.g. "--dtypes bf16"); TESTS_FILTER /
# SANITIZER_FILTER the gtest filters of the suite (default: all) and of the sanitizer runs
# (default: the small cases), BIN the folder of the binaries (default .gpu). PART=tests runs
# the suite, the sanitizers and the demo only, PART=bench the benchmark and the peer only (a round
# too long for one 600 s call goes in two: the whole suite + sanitizers ~200 s on an H100, BENCH_SET=full
# + the peer's whole grid ~200 s). With BENCH_SET=full and the peer, bench/targets_table.py turns
# both into targets.md: every target of issues 11-13 as measured. The logs end up in one
# logs.tgz, so that what comes back stays within the device tool's eight files.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast off on the lent machines (device README)
out="${OUT:-/tmp/m3sa_out}"; mkdir -p "$out"
wheel_lib() { python3 -c "import nvidia.$1, os; print(os.path.join(list(nvidia.$1.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:$(wheel_lib cublas):$(wheel_lib nccl)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
bin="${BIN:-.gpu}" part="${PART:-all}"
if [ "$part" != bench ]; then
"$bin/m3sa_gpu_tests" --gtest_filter="${TESTS_FILTER:-*}" > "$out/gpu_tests.log" 2>&1; echo "gpu suite rc=$?"
grep -E '^\[ [A-Z]|FAILED|PASSED|Failure' "$out/gpu_tests.log" | grep -v '^\[ RUN\|^\[       OK' | tail -30
if [ -z "${QUICK:-}" ]; then
small="${SANITIZER_FILTER:-*Small*}" # default: the ctest label `small` (tests/CMakeLists.txt)
# The two small cases with 16-CTA cluster merges skip synccheck (the file says why).
source bench/synccheck_exclusions.sh
for tool in memcheck racecheck synccheck initcheck; do
  filter="$small"
  [ $tool = synccheck ] && [ -z "${SANITIZER_FILTER:-}" ] && filter="$small-$synccheck_excluded"
  compute-sanitizer --tool $tool --error-exitcode 1 "$bin/m3sa_gpu_tests" --gtest_filter="$filter" > "$out/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer --tool $tool rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$tool.log" | tail -1)"
done
"$bin/m3sa" demo > "$out/demo_bf16.txt" 2>&1; echo "demo bf16 rc=$?"
"$bin/m3sa" demo --index-dtype fp8 > "$out/demo_fp8.txt" 2>&1; echo "demo fp8 rc=$?"
grep -E "indexer on|insert_index_k  |index_topk  |sparse_attention  |^\[" "$out/demo_bf16.txt" "$out/demo_fp8.txt"
fi
fi
if [ "$part" != tests ]; then
"$bin/m3sa" bench --set "${BENCH_SET:-quick}" --filter "${BENCH_FILTER:-}" --json "$out/bench.json" > "$out/bench.md" 2> "$out/bench.err"; echo "bench rc=$?"
cat "$out/bench.md"
if [ -d .peer ]; then
  # shellcheck disable=SC2086 # PEER_ARGS is a list of arguments
  PYTHONPATH=.peer/vllm_shim python3 .peer/peer_bench.py --no-torch-timing --no-sanity ${PEER_ARGS:-} --out "$out" > "$out/peer.log" 2>&1
  echo "peer rc=$?"
  python3 .peer/side_by_side.py "$out/bench.json" "$out/peer_bench.json" | tee "$out/side_by_side.md"
  [ "${BENCH_SET:-quick}" = full ] &&
    python3 bench/targets_table.py "$out/bench.json" "$out/peer_bench.json" | tee "$out/targets.md"
fi
fi
(cd "$out" && tar czf logs.tgz --remove-files ./*.log ./*.txt bench.err 2>/dev/null)
