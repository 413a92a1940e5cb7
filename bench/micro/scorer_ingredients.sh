#!/usr/bin/env bash
# Session 21's first round, prepared (bench/NOTES.md s20 "Next round"): the SM90 scorer's stamps
# build as landed and with each M3SA_SCORER_SKIP bit (1 score stores, 2 maxima, 4 staging after a
# CTA's first unit, 8 block-table reads) and M3SA_SCORER_NO_PAGES, packed as .gpu/ingredients.tar.xz
# with .gpu/ingredients.sh, the script to run on the device (carry [".gpu"]): each build's stamps
# at C=8K S=8K H=4 and S=128K H=4, bf16 and fp8, printed to $OUT/ingredients.txt. Needs the default
# preset built (build/). Read the cycles a block and consumer against the landed build's: the
# ingredient whose removal shortens the consumer's step is what the ~1,150 cycles are.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/bench/micro"
builds=(scorer_stamps)
"$here/scorer_stamps.sh" >/dev/null
for bit in 1 2 4 8; do
  "$here/scorer_stamps.sh" "-DM3SA_SCORER_SKIP=$bit" "_skip$bit" >/dev/null
  builds+=("scorer_stamps_skip$bit")
done
"$here/scorer_stamps.sh" "-DM3SA_SCORER_NO_PAGES=1" _no_pages >/dev/null
builds+=(scorer_stamps_no_pages)
cd "$root/.gpu"
rm -f m3sa_gpu_tests_scorer_stamps*
strip "${builds[@]/#/m3sa_}"
tar cJf ingredients.tar.xz "${builds[@]/#/m3sa_}"
rm -f "${builds[@]/#/m3sa_}"
{
  echo '#!/usr/bin/env bash'
  echo 'tar xJf .gpu/ingredients.tar.xz -C .gpu'
  echo 'for b in '"${builds[*]}"'; do'
  echo '  for c in "prefill bf16 C=8K S=8K H=4" "prefill bf16 C=8K S=128K H=4" "prefill fp8 C=8K S=8K H=4"; do'
  echo '    echo "== $b $c" >> $OUT/ingredients.txt'
  echo '    timeout 60 .gpu/m3sa_$b bench --filter "$c" >> $OUT/ingredients.txt 2>&1'
  echo '  done'
  echo 'done'
} > ingredients.sh
chmod +x ingredients.sh
echo "built .gpu/ingredients.tar.xz (${builds[*]}) and .gpu/ingredients.sh"
