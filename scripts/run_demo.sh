#!/usr/bin/env bash
# Builds the m3sa CLI and runs the MSA demo on the best available backend, with a bf16 and an fp8
# index cache. Extra arguments go to both demo runs (see `m3sa demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
source scripts/env.sh
cmake --preset default >/dev/null
cmake --build --preset default --target m3sa_cli -j "$M3SA_JOBS"
status=0
./build/tools/m3sa_cli/m3sa demo "$@" || status=1
echo
./build/tools/m3sa_cli/m3sa demo --index-dtype fp8 "$@" || status=1
exit $status
