#!/usr/bin/env bash
# One device round for kernel variants given as patches (kernel, plan and tests alike; decode
# indexer, attention, prefill attention):
# the landed build (build/, the default preset) as "main", and each patch applied to an export of
# HEAD and built whole (m3sa CLI and GPU tests, sm_90a only) in a scratch tree - unlike
# patch_variant.sh, a patch may change tests and headers anywhere. Packs .gpu/decode_round.tar.xz
# and writes .gpu/decode_round.sh [tests|bench|all], the script to run on the device (carry both,
# and .peer for the side by side). There, in one call or two (`tests`, then `bench`):
# - each variant's GPU tests (TESTS: default the decode / CP / list-merge / indexer / robustness
#   suites; `attention` = the sparse-attention suites; `all` = the whole suite in 4 parallel
#   shards) and memcheck / racecheck / synccheck on their small cases (`all`: on the decode and
#   attention small cases);
# - main and the variants alternating twice on the decode bench (BENCH: default every decode
#   indexer case, else comma-separated case-name prefixes such as "decode fp8 B=128 ,attention
#   decode bf16 B=1 ");
# - where .peer is there, vLLM's decode kernels and the side by side of one variant's run (SIDE:
#   default the first variant; PEER=0 leaves vLLM out, e.g. in the second of two bench calls;
#   PEER_ARGS: peer_bench.py's case options, default "--no-attn", e.g. "--batches 1" for the
#   batch-1 attention and indexer; PEER_PREFILL=1: vLLM's prefill cases too, which the peer
#   otherwise leaves out, e.g. PEER_ARGS="--no-decode" for a prefill round);
#   ONLY="v1 v2" restricts tests and bench to those variants (and main), for rounds of more
#   variants than one call holds.
# run.txt and round.tgz come back, rewritten after each stage, so that a call cut short still
# returns what it measured. Times on the H200: the whole suite ~95 s a variant, every decode case
# ~60 s a variant a round, the peer ~60 s.
#   bench/micro/decode_round.sh <name>:<patch>[+<patch>...] [<name>:<patch>... ...]
# (patches joined by + apply in order, so that a variant of a variant is a small patch on top;
# VARIANT_TREE=<dir> keeps one clone and its build there across variants and rounds)
# e.g. TESTS=all bench/micro/decode_round.sh sf1:bench/patches/s34-one-range-sampled-floor.patch
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n 2,29p "$0"; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/env.sh"
source "$root/bench/micro/kept_tree.sh"
[[ -x "$root/build/tools/m3sa_cli/m3sa" && -x "$root/build/tests/m3sa_gpu_tests" ]] ||
  { echo "decode_round.sh: build the default preset first (build/)" >&2; exit 2; }
out="$root/.gpu/decode_round"
rm -rf "$out" && mkdir -p "$out/main"
# The GPU tests load the C API's library from beside them ($ORIGIN): each variant ships its own.
cp "$root/build/tools/m3sa_cli/m3sa" "$root/build/tests/m3sa_gpu_tests" "$out/main/"
cp -L "$root/build/src/libm3sa_c.so.0.1" "$out/main/"
names=(main)
for spec in "$@"; do
  name="${spec%%:*}" patches="${spec#*:}"
  [[ "$name" =~ ^[A-Za-z0-9]+$ && "$name" != main ]] ||
    { echo "decode_round.sh: variant names are letters and digits, not main: $name" >&2; exit 2; }
  if [[ -n "${VARIANT_TREE:-}" ]]; then
    tree="$VARIANT_TREE" # only the files a patch touched rebuild (kept_tree.sh)
    checkout_kept_tree "$root" "$tree"
  else
    tree="$(mktemp -d)"
    git -C "$root" archive HEAD | tar -x -C "$tree"
    git -C "$tree" init -q
  fi
  IFS=+ read -r -a chain <<< "$patches"
  for patch in "${chain[@]}"; do git -C "$tree" apply "$(realpath "$patch")"; done
  echo "[decode_round] building $name ($patches) in $tree" >&2
  build_cli_and_gpu_tests "$tree" || exit 1
  mkdir -p "$out/$name"
  cp "$tree/build/tools/m3sa_cli/m3sa" "$tree/build/tests/m3sa_gpu_tests" "$out/$name/"
  cp -L "$tree/build/src/libm3sa_c.so.0.1" "$out/$name/"
  [[ -n "${VARIANT_TREE:-}" ]] || rm -rf "$tree"
  names+=("$name")
