#!/usr/bin/env bash
# Builds .gpu/m3sa_stamps: the m3sa CLI with the TMA decode attention kernel compiled with
# M3SA_ATTENTION_DECODE_SM90_STAMPS=1 (kernels/sparse_attention_decode_sm90.cuh: clock64 at each
# phase of every CTA of the kernel's 20th launch, printed by its last CTA). Needs the default
# preset built (build/). Run on the device: .gpu/m3sa_stamps bench --filter "attention decode bf16
# B=32 S=32K Hq=16 Hkv=1" (bench/NOTES.md s10 r2 reads the printout).
exec "$(dirname "${BASH_SOURCE[0]}")/variant_m3sa.sh" stamps \
  "-DM3SA_ATTENTION_DECODE_SM90_STAMPS=1" src/cuda/sparse_attention_decode_sm90_bf16.cu
