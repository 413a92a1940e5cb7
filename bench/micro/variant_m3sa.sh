#!/usr/bin/env bash
# Builds a diagnostic variant of the m3sa CLI and of the GPU test binary: the named library
# sources recompiled with extra defines (the M3SA_* diagnostic switches in the kernel and host
# files), swapped into a copy of libm3sa.a, and linked as .gpu/m3sa_<name> and
# .gpu/m3sa_gpu_tests_<name>. Needs the default preset built (build/). The test binary loads
# libm3sa_c.so.0.1 (the default build's: the C API's test runs those kernels) from beside it.
#   bench/micro/variant_m3sa.sh <name> "<defines>" <source.cu>...
# e.g. bench/micro/variant_m3sa.sh no_clusters "-DM3SA_ATTENTION_DECODE_MIN_CLUSTER=32" \
#        src/cuda/attention.cu
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,8p "$0"; exit 2; }
name="$1" defines="$2"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build"
# The sources and headers compiled (patch_variant.sh points this at a patched copy of the tree).
src_root="${M3SA_VARIANT_SOURCE_ROOT:-$root}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
NVCC="${NVCC:-nvcc}"
cp "$build/src/libm3sa.a" "$tmp/libm3sa_variant.a"
for source in "$@"; do
  object="$tmp/$(basename "$source").o" # the archive member's name, which `ar r` replaces
  # shellcheck disable=SC2086 # the defines are words
  "$NVCC" -DM3SA_HAVE_CUDA=1 $defines -I"$src_root/include" -I"$src_root/src" \
    -I"$build/generated" -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] \
    -Xcompiler=-fPIC -lineinfo -std=c++20 -x cu -c "$src_root/$source" -o "$object"
  (cd "$tmp" && ar r libm3sa_variant.a "$(basename "$object")")
done
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$NVCC")")")}"
libs=(-L"$CUDA_HOME/lib64" -L"$CUDA_HOME/targets/x86_64-linux/lib" -lcudart_static -lcudadevrt
  "$(g++ -print-file-name=libgomp.so)" -lrt -lpthread -ldl)
mkdir -p "$root/.gpu"
g++ -O3 -o "$root/.gpu/m3sa_$name" "$build"/tools/m3sa_cli/CMakeFiles/m3sa_cli.dir/*.o \
  "$build/src/libm3sa_testing.a" "$tmp/libm3sa_variant.a" "${libs[@]}"
g++ -O3 -o "$root/.gpu/m3sa_gpu_tests_$name" "$build"/tests/CMakeFiles/m3sa_gpu_tests.dir/*/*.o \
  "$build/src/libm3sa_testing.a" /usr/lib/x86_64-linux-gnu/libgtest_main.a "$tmp/libm3sa_variant.a" \
  /usr/lib/x86_64-linux-gnu/libgtest.a "$build/src/libm3sa_c.so" -Wl,-rpath,'$ORIGIN' "${libs[@]}"
echo "built $root/.gpu/m3sa_$name and $root/.gpu/m3sa_gpu_tests_$name"
