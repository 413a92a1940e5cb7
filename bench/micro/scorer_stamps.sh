#!/usr/bin/env bash
# Builds .gpu/m3sa_scorer_stamps: the m3sa CLI with the SM90 prefill scorer (bf16 and widened e4m3)
# compiled with M3SA_SCORER_STAMPS=1 (kernels/scorer_stamps.cuh: where each warpgroup's cycles go
# in every CTA of the kernel's 20th launch, printed by a kernel queued after it). Needs the default
# preset built (build/). Extra defines as the first argument, a name suffix as the second. Run on
# the device one case a process (the launch count is per process), e.g.
# .gpu/m3sa_scorer_stamps bench --filter "prefill bf16 C=8K S=8K H=4" (bench/NOTES.md s19 r1 / r2
# read the printout). The schedule kernel has its own switch: bench/micro/variant_m3sa.sh
# schedule_stamps "-DM3SA_SCHEDULE_STAMPS=1" src/cuda/schedule_tiles.cu (s19 r5 / r6).
exec "$(dirname "${BASH_SOURCE[0]}")/variant_m3sa.sh" "scorer_stamps${2:-}" \
  "-DM3SA_SCORER_STAMPS=1 ${1:-}" src/cuda/score_blocks_sm90_bf16.cu src/cuda/score_blocks_sm90_fp8.cu
