#!/usr/bin/env bash
# Builds .gpu/m3sa_stamps: the m3sa CLI with the TMA decode attention kernel compiled with
# M3SA_ATTENTION_DECODE_SM90_STAMPS=1 (kernels/sparse_attention_decode_sm90.cuh: clock64 at each
# phase of every CTA of the kernel's 20th launch, printed by its last CTA). Needs the default
# preset built (build/). Run on the device: .gpu/m3sa_stamps bench --filter "attention decode bf16
# B=32 S=32K Hq=16 Hkv=1" (bench/NOTES.md s10 r2 reads the printout).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
NVCC="${NVCC:-nvcc}"
"$NVCC" -DM3SA_HAVE_CUDA=1 -DM3SA_ATTENTION_DECODE_SM90_STAMPS=1 -I"$root/include" -I"$root/src" \
  -I"$build/generated" -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] \
  -Xcompiler=-fPIC -lineinfo -std=c++20 -x cu -c "$root/src/cuda/sparse_attention_decode_sm90_bf16.cu" \
  -o "$tmp/sparse_attention_decode_sm90_bf16.cu.o"
cp "$build/src/libm3sa.a" "$tmp/libm3sa_stamps.a"
(cd "$tmp" && ar r libm3sa_stamps.a sparse_attention_decode_sm90_bf16.cu.o)
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$NVCC")")")}"
mkdir -p "$root/.gpu"
g++ -O3 -o "$root/.gpu/m3sa_stamps" "$build"/tools/m3sa_cli/CMakeFiles/m3sa_cli.dir/*.o \
  "$build/src/libm3sa_testing.a" "$tmp/libm3sa_stamps.a" \
  -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/targets/x86_64-linux/lib" -lcudart_static -lcudadevrt \
  "$(g++ -print-file-name=libgomp.so)" -lrt -lpthread -ldl
echo "built $root/.gpu/m3sa_stamps"
