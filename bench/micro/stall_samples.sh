#!/usr/bin/env bash
# Warp-stall samples per SASS instruction of one kernel launch within an m3sa bench case, on the
# device (ncu reads the counters on the Firecracker machines; --clock-control none, as METHOD.md
# asks). Writes $OUT/stalls.csv.xz (ncu's source page) and $OUT/details.txt, and prints
# stall_regions.py's summary. bench/NOTES.md s48 r2 / r4 read the prefill attend step this way:
#   bash bench/micro/stall_samples.sh .gpu/m3sa "attention prefill fp8 C=8K S=8K Hq=16" \
#     attend_block_members [launch-skip]
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,8p "$0"; exit 2; }
bin=$1 case=$2 kernel=$3 skip=${4:-0}
out="${OUT:-/tmp/stalls}"
mkdir -p "$out"
timeout 300 ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" \
  --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  --import-source no -o "$out/stalls" "$bin" bench --set full --filter "$case" > "$out/ncu_run.txt" 2>&1
ncu -i "$out/stalls.ncu-rep" --page source --print-source sass --csv > "$out/stalls.csv"
ncu -i "$out/stalls.ncu-rep" --page details --print-details all > "$out/details.txt"
python3 "$(dirname "${BASH_SOURCE[0]}")/stall_regions.py" "$out/stalls.csv"
xz -T8 -f "$out/stalls.csv"
rm -f "$out/stalls.ncu-rep"
