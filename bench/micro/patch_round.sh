#!/usr/bin/env bash
# One device round for bench/patches variants of the prefill scorer (session 21): the landed build
# (build/, the default preset) and each patch built by patch_variant.sh, packed as
# .gpu/patch_round.tar.xz with .gpu/patch_round.sh, the script to run on the device (carry
# [".gpu", ".peer"]). There: the prefill GPU tests on each variant, the prefill bench with the
# landed build and the variants alternating twice, vLLM's prefill kernels (../shared/peer, copied
# to .peer), then run.txt, logs.tgz (logs and bench JSONs) and peer/peer_bench.json under $OUT (the
# device returns eight files at most). `bash .gpu/patch_round.sh tests` or `... bench` runs one
# half: with three variants the tests take ~4.5 min and the bench with the peer ~5 min, so two
# calls (a command runs at most 10 minutes).
#   bench/micro/patch_round.sh <name>:<patch>:<source.cu>[,<source.cu>...] ...
# e.g. bench/micro/patch_round.sh \
#   weak:bench/patches/s21-scorer-weak-score-stores.patch:src/cuda/score_blocks_sm90_bf16.cu,src/cuda/score_blocks_sm90_fp8.cu \
#   e4m3_overlap:bench/patches/s21-scorer-e4m3-tile-overlap.patch:src/cuda/score_blocks_sm90_fp8.cu
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n 2,12p "$0"; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$root/.gpu"
cd "$root/.gpu"
cp "$root/build/tools/m3sa_cli/m3sa" m3sa_landed
names=(landed)
for spec in "$@"; do
  IFS=: read -r name patch sources <<<"$spec"
  IFS=, read -r -a files <<<"$sources"
  (cd "$root" && bench/micro/patch_variant.sh "$name" "$patch" "${files[@]}") >/dev/null
  names+=("$name")
done
binaries=(m3sa_landed)
for name in "${names[@]:1}"; do binaries+=("m3sa_$name" "m3sa_gpu_tests_$name"); done
strip "${binaries[@]}"
tar cJf patch_round.tar.xz "${binaries[@]}"
rm -f "${binaries[@]}"
{
  echo '#!/usr/bin/env bash'
  echo "# bench/micro/patch_round.sh $*"
  echo 'set -u'
  echo 'tar xJf .gpu/patch_round.tar.xz -C .gpu'
  echo 'mode=${1:-all}'
  echo 'if [[ $mode != bench ]]; then'
  echo "F='GpuPrefillScorerSmall.*:Cases/GpuPrefillScorer.*:GpuIndexer*:Cases/GpuIndexer.*:GpuRobustness*:*Schedule*:*Mixed*'"
  echo "for v in ${names[*]:1}; do"
  echo '  timeout 150 .gpu/m3sa_gpu_tests_$v --gtest_filter="$F" > $OUT/tests-$v.log 2>&1'
  echo '  echo "$v tests rc=$? $(grep -c "\[       OK" $OUT/tests-$v.log) ok $(grep -c "\[  FAILED" $OUT/tests-$v.log) failed" >> $OUT/run.txt'
  echo 'done'
  echo 'fi'
  echo 'if [[ $mode != tests ]]; then'
  echo 'for i in 1 2; do'
  echo "  for v in ${names[*]}; do"
  echo '    timeout 45 .gpu/m3sa_$v bench --filter "^prefill" --json $OUT/prefill-$v-$i.json > /dev/null 2>&1; echo "bench $v $i rc=$?" >> $OUT/run.txt'
  echo '  done'
  echo 'done'
  echo 'PYTHONPATH=.peer/vllm_shim timeout 140 python3 .peer/peer_bench.py --no-torch-timing --no-sanity --no-decode --no-attn --budget-s 90 --out $OUT/peer > $OUT/peer.log 2>&1; echo "peer rc=$?" >> $OUT/run.txt'
  echo 'fi'
  echo 'cd $OUT; tar czf logs.tgz $(ls *.log prefill-*.json 2>/dev/null); rm -f *.log prefill-*.json'
  echo 'cat run.txt'
} >patch_round.sh
chmod +x patch_round.sh
echo "built .gpu/patch_round.tar.xz (${names[*]}) and .gpu/patch_round.sh"
