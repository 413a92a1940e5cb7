#!/usr/bin/env bash
# Builds a standalone microbenchmark of bench/micro into <repo>/.gpu/<name>: page_stream (the
# default; no m3sa dependency), attend_rate (the library's attention device code, from src/),
# qgmma_error (e4m3 wgmma's error against exact index scores), wgmma_rate (the SM90 scorer's MMA
# step with and without its epilogue) or racecheck_mbarrier_probe (which orders racecheck follows).
# sm_90a only (H100/H200), static cudart and static libstdc++/libgcc so the binary built here runs
# on the device machine's image. Prints ptxas' per-kernel registers / shared memory / spills.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/.gpu"
mkdir -p "$out"
prog="${1:-page_stream}"
[ -f "$here/$prog.cu" ] || { echo "build.sh: no bench/micro/$prog.cu" >&2; exit 2; }
NVCC="${NVCC:-nvcc}"
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$NVCC")")")}"
"$NVCC" -std=c++20 -O3 -lineinfo \
  -gencode=arch=compute_90a,code=sm_90a \
  -Xptxas -v -Xcompiler -Wall,-Wextra -I"$root/src" \
  -c "$here/$prog.cu" -o "$out/$prog.o" 2> "$out/$prog.ptxas.txt" || {
  cat "$out/$prog.ptxas.txt"; exit 1; }
g++ -o "$out/$prog" "$out/$prog.o" \
  -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/targets/x86_64-linux/lib" \
  -lcudart_static -ldl -lpthread -lrt -static-libstdc++ -static-libgcc
# Short per-kernel summary (demangled names, registers, smem, spills)
python3 - "$out/$prog.ptxas.txt" <<'PY' || true
import re, subprocess, sys
txt = open(sys.argv[1]).read().splitlines()
name = None
for line in txt:
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        name = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout.strip()
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        spill = m.groups()
        continue
    m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line) or re.search(r"Used (\d+) registers", line)
    if m and name:
        smem = re.search(r"(\d+) bytes smem", line)
        print(f"{m.group(1):>4} regs  smem {smem.group(1) if smem else 0:>5} B  stack/spill {spill}  {name}")
        name = None
PY
echo "built $out/$prog"