done
strip "$out"/*/*
tar -C "$root/.gpu" -cJf "$root/.gpu/decode_round.tar.xz" decode_round
rm -rf "$out"
cat > "$root/.gpu/decode_round.sh" <<EOF
#!/usr/bin/env bash
# bench/micro/decode_round.sh $* (written $(date -u +%F), HEAD $(git -C "$root" rev-parse --short HEAD))
set -u
export NCCL_NVLS_ENABLE=0
variants="${names[*]:1}" all="${names[*]}"
tests="\${TESTS:-${TESTS:-decode}}" bench="\${BENCH:-${BENCH:-}}"
side="\${SIDE:-${names[1]:-}}" peer="\${PEER:-1}"
peer_args="\${PEER_ARGS:-${PEER_ARGS:---no-attn}}"
peer_prefill="\${PEER_PREFILL:-${PEER_PREFILL:-0}}"
[ -n "\${ONLY:-}" ] && variants="\$ONLY" all="main \$ONLY"
EOF
cat >> "$root/.gpu/decode_round.sh" <<'EOF'
final="$OUT" w=/tmp/decode_round_out
rm -rf "$w" && mkdir -p "$w"
tar -xJf .gpu/decode_round.tar.xz -C .gpu
bin=.gpu/decode_round
snap() { (cd "$w" && tar czf "$final/round.tgz" .); cp "$w/run.txt" "$final/run.txt"; }
log() { echo "$* $(date +%s)" >> "$w/run.txt"; }
log "start $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
mode="${1:-all}" # tests | bench | all: a round too long for one call (600 s) goes in two
F='GpuDecodeIndexer*:Cases/GpuDecodeIndexer*:GpuContextParallel*:Cases/GpuContextParallel*:GpuListMerge*:GpuIndexer*:Cases/GpuIndexer*:GpuRobustness*'
S='GpuDecodeIndexerSmall*:Cases/GpuDecodeIndexer.*/Small*:GpuListMergeSmall*:GpuContextParallelSmall*:GpuIndexerSmall*'
# The attention's: its small cases under racecheck too (the layout cases are too long for it).
FA='CudaAttention*:Cases/CudaAttention*:*sparse_attention*:GpuCApi*'
SA='CudaAttentionSmall.*:*sparse_attention*Small*'
[ "$tests" = attention ] && F="$FA" S="$SA"
[ "$tests" = all ] && S="$S:$SA"
# The two small cases with 16-CTA cluster merges skip synccheck (the file says why).
source bench/synccheck_exclusions.sh
[ "$mode" = bench ] && variants_tested="" || variants_tested="$variants"
for v in $variants_tested; do
  if [ "$tests" = all ]; then
    for k in 0 1 2 3; do
      GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$k timeout 240 $bin/$v/m3sa_gpu_tests > "$w/tests-$v-$k.log" 2>&1 &
    done
    wait
  else
    timeout 240 $bin/$v/m3sa_gpu_tests --gtest_filter="$F" > "$w/tests-$v.log" 2>&1
  fi
  log "$v tests: $(cat "$w"/tests-$v*.log | grep -c '^\[       OK') ok $(cat "$w"/tests-$v*.log | grep -c '^\[  FAILED') failed"
  grep -h '^\[  FAILED' "$w"/tests-$v*.log >> "$w/run.txt"
  for tool in memcheck racecheck synccheck; do
    filter="$S"; [ $tool = synccheck ] && filter="$S-$synccheck_excluded"
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $bin/$v/m3sa_gpu_tests --gtest_filter="$filter" > "$w/san-$v-$tool.log" 2>&1
    log "$v $tool rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$w/san-$v-$tool.log" | tail -1)"
  done
  snap
done
[ "$mode" = tests ] && { cat "$w/run.txt"; exit 0; }
prefixes=()
if [ -z "$bench" ]; then
  prefixes=("decode fp8 B=128 " "decode bf16 B=128 " "decode fp8 B=32 " "decode bf16 B=32 "
    "decode fp8 B=1 " "decode bf16 B=1 ")
else
  IFS=, read -r -a prefixes <<< "$bench"
fi
for round in 1 2; do
  for v in $all; do
    for p in "${prefixes[@]}"; do
      tag=$(echo "$p" | tr -s ' =' '__')
      timeout 90 $bin/$v/m3sa bench --set full --filter "^$p" --json "$w/${v}_${tag}_$round.json" > /dev/null 2>> "$w/bench.err"
      log "bench $v '$p' $round rc=$?"
    done
    snap
  done
done
first="$side"
if [ -d .peer ] && [ -n "$first" ] && [ "$peer" != 0 ]; then
  prefill_flag=--no-prefill; [ "$peer_prefill" = 1 ] && prefill_flag=
  PYTHONPATH=.peer/vllm_shim timeout 120 python3 .peer/peer_bench.py --no-torch-timing --no-sanity $prefill_flag $peer_args --budget-s 80 --out "$w/peer" > "$w/peer.log" 2>&1
  log "peer rc=$?"
  python3 bench/micro/round_table.py "$w" --variant "$first" --round 1 \
    --json "$w/decode-m3sa-$first.json" > /dev/null
  python3 .peer/side_by_side.py "$w/decode-m3sa-$first.json" "$w/peer/peer_bench.json" > "$w/side_by_side.md" 2>&1
  cat "$w/side_by_side.md" >> "$w/run.txt"
  snap
fi
cat "$w/run.txt"
EOF
chmod +x "$root/.gpu/decode_round.sh"
echo "built .gpu/decode_round.tar.xz (${names[*]}) and .gpu/decode_round.sh: run \`bash .gpu/decode_round.sh\`" \
  "on the device with carry [\".gpu/decode_round.tar.xz\", \".gpu/decode_round.sh\", \".peer\"]"
