#!/usr/bin/env bash
# Prepares a device round of HEAD as landed: the whole GPU suite in 4 shards, the demos, the four
# compute-sanitizer tools on `*Small*`, memcheck on the union-values overflow case, and the TMA
# decode attention's stamps at B=128 S=128K 64/4 (bench/micro/stamped_m3sa.sh). Builds HEAD in a
# kept clone (VARIANT_TREE, default /tmp/m3sa_vt; sm_90a only, ~5 min on 2 cores the first time)
# and packs .gpu/suite_round.tar.xz (head/: m3sa, m3sa_gpu_tests, libm3sa_c.so.0.1; stamps/:
# m3sa). On the device, in one call (T <= 560 s):
#   carry [".gpu/suite_round.tar.xz"], command `DEADLINE=<T - 40> bash bench/suite_round.sh 2>&1`
# Stages past the suite and the demos give way to DEADLINE (seconds).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/env.sh"
source "$root/bench/micro/kept_tree.sh"
tree="${VARIANT_TREE:-/tmp/m3sa_vt}"
checkout_kept_tree "$root" "$tree"
build_cli_and_gpu_tests "$tree" || exit 1
bash "$tree/bench/micro/stamped_m3sa.sh" > /dev/null # -> $tree/.gpu/m3sa_stamps
out="$root/.gpu/suite_round"
rm -rf "$out" && mkdir -p "$out/head" "$out/stamps"
cp "$tree/build/tools/m3sa_cli/m3sa" "$tree/build/tests/m3sa_gpu_tests" "$out/head/"
cp -L "$tree/build/src/libm3sa_c.so.0.1" "$out/head/"
cp "$tree/.gpu/m3sa_stamps" "$out/stamps/m3sa"
strip "$out"/*/*
tar -C "$root/.gpu" -cJf "$root/.gpu/suite_round.tar.xz" suite_round
rm -rf "$out"
echo "built .gpu/suite_round.tar.xz (HEAD $(git -C "$root" rev-parse --short HEAD)): run" \
  "\`DEADLINE=<T - 40> bash bench/suite_round.sh 2>&1\` with carry [\".gpu/suite_round.tar.xz\"]"
