#!/usr/bin/env bash
# Each kernel's duration over consecutive launches of an m3sa bench case, on the device (ncu,
# --clock-control none as METHOD.md asks): one line a launch, "name us". ncu runs each kernel
# alone, so a launch that would overlap its predecessor (programmatic dependent launch) reads as
# if it did not: a step slower under ncu is slower in itself, one slower only outside ncu is
# slower in how it meets its neighbours. s53 r3 read a 64/4 structured op's two passes this way:
#   bash bench/micro/kernel_durations.sh .gpu/m3sa "attention prefill bf16 structured C=8K \
#     S=128K Hq=64" "gather|rank_key|scatter_sel|attend|merge_token" 12 12
# (skip and count in launches of the matching kernels: 6 a prefill pass with the counting sort).
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,10p "$0"; exit 2; }
bin=$1 case=$2 kernels=$3 skip=${4:-0} count=${5:-6}
out="${OUT:-/tmp/kernel_durations}"
mkdir -p "$out"
timeout 300 ncu --clock-control none --kernel-name "regex:$kernels" --launch-skip "$skip" \
  --launch-count "$count" --metrics gpu__time_duration.sum \
  "$bin" bench --set full --filter "$case" > "$out/ncu.txt" 2>&1
grep -E "^  [A-Za-z_].*\(|gpu__time_duration" "$out/ncu.txt" |
  sed -E 's/\(Sparse.*//; s/\(Scatter.*//; s/^ *(void )?//; s/^gpu__time_duration.sum +[a-z]+ +//' |
  paste -d' ' - - | tee "$out/durations.txt"
