#!/usr/bin/env bash
# Builds the m3sa CLI and GPU test binary with a patch from bench/patches applied to some library
# sources: HEAD's src/ and include/ exported to a scratch tree, the patch applied there, the named
# sources compiled from it (bench/micro/variant_m3sa.sh, M3SA_VARIANT_SOURCE_ROOT) and linked as
# .gpu/m3sa_<name> and .gpu/m3sa_gpu_tests_<name>. The working tree is left alone. Name every
# source the patch changes and every source that includes a header it changes (a changed params
# struct must be compiled the same on both sides of a launch). The GPU tests are HEAD's: a patch
# that changes tests needs the working tree. M3SA_VARIANT_DEFINES (optional) holds extra defines
# for the named sources, as variant_m3sa.sh's second argument.
#   bench/micro/patch_variant.sh <name> <patch> <source.cu>...
# e.g. bench/micro/patch_variant.sh tma_queries bench/patches/s21-scorer-tma-queries.patch \
#        src/cuda/indexer.cu src/cuda/tensor_maps.cu src/cuda/score_blocks_sm90_bf16.cu \
#        src/cuda/score_blocks_sm90_fp8.cu src/cuda/score_blocks_sm90_fp8_qgmma.cu
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,13p "$0"; exit 2; }
name="$1" patch="$(realpath "$2")"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
git -C "$root" archive HEAD src include | tar -x -C "$tree"
git -C "$tree" init -q
git -C "$tree" apply --include='src/*' --include='include/*' "$patch"
M3SA_VARIANT_SOURCE_ROOT="$tree" "$root/bench/micro/variant_m3sa.sh" "$name" \
  "${M3SA_VARIANT_DEFINES:-}" "$@"
